"""The `mink` CLI as a person runs it, against a running node."""

import json
import subprocess
import time

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from conftest import clean_env
from node_proc import NodeProcess, lose_object_store, wait_for


@pytest.fixture()
def cli(mink_node, bin_dir, tmp_path):
    node = NodeProcess(mink_node, tmp_path)

    def mink(*args, check=True):
        out = subprocess.run(
            [str(bin_dir / "mink"), "--addr", f"127.0.0.1:{node.flight_port}", *args],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert out.returncode == 0, out.stderr
        return out

    mink.addr = f"127.0.0.1:{node.flight_port}"
    mink.node = node
    yield mink, tmp_path
    node.kill()


def printed_offsets(text):
    """`mink offsets` output as {bucket: (earliest, latest)}, checking its header."""
    header, *rows = text.splitlines()
    assert header.split() == ["bucket", "earliest", "latest"], text
    return {int(b): (int(e), int(l)) for b, e, l in (row.split() for row in rows)}


def listed_offsets(mink, table, partition=None):
    """The node's own answer, through pyarrow: {bucket: (earliest, latest)}."""
    client = flight.connect(f"grpc://{mink.addr}")
    try:
        def offsets(spec):
            body = {"path": table, "spec": spec, "partition": partition}
            [r] = client.do_action(flight.Action("list_offsets", json.dumps(body).encode()))
            return {o["bucket"]["bucket"]: o["offset"] for o in json.loads(r.body.to_pybytes())}
        earliest, latest = offsets("earliest"), offsets("latest")
        return {b: (earliest[b], latest[b]) for b in earliest}
    finally:
        client.close()


def test_create_write_scan_lookup_describe(cli):
    mink, tmp = cli
    mink("db", "create", "demo")
    mink("table", "create", "demo.users", "--column", "id:BIGINT", "--column", "name:STRING",
         "--column", "score:BIGINT", "--primary-key", "id", "--buckets", "2")
    (tmp / "users.csv").write_text("id,name,score\n1,ann,10\n2,bob,20\n3,cy,30\n")
    out = mink("write", "demo.users", "--file", "users.csv")
    assert "wrote 3 rows to demo.users" in out.stdout
    # Parquet, through the client-side routing path, updating one row.
    pq.write_table(pa.table({"id": pa.array([3, 4], pa.int64()), "name": ["cyd", "dee"], "score": pa.array([31, 40], pa.int64())}),
                   tmp / "more.parquet")
    out = mink("write", "demo.users", "--file", "more.parquet", "--client-routing")
    assert "wrote 2 rows" in out.stdout

    rows = [json.loads(line) for line in mink("scan", "demo.users", "--format", "json").stdout.splitlines()]
    # The changelog: 4 inserts, then -U/+U for id 3.
    assert sorted(r["id"] for r in rows) == [1, 2, 3, 3, 3, 4]
    looked = mink("lookup", "demo.users", "id=3").stdout
    assert "cyd" in looked and "31" in looked
    described = mink("table", "describe", "demo.users").stdout
    assert "primary key" in described and "buckets: 2" in described
    assert "demo.users" in mink("table", "list", "demo").stdout
    # Six changelog rows (4 inserts, -U/+U of id 3) over two buckets, from offset 0.
    offsets = printed_offsets(mink("offsets", "demo.users").stdout)
    assert sorted(offsets) == [0, 1]
    assert all(earliest == 0 for earliest, _ in offsets.values())
    assert sum(latest for _, latest in offsets.values()) == 6
    assert offsets == listed_offsets(mink, "demo.users")

    health = json.loads(mink("cluster", "health").stdout)
    assert (health["status"], health["problem"]) == ("serving", None)
    lose_object_store(tmp / "mink-data" / "objects")
    health = wait_for(lambda: (h := json.loads(mink("cluster", "health").stdout))["status"] != "serving" and h,
                      what="mink cluster health reports the lost store")
    assert health["status"] == "unavailable" and "object store refused the last heartbeat" in health["problem"]


def test_tail_and_offsets_of_a_partitioned_table(cli, bin_dir):
    mink, tmp = cli
    mink("db", "create", "demo")
    mink("table", "create", "demo.daily", "--column", "day:STRING:not-null", "--column", "id:BIGINT:not-null",
         "--column", "msg:STRING", "--partition-key", "day", "--bucket-key", "id", "--buckets", "2")
    (tmp / "old.csv").write_text("day,id,msg\n2026-11-29,1,old-one\n2026-11-29,2,old-two\n")
    mink("write", "demo.daily", "--file", "old.csv")
    offsets = printed_offsets(mink("offsets", "demo.daily", "--partition", "2026-11-29").stdout)
    assert sorted(offsets) == [0, 1] and all(e == 0 for e, _ in offsets.values())
    assert sum(latest for _, latest in offsets.values()) == 2, "two rows in the partition"
    assert offsets == listed_offsets(mink, "demo.daily", "2026-11-29")
    assert "name the partition" in mink("offsets", "demo.daily", check=False).stderr

    with open(tmp / "tail.out", "w") as sink:
        tail = subprocess.Popen(
            [str(bin_dir / "mink"), "--addr", mink.addr, "tail", "demo.daily"],
            cwd=tmp, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT, text=True,
        )
        try:
            time.sleep(1.5)
            (tmp / "new.csv").write_text("day,id,msg\n2026-11-29,3,new-three\n2026-11-29,4,new-four\n")
            mink("write", "demo.daily", "--file", "new.csv")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "new-four" not in (tmp / "tail.out").read_text():
                time.sleep(0.1)
            # A partition created while the tail runs is followed too.
            (tmp / "next.csv").write_text("day,id,msg\n2026-11-30,5,next-day\n")
            mink("write", "demo.daily", "--file", "next.csv")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "next-day" not in (tmp / "tail.out").read_text():
                time.sleep(0.1)
        finally:
            tail.terminate()
            tail.wait(timeout=10)
    seen = (tmp / "tail.out").read_text()
    assert "new-three" in seen and "new-four" in seen and "next-day" in seen, seen
    assert "old-one" not in seen, "a tail starts at the latest offsets"


def test_errors_are_one_line_and_a_nonzero_exit(cli):
    mink, tmp = cli
    mink("db", "create", "demo")
    mink("table", "create", "demo.events", "--column", "id:BIGINT:not-null", "--column", "msg:STRING")
    missing = mink("scan", "demo.nope", check=False)
    assert missing.returncode != 0
    assert missing.stderr.strip() == "mink: not found: table demo.nope"
    (tmp / "bad.csv").write_text("id,msg\nnot-a-number,x\n")
    bad = mink("write", "demo.events", "--file", "bad.csv", check=False)
    assert bad.returncode != 0
    assert bad.stderr.startswith("mink: bad.csv: not a valid Csv file") and bad.stderr.count("\n") == 1
    assert "(no rows)" in mink("scan", "demo.events").stdout, "nothing was written"
    typo = mink("table", "create", "demo.x", "--column", "id:INTEGERR", check=False)
    assert typo.returncode != 0 and "unknown type" in typo.stderr


def test_kafka_groups_and_lag_as_kafka_consumer_groups_shows_them(cli):
    """`mink kafka groups` and `mink kafka lag GROUP` against a group that consumed
    part of a topic (confluent-kafka), and the same lag as a Prometheus gauge."""
    import urllib.request

    from confluent_kafka import Consumer, Producer, TopicPartition

    mink, _ = cli
    node = mink.node
    p = Producer({"bootstrap.servers": node.bootstrap})
    for i in range(10):
        p.produce("clicks.v1", value=b"%d" % i, partition=0)
    p.flush(30)
    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "reporting", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe(["clicks.v1"])
    got = 0
    deadline = time.monotonic() + 60
    while got < 4 and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and m.error() is None:
            got += 1
    assert got == 4
    c.commit(offsets=[TopicPartition("clicks.v1", 0, 4)], asynchronous=False)

    groups = [json.loads(line) for line in mink("kafka", "groups", "--format", "json").stdout.splitlines()]
    assert groups == [{"group": "reporting", "state": "Stable", "members": 1, "partitions": 1, "lag": 6}]
    table = mink("kafka", "lag", "reporting").stdout
    header = next(line for line in table.splitlines() if "topic" in line)
    assert [h.strip() for h in header.strip("|").split("|")] == [
        "topic", "partition", "current_offset", "log_end_offset", "lag", "consumer_id", "client_id", "host"]
    row = next(line for line in table.splitlines() if "clicks.v1" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:5] == ["clicks.v1", "0", "4", "10", "6"], table
    assert cells[5] != "-", "the partition's member is shown"

    with urllib.request.urlopen(f"http://127.0.0.1:{node.admin_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'mink_kafka_consumer_lag{group="reporting",topic="clicks.v1",partition="0"} 6' in text
    c.close()
    # Gone with the group: the lag of a deleted group is not reported.
    unknown = mink("kafka", "lag", "nobody", check=False)
    assert unknown.returncode != 0 and "does not exist" in unknown.stderr
