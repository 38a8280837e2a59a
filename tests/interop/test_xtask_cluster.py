"""`cargo xtask cluster up/status/down`, driven as a person would, with the `mink` CLI."""

import json
import os
import pathlib
import re
import signal
import subprocess
import time

from conftest import clean_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(*args, check=True):
    out = subprocess.run(list(args), cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_a_three_node_cluster_up_write_scan_down(tmp_path, bin_dir):
    cluster = tmp_path / "cluster"
    up = run("cargo", "xtask", "cluster", "up", "--nodes", "3", "--dir", str(cluster))
    try:
        assert len(re.findall(r"^n\d .* serving$", up.stdout, re.M)) == 3, up.stdout
        assert re.search(r"^sql .* serving$", up.stdout, re.M), up.stdout
        state = json.loads((cluster / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]] + [state["query"]["pid"]]
        mink = [str(bin_dir / "mink"), "--addr", state["nodes"][2]["flight"]]
        run(*mink, "db", "create", "demo")
        run(*mink, "table", "create", "demo.events", "--column", "id:BIGINT:not-null",
            "--column", "msg:STRING", "--bucket-key", "id", "--buckets", "6")
        csv = tmp_path / "e.csv"
        csv.write_text("id,msg\n" + "".join(f"{i},m{i}\n" for i in range(50)))
        assert "wrote 50 rows" in run(*mink, "write", "demo.events", "--file", str(csv)).stdout
        rows = [json.loads(l) for l in run(*mink, "scan", "demo.events", "--format", "json").stdout.splitlines()]
        assert sorted(r["id"] for r in rows) == list(range(50))
        # The cluster's mink-query answers SQL over the same rows.
        import adbc_driver_flightsql.dbapi as flightsql

        with flightsql.connect(f"grpc://{state['query']['addr']}", autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*), sum(id) FROM demo.events")
            assert cur.fetchone() == (50, sum(range(50)))
        env = run("cargo", "xtask", "cluster", "env", "--dir", str(cluster)).stdout
        assert f"export MINK_SQL=grpc://{state['query']['addr']}" in env, env
        # The first node's Iceberg REST catalog, exported and answering.
        assert f"export ICEBERG_REST=http://{state['nodes'][0]['iceberg_rest']}" in env, env
        import urllib.request

        with urllib.request.urlopen(f"http://{state['nodes'][0]['iceberg_rest']}/v1/namespaces", timeout=10) as r:
            assert ["demo"] in json.loads(r.read())["namespaces"]
        described = json.loads(run(*mink, "cluster", "describe").stdout)
        assert sorted(described["nodes"]) == ["n0", "n1", "n2"]
        status = run("cargo", "xtask", "cluster", "status", "--dir", str(cluster)).stdout
        assert len(re.findall(r"^n\d .* serving$", status, re.M)) == 3, status
        # A node that is gone is reported as such, not as serving.
        os.kill(state["nodes"][0]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            status = run("cargo", "xtask", "cluster", "status", "--dir", str(cluster)).stdout
            if re.search(r"^n0 .* stopped$", status, re.M) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert re.search(r"^n0 .* stopped$", status, re.M), status
        assert len(re.findall(r"^n\d .* serving$", status, re.M)) == 2, status
    finally:
        down = run("cargo", "xtask", "cluster", "down", "--dir", str(cluster), check=False)
    assert down.returncode == 0, down.stderr
    assert not (cluster / "cluster.json").exists()
    assert all(not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2] for pid in pids)
