"""docs/quickstart.md, run block by block as a person would paste it (debug builds)."""

import os
import pathlib
import re
import subprocess
import sys

from conftest import clean_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_quickstart_runs(tmp_path, bin_dir):
    text = (ROOT / "docs" / "quickstart.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    script = "\n".join(blocks)
    # The same session with debug builds (already built by `cargo xtask test`), in a
    # cluster directory of its own.
    script = script.replace("cargo build --release --bins", "true")
    script = script.replace("--release", "").replace("target/release", "target/debug")
    cluster = tmp_path / "cluster"
    script = re.sub(r'cargo xtask cluster (up|env|down|status)([^\n)"]*)',
                    lambda m: f" (cd {ROOT} && cargo --quiet xtask cluster {m.group(1)}{m.group(2)} --dir {cluster})",
                    script)
    # python3 is the interop venv's (it has confluent-kafka), as after `pip install`.
    venv_bin = pathlib.Path(sys.executable).parent
    script = "set -euo pipefail\n" + script.replace(
        'export PATH="$PWD/target/debug:$PATH"', f'export PATH="{bin_dir}:{venv_bin}:$PATH"'
    )
    # The client from this checkout, as `pip install ./clients/python` would give it
    # (the wheel itself is installed into a fresh venv by test_python_client.py).
    script = script.replace(
        "python3 -m pip install --quiet ./clients/python", f"export PYTHONPATH={ROOT / 'clients' / 'python' / 'src'}"
    )
    try:
        out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=clean_env(), capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "wrote 3 rows to demo.events" in out.stdout
        assert all(word in out.stdout for word in ["hello", "from", "mink"])
        tail = (tmp_path / "tail.log").read_text()
        assert "hello" in tail and "mink" in tail, tail
        assert "anne" in out.stdout, "the lookup sees the latest row of key 1"
        assert "consumed hello from kafka" in out.stdout
        assert "sql says from mink" in out.stdout
        assert "sql counts 3 clicks" in out.stdout
        assert "sql looks up anne" in out.stdout
        assert "python looks up ann with 12 points" in out.stdout
        assert "python reads hello from mink" in out.stdout
        assert "python tails 3 rows" in out.stdout
        assert "python asks sql: 19" in out.stdout
    finally:
        subprocess.run(["cargo", "xtask", "cluster", "down", "--dir", str(cluster)], cwd=ROOT,
                       env=clean_env(), capture_output=True, timeout=120)
