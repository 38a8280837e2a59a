"""mink-node as an operator runs it: configuration sources, errors, start and stop."""

import signal
import subprocess
import time
import tomllib

from conftest import clean_env


def run(binary, *args, cwd, env=None, timeout=30):
    return subprocess.run(
        [str(binary), *args],
        cwd=cwd,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_print_config_shows_the_documented_defaults(mink_node, tmp_path):
    out = run(mink_node, "--print-config", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    config = tomllib.loads(out.stdout)
    assert config["node_id"] == "node-1"
    assert config["listeners"] == {
        "flight": "127.0.0.1:9120",
        "kafka": "127.0.0.1:9092",
        "admin": "127.0.0.1:9121",
        "iceberg_rest": "127.0.0.1:9181",
    }
    assert config["iceberg_rest"] == {"enabled": True, "vend_credentials": False}
    assert config["object_store"]["url"] == f"file://{tmp_path}/mink-data/objects"
    assert config["kafka"]["max_request_bytes"] == 100 * 1024 * 1024
    assert config["kafka"]["max_fetch_bytes"] == 50 * 1024 * 1024
    assert config["kafka"]["group_offsets_ttl_ms"] == 7 * 24 * 3600 * 1000
    assert config["kv"]["backend"] == "fjall"


def test_file_then_environment_override(mink_node, tmp_path):
    (tmp_path / "mink.toml").write_text('node_id = "from-file"\n[wal]\nlinger_ms = 2\n')
    out = run(mink_node, "--print-config", cwd=tmp_path, env={"MINK_WAL__LINGER_MS": "7"})
    assert out.returncode == 0, out.stderr
    config = tomllib.loads(out.stdout)
    assert config["node_id"] == "from-file"
    assert config["wal"]["linger_ms"] == 7


def test_unknown_key_and_bad_value_name_the_key(mink_node, tmp_path):
    (tmp_path / "bad.toml").write_text("[meta]\nlease_timeout = 5\n")
    out = run(mink_node, "--config", "bad.toml", cwd=tmp_path)
    assert out.returncode == 2
    assert "meta.lease_timeout" in out.stderr
    out = run(mink_node, "--print-config", cwd=tmp_path, env={"MINK_KV__BACKEND": "rocksdb"})
    assert out.returncode == 2
    assert "BACKEND" in out.stderr.upper() and "rocksdb" in out.stderr


def wait_for_line(proc, needle, timeout=30):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} not seen; stderr so far:\n{''.join(seen)}")


def start(binary, cwd, env=None):
    return subprocess.Popen(
        [str(binary)],
        cwd=cwd,
        env=clean_env({"RUST_LOG": "info", **(env or {})}),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )


def test_node_starts_on_a_local_directory_and_stops_on_sigterm(mink_node, tmp_path):
    proc = start(
        mink_node,
        tmp_path,
        {"MINK_LISTENERS__FLIGHT": "127.0.0.1:0", "MINK_LISTENERS__ADMIN": "127.0.0.1:0", "MINK_LISTENERS__KAFKA": "127.0.0.1:0", "MINK_LISTENERS__ICEBERG_REST": "127.0.0.1:0"},
    )
    try:
        lines = wait_for_line(proc, "Kafka listening on")
        lines += wait_for_line(proc, "node started")
        assert (tmp_path / "mink-data" / "objects").is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()


def test_node_starts_on_s3(mink_node, tmp_path, s3_url):
    proc = start(
        mink_node,
        tmp_path,
        dict(s3_url, MINK_LISTENERS__FLIGHT="127.0.0.1:0", MINK_LISTENERS__ADMIN="127.0.0.1:0", MINK_LISTENERS__KAFKA="127.0.0.1:0", MINK_LISTENERS__ICEBERG_REST="127.0.0.1:0"),
    )
    try:
        wait_for_line(proc, "node started")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()


def test_node_refuses_an_unreachable_bucket(mink_node, tmp_path, s3_url):
    env = dict(s3_url, MINK_OBJECT_STORE__URL="s3://no-such-bucket/x")
    proc = start(mink_node, tmp_path, env)
    try:
        assert proc.wait(timeout=60) == 1
        assert "is not usable" in proc.stderr.read()
    finally:
        proc.kill()


def test_the_secret_key_is_redacted_wherever_the_config_is_shown(mink_node, tmp_path):
    """--print-config, the get_config action and the node's log show "<redacted>" for
    the secret key; the access key id is not a secret and is shown."""
    import json
    import uuid

    import pyarrow.flight as flight

    from node_proc import NodeProcess

    secret = f"s3cr3t-{uuid.uuid4().hex}"
    keys = {"MINK_OBJECT_STORE__ACCESS_KEY_ID": "AKIDSHOWN", "MINK_OBJECT_STORE__SECRET_ACCESS_KEY": secret}
    out = run(mink_node, "--print-config", cwd=tmp_path, env=keys)
    assert out.returncode == 0, out.stderr
    assert secret not in out.stdout + out.stderr
    printed = tomllib.loads(out.stdout)["object_store"]
    assert printed["secret_access_key"] == "<redacted>"
    assert printed["access_key_id"] == "AKIDSHOWN"

    # The keys apply to s3:// only; on the default file:// store the node starts.
    node = NodeProcess(mink_node, tmp_path, dict(keys, RUST_LOG="debug"))
    try:
        client = flight.connect(node.location)
        [result] = client.do_action(flight.Action("get_config", b"{}"))
        body = result.body.to_pybytes().decode()
        assert secret not in body
        served = json.loads(body)["object_store"]
        assert served["secret_access_key"] == "<redacted>"
        assert served["access_key_id"] == "AKIDSHOWN"
        client.close()
    finally:
        node.kill()
    assert secret not in "".join(node.lines)

    # Without a secret there is nothing to redact: null, not the placeholder.
    out = run(mink_node, "--print-config", cwd=tmp_path)
    assert "secret_access_key" not in tomllib.loads(out.stdout)["object_store"]
