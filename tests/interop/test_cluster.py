"""Three nodes sharing one object store: routing, forwarding, redirects and
read-your-writes across nodes, with pyarrow.flight as the client."""

import json
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from node_proc import NodeProcess, retry
from test_flight import (
    EVENTS,
    SCHEMA,
    USER_SCHEMA,
    USERS,
    action,
    append_table,
    lookup,
    prefix_lookup,
    put_table,
    read_flight,
)


@pytest.fixture()
def cluster(mink_node, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    nodes = []
    try:
        for i in range(3):
            nodes.append(
                NodeProcess(
                    mink_node,
                    tmp_path,
                    {
                        "MINK_NODE_ID": f"n{i}",
                        "MINK_DATA_DIR": str(tmp_path / f"n{i}"),
                        "MINK_OBJECT_STORE__URL": f"file://{shared}",
                    },
                )
            )
        clients = [flight.connect(n.location) for n in nodes]
        yield nodes, clients
        for c in clients:
            c.close()
    finally:
        for n in nodes:
            n.kill()


def wait_until(probe, timeout=15):
    """Polls `probe` until it returns something, for cluster state that settles."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.1)
    return None


# Errors a node raises before its log takes a write (it leads no such bucket, the
# bucket has no leader yet, the leader it forwards to refuses the connection): the row
# was not written, so writing it again cannot duplicate it.
NOT_WRITTEN = ("not the leader", "no leader yet", "cannot connect to", "Connection refused")


def retry_unwritten(write, timeout=30):
    """Runs a non-idempotent write, again only after errors that mean it was not
    written; any other error (its outcome unknown) fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return write()
        except pa.ArrowException as e:
            # A storage failure may wrap a "not the leader" and still mean the outcome
            # is unknown (some part may have landed): never retried.
            text = str(e)
            unwritten = "storage failure: " not in text and any(m in text for m in NOT_WRITTEN)
            if time.monotonic() > deadline or not unwritten:
                raise
            time.sleep(0.2)


def scan_bucket(location, bucket):
    client = flight.connect(f"grpc://{location}")
    ticket = flight.Ticket(json.dumps({"Scan": {"bucket": bucket, "offset": 0}}).encode())
    rows = client.do_get(ticket).read_all().to_pylist()
    client.close()
    return rows


def test_writes_are_routed_and_forwarded_across_three_nodes(cluster):
    nodes, clients = cluster
    first = clients[0]
    action(first, "create_database", {"name": "db"})
    created = action(first, "create_table", {"path": "db.events", "descriptor": dict(EVENTS, bucket_count=6)})

    # Read-your-writes on another node through mink-min-applied-index.
    options = flight.FlightCallOptions(headers=[(b"mink-min-applied-index", str(created["index"]).encode())])
    [result] = clients[2].do_action(flight.Action("list_tables", json.dumps({"database": "db"}).encode()), options)
    assert json.loads(result.body.to_pybytes()) == ["events"]

    def spread():
        meta = action(first, "metadata", {"path": "db.events"})
        leaders = {b["leader"] for b in meta["buckets"]}
        return meta if None not in leaders and len(leaders) == 3 else None

    meta = wait_until(spread)
    assert meta is not None, "the six buckets are spread over the three nodes"
    # rebalance is forwarded to the lease holder, so every node answers it (with
    # nothing to move: two buckets each).
    for client in clients:
        assert action(client, "rebalance") == {"moved": 0}

    batch = pa.record_batch([pa.array(range(60), pa.int64()), pa.array([f"m{i}" for i in range(60)])], schema=SCHEMA)
    routed = retry(lambda: append_table(clients[1], "db.events", batch))
    assert len(routed["Routed"]["buckets"]) == 6
    rows = []
    for b in meta["buckets"]:
        rows.extend(scan_bucket(b["leader_address"], b["bucket"]))
    assert sorted(r["id"] for r in rows) == list(range(60))

    # The standard Flight way: GetFlightInfo at any node; each endpoint names its
    # bucket's leader, where its ticket reads the bucket.
    info, flight_rows = read_flight(clients[2], "db.events")
    assert len(info.endpoints) == 6
    leaders = {json.dumps(b["bucket"], sort_keys=True): b["leader_address"] for b in meta["buckets"]}
    for endpoint in info.endpoints:
        bucket = json.loads(endpoint.ticket.ticket)["Scan"]["bucket"]
        assert [loc.uri.decode() for loc in endpoint.locations] == [f"grpc://{leaders[json.dumps(bucket, sort_keys=True)]}"]
    assert sorted(r["id"] for r in flight_rows) == list(range(60))

    # A bucket read at a node that does not lead it: NotLeader with the leader's address.
    b = meta["buckets"][0]
    other = next(n for n in nodes if f"127.0.0.1:{n.flight_port}" != b["leader_address"])
    with pytest.raises(pa.ArrowException, match="not the leader") as err:
        scan_bucket(f"127.0.0.1:{other.flight_port}", b["bucket"])
    assert b["leader_address"] in str(err.value)

    # Any node answers list_offsets for the whole table, asking the other leaders.
    for client in clients:
        latest = action(client, "list_offsets", {"path": "db.events", "spec": "latest"})
        assert len(latest) == 6 and sum(o["offset"] for o in latest) == 60

    # Any node answers a lookup whose keys fall in buckets led anywhere.
    action(first, "create_table", {"path": "db.users", "descriptor": dict(USERS, bucket_count=6)})
    users = pa.record_batch(
        [pa.array(range(30), pa.int64()), pa.array([f"u{i}" for i in range(30)]), pa.array(range(30), pa.int64())],
        schema=USER_SCHEMA,
    )
    retry(lambda: put_table(clients[2], users))
    for client in clients:
        found = lookup(client, list(range(35)))
        assert found == {i: (f"u{i}", i) for i in range(30)}

    # And a prefix lookup, whichever node leads the key's bucket.
    orders = {
        "schema": {"columns": [{"name": "user", "type": "STRING", "nullable": False},
                               {"name": "order", "type": "BIGINT", "nullable": False}]},
        "primary_key": ["user", "order"], "bucket_keys": ["user"], "bucket_count": 6,
    }
    action(first, "create_table", {"path": "db.orders", "descriptor": orders})
    schema = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("order", pa.int64(), nullable=False)])
    users_of = [f"user{i}" for i in range(12)]
    placed = pa.record_batch([pa.array(users_of * 2), pa.array(range(24), pa.int64())], schema=schema)
    retry(lambda: put_table(clients[1], placed, path="db.orders"))
    for client in clients:
        for u in users_of:
            rows = prefix_lookup(client, "db.orders", [u])
            assert [r["user"] for r in rows] == [u, u]


def test_a_killed_lease_holder_is_replaced_and_its_buckets_move(cluster):
    """Three processes on one file:// store: SIGKILL the lease holder; a survivor takes
    the lease with a higher term, the dead node's buckets move with higher epochs, and
    every acknowledged row is still there."""
    nodes, clients = cluster
    first = clients[0]
    action(first, "create_database", {"name": "db"})
    action(first, "create_table", {"path": "db.events", "descriptor": dict(EVENTS, bucket_count=6)})

    def spread():
        meta = action(first, "metadata", {"path": "db.events"})
        leaders = {b["leader"] for b in meta["buckets"]}
        return meta if None not in leaders and len(leaders) == 3 else None

    before = wait_until(spread)
    assert before is not None
    batch = pa.record_batch([pa.array(range(60), pa.int64()), pa.array([f"m{i}" for i in range(60)])], schema=SCHEMA)
    retry(lambda: append_table(clients[1], "db.events", batch))

    lease = action(first, "describe_cluster")["lease"]
    victim = int(lease["holder"][1:])
    nodes[victim].kill()
    survivor = clients[(victim + 1) % 3]
    dead = lease["holder"]
    epochs = {json.dumps(b["bucket"], sort_keys=True): b["epoch"] for b in before["buckets"]}
    moved = [json.dumps(b["bucket"], sort_keys=True) for b in before["buckets"] if b["leader"] == dead]
    assert moved, "the lease holder led some of the six buckets"

    def taken_over():
        try:
            new = action(survivor, "describe_cluster")["lease"]
            meta = action(survivor, "metadata", {"path": "db.events"})
        except Exception:  # noqa: BLE001 - the survivor may be busy re-reading the log
            return None
        if new["holder"] in (None, dead) or new["term"] <= lease["term"]:
            return None
        if any(b["leader"] in (None, dead) for b in meta["buckets"]):
            return None
        return new, meta

    found = wait_until(taken_over, timeout=40)
    assert found is not None, "a survivor took the lease and moved the dead node's buckets"
    _, after = found
    for b in after["buckets"]:
        key = json.dumps(b["bucket"], sort_keys=True)
        if key in moved:
            assert b["epoch"] > epochs[key], "a moved bucket's epoch only grows"

    def all_rows():
        rows = []
        for b in after["buckets"]:
            rows.extend(scan_bucket(b["leader_address"], b["bucket"]))
        return rows

    deadline = time.monotonic() + 30
    while True:
        try:
            rows = all_rows()
            break
        except Exception:  # noqa: BLE001 - a moved bucket may still be opening
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert sorted(r["id"] for r in rows) == list(range(60)), "every acknowledged row, once"

    # The cluster takes writes again. AppendTable has no writer id, so a retry of a
    # row that was written writes it twice, and a failed call of several buckets may
    # have written some of them: each call carries one row (one bucket) and is retried
    # only on errors that mean it was not written. The exact comparison fails on a
    # duplicate.
    for i in range(60, 90):
        row = pa.record_batch([pa.array([i], pa.int64()), pa.array(["n"])], schema=SCHEMA)
        retry_unwritten(lambda: append_table(survivor, "db.events", row))
    assert sorted(r["id"] for r in all_rows()) == list(range(90)), "every row exactly once"
