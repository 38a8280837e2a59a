"""A node over Arrow Flight, driven by pyarrow.flight (a client we did not write)."""

import json
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from node_proc import NodeProcess, lose_object_store, retry, wait_for


def action(client, name, body=None):
    results = list(client.do_action(flight.Action(name, json.dumps(body or {}).encode())))
    assert len(results) == 1
    return json.loads(results[0].body.to_pybytes())


@pytest.fixture()
def node(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path)
    client = flight.connect(proc.location)
    yield proc, client
    client.close()
    proc.kill()


EVENTS = {
    "schema": {
        "columns": [
            {"name": "id", "type": "BIGINT", "nullable": False},
            {"name": "msg", "type": "STRING"},
        ]
    },
    "bucket_keys": ["id"],
    "bucket_count": 3,
}

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())])


def append_table(client, path, batch, schema_id=1, sequence=None):
    descriptor = flight.FlightDescriptor.for_command(
        json.dumps({"AppendTable": {"path": path, "schema_id": schema_id}})
    )
    writer, reader = client.do_put(descriptor, batch.schema)
    meta = {} if sequence is None else {"batch_sequence": sequence}
    writer.write_with_metadata(batch, pa.py_buffer(json.dumps(meta).encode()))
    writer.done_writing()
    answer = reader.read()
    # Without an answer the server ended the stream with an error: close raises it.
    writer.close()
    assert answer is not None, "no answer and no error"
    return json.loads(answer.to_pybytes())


def scan_all(client, path):
    meta = action(client, "metadata", {"path": path})
    rows = []
    for b in meta["buckets"]:
        ticket = flight.Ticket(json.dumps({"Scan": {"bucket": b["bucket"], "offset": 0}}).encode())
        reader = client.do_get(ticket)
        for chunk in reader:
            scan = json.loads(chunk.app_metadata.to_pybytes())
            assert scan["bucket"] == b["bucket"]
            rows.extend(chunk.data.to_pylist())
    return rows


def test_catalog_write_scan_and_discovery(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    assert action(client, "list_databases") == ["db"]
    created = action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
    assert created["table_id"] >= 1
    assert action(client, "list_tables", {"database": "db"}) == ["events"]
    assert action(client, "table_exists", {"path": "db.events"}) == {"exists": True}

    batch = pa.record_batch(
        [pa.array(range(100), pa.int64()), pa.array([f"m{i}" for i in range(100)])], schema=SCHEMA
    )
    routed = retry(lambda: append_table(client, "db.events", batch))
    buckets = routed["Routed"]["buckets"]
    assert sum(b["last_offset"] - b["first_offset"] + 1 for b in buckets) == 100
    assert len(buckets) == 3, "100 keys hash to every one of 3 buckets"

    rows = scan_all(client, "db.events")
    assert sorted(r["id"] for r in rows) == list(range(100))
    assert {r["msg"] for r in rows} == {f"m{i}" for i in range(100)}

    flights = list(client.list_flights())
    assert [f.descriptor.path[0].decode() for f in flights] == ["db.events"]
    schema = client.get_schema(flight.FlightDescriptor.for_path("db.events")).schema
    assert schema.names == ["id", "msg"]
    names = {a.type for a in client.list_actions()}
    assert {"create_table", "metadata", "lookup", "health"} <= names
    health = action(client, "health")
    assert (health["status"], health["problem"]) == ("serving", None)

    # And a node that lost its object store says so.
    lose_object_store(node[0].workdir / "mink-data" / "objects")
    health = wait_for(lambda: (h := action(client, "health"))["status"] != "serving" and h, what="health reports the loss")
    assert health["status"] == "unavailable"
    assert "object store refused the last heartbeat" in health["problem"]


def test_reads_answer_only_the_columns_their_ticket_names(node):
    """A ticket's `columns` (pyarrow.flight, raw JSON): a Scan, a range Scan, a
    LimitScan and a Snapshot answer those columns in that order; an empty list answers
    the rows without columns; an unknown or repeated name is InvalidArgument, naming
    it."""
    proc, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
    ids = list(range(30))
    batch = pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"m{i}" for i in ids])], schema=SCHEMA)
    retry(lambda: append_table(client, "db.events", batch))
    buckets = [b["bucket"] for b in action(client, "metadata", {"path": "db.events"})["buckets"]]

    def read(kind, bucket, **fields):
        reader = client.do_get(flight.Ticket(json.dumps({kind: {"bucket": bucket, **fields}}).encode()))
        return reader.read_all()

    seen, counted = [], 0
    for b in buckets:
        whole = read("Scan", b, offset=0)
        only = read("Scan", b, offset=0, columns=["msg"])
        assert only.schema.names == ["msg"]
        assert only.column("msg").to_pylist() == whole.column("msg").to_pylist()
        flipped = read("Scan", b, offset=0, end_offset=whole.num_rows, columns=["msg", "id"])
        assert flipped.schema.names == ["msg", "id"]
        assert flipped.column("id").to_pylist() == whole.column("id").to_pylist()
        none = read("Scan", b, offset=0, end_offset=whole.num_rows, columns=[])
        assert none.num_columns == 0
        counted += none.num_rows
        seen += whole.column("id").to_pylist()
        limited = read("LimitScan", b, limit=2, columns=["id"])
        assert limited.schema.names == ["id"] and limited.num_rows == min(2, whole.num_rows)
    assert sorted(seen) == ids and counted == len(ids)
    for columns, words in [(["nope"], "nope"), (["id", "id"], "twice")]:
        with pytest.raises(pa.ArrowInvalid, match=words):
            read("Scan", buckets[0], offset=0, columns=columns)

    action(client, "create_table", {"path": "db.users", "descriptor": USERS})
    users = pa.record_batch(
        [pa.array([1, 2], pa.int64()), pa.array(["a", "b"]), pa.array([10, 20], pa.int64())], schema=USER_SCHEMA
    )
    retry(lambda: put_table(client, users))
    rows = []
    for b in [b["bucket"] for b in action(client, "metadata", {"path": "db.users"})["buckets"]]:
        t = read("Snapshot", b, columns=["name"])
        assert t.schema.names == ["name"]
        rows += t.column("name").to_pylist()
    assert sorted(rows) == ["a", "b"]


def test_reads_answer_only_the_rows_their_filter_keeps(node):
    """A ticket's `filter` (pyarrow.flight, raw JSON): the node answers the rows for
    which it holds, evaluated before the projection; a filtered Scan's batches say
    where their stored rows end (`next_offset`), so a reader stepping through a bucket
    goes on past rows it never received; a range Scan reads to its end however few
    rows pass; a Snapshot takes filters on its key only; a bad filter is
    InvalidArgument naming what is wrong, and the read answers nothing."""
    proc, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": {**EVENTS, "bucket_count": 1}})
    ids = list(range(100))
    msgs = [None if i % 10 == 0 else f"m{i % 7}" for i in ids]
    for lo in range(0, 100, 25):
        chunk = pa.record_batch(
            [pa.array(ids[lo : lo + 25], pa.int64()), pa.array(msgs[lo : lo + 25])], schema=SCHEMA
        )
        retry(lambda: append_table(client, "db.events", chunk))
    (bucket,) = [b["bucket"] for b in action(client, "metadata", {"path": "db.events"})["buckets"]]

    def read(kind, **fields):
        reader = client.do_get(flight.Ticket(json.dumps({kind: {"bucket": bucket, **fields}}).encode()))
        out = []
        for chunk in reader:
            out.append((chunk.data, json.loads(chunk.app_metadata.to_pybytes())))
        return out

    def rows(answer):
        return [r for batch, _ in answer for r in batch.to_pylist()]

    cases = [
        ({"compare": {"column": "id", "op": ">=", "value": 90}}, lambda i, m: i >= 90),
        ({"like": {"column": "msg", "pattern": "m3%"}}, lambda i, m: m is not None and m.startswith("m3")),
        ({"is_null": {"column": "msg"}}, lambda i, m: m is None),
        (
            {"or": [{"in": {"column": "msg", "values": ["m1", "m2"]}}, {"between": {"column": "id", "low": 3, "high": 5}}]},
            lambda i, m: m in ("m1", "m2") or 3 <= i <= 5,
        ),
        ({"not": {"compare": {"column": "msg", "op": "=", "value": "m4"}}}, lambda i, m: m is not None and m != "m4"),
    ]
    before = metric(proc, "mink_flight_read_filtered_rows_total")
    for filt, keep in cases:
        want = [{"id": i} for i, m in zip(ids, msgs) if keep(i, m)]
        # Filtered on `msg`, answering `id` alone.
        ranged = read("Scan", offset=0, end_offset=100, columns=["id"], filter=filt)
        assert rows(ranged) == want, filt
        # One scan at a time, stepping as a reader does: from `next_offset`.
        got, offset = [], 0
        while offset < 100:
            answer = read("Scan", offset=offset, max_bytes=1, columns=["id"], filter=filt)
            assert answer, filt
            got += rows(answer)
            nexts = [meta["next_offset"] for _, meta in answer]
            assert nexts == sorted(nexts) and nexts[-1] > offset
            offset = nexts[-1]
        assert got == want, filt
    # The rows left out never crossed the wire.
    kept = sum(sum(keep(i, m) for i, m in zip(ids, msgs)) for _, keep in cases)
    assert metric(proc, "mink_flight_read_filtered_rows_total") - before >= 2 * (5 * 100 - kept)

    bad = [
        ({"compare": {"column": "nope", "op": "=", "value": 1}}, "nope"),
        ({"compare": {"column": "id", "op": "=", "value": "ten"}}, "does not fit"),
        ({"compare": {"column": "id", "op": "=", "value": 1.5}}, "does not fit"),
        ({"like": {"column": "id", "pattern": "1%"}}, "string column"),
        ({"in": {"column": "id", "values": list(range(2000))}}, "more than 1024"),
        ({"regex": {"column": "msg"}}, "unknown variant"),
    ]
    for filt, words in bad:
        with pytest.raises(pa.ArrowInvalid, match=words):
            read("Scan", offset=0, end_offset=100, filter=filt)

    action(client, "create_table", {"path": "db.users", "descriptor": {**USERS, "bucket_count": 1}})
    users = pa.record_batch(
        [pa.array([1, 2, 3], pa.int64()), pa.array(["a", "b", "c"]), pa.array([10, 20, 30], pa.int64())],
        schema=USER_SCHEMA,
    )
    retry(lambda: put_table(client, users))
    (ub,) = [b["bucket"] for b in action(client, "metadata", {"path": "db.users"})["buckets"]]
    snap = client.do_get(
        flight.Ticket(json.dumps({"Snapshot": {"bucket": ub, "filter": {"compare": {"column": "id", "op": ">", "value": 1}}}}).encode())
    ).read_all()
    assert sorted(snap.column("id").to_pylist()) == [2, 3]
    # A state the filter empties still says what offset it is at.
    reader = client.do_get(
        flight.Ticket(json.dumps({"Snapshot": {"bucket": ub, "filter": {"compare": {"column": "id", "op": ">", "value": 99}}}}).encode())
    )
    chunks = list(reader)
    assert chunks and sum(c.data.num_rows for c in chunks) == 0
    assert json.loads(chunks[-1].app_metadata.to_pybytes())["log_offset"] >= 0
    with pytest.raises(pa.ArrowInvalid, match="primary-key columns only"):
        client.do_get(
            flight.Ticket(
                json.dumps({"Snapshot": {"bucket": ub, "filter": {"compare": {"column": "score", "op": ">", "value": 1}}}}).encode()
            )
        ).read_all()


def test_bad_input_gets_precise_errors_and_changes_nothing(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
    good = pa.record_batch([pa.array([1], pa.int64()), pa.array(["x"])], schema=SCHEMA)
    retry(lambda: append_table(client, "db.events", good))

    with pytest.raises(pa.ArrowInvalid, match="malformed JSON"):
        list(client.do_action(flight.Action("create_database", b"{not json")))
    with pytest.raises(pa.ArrowInvalid, match="unknown action"):
        list(client.do_action(flight.Action("make_coffee", b"{}")))
    # Well-formed JSON with a bad name: the error names what is wrong, not the JSON.
    with pytest.raises(pa.ArrowInvalid, match="table name") as bad_name:
        action(client, "create_table", {"path": "db.no/pe", "descriptor": EVENTS})
    assert "malformed JSON" not in str(bad_name.value)
    # A huge name: the error quotes a bounded part of it and still reaches the client
    # (a status message over gRPC's header limit arrives as "Stream removed").
    with pytest.raises(pa.ArrowInvalid, match="10000 characters long; the limit is 200") as huge:
        action(client, "create_database", {"name": "x" * 10_000})
    assert len(str(huge.value)) < 1_000
    with pytest.raises(pa.ArrowInvalid, match="schema"):
        append_table(client, "db.events", good, schema_id=7)
    nullable = pa.schema([pa.field("id", pa.int64()), pa.field("msg", pa.string())])
    null_key = pa.record_batch([pa.array([None], pa.int64()), pa.array(["x"])], schema=nullable)
    with pytest.raises(pa.ArrowInvalid, match="null"):
        append_table(client, "db.events", null_key)
    with pytest.raises(pa.ArrowKeyError, match="not found: table db.nope"):
        append_table(client, "db.nope", good)
    with pytest.raises(pa.ArrowException, match="already exists"):
        action(client, "create_database", {"name": "db"})
    with pytest.raises(pa.ArrowKeyError, match="lake snapshot 7"):
        list(client.do_get(flight.Ticket(json.dumps({"Lake": {"path": "db.events", "snapshot_id": 7}}).encode())))
    with pytest.raises(pa.ArrowInvalid, match="ticket"):
        list(client.do_get(flight.Ticket(json.dumps({"Lake": {"path": "db.events", "snapshot": 7}}).encode())))
    assert len(scan_all(client, "db.events")) == 1, "nothing was written by the bad requests"


def test_acknowledged_rows_survive_a_restart(node, mink_node, tmp_path):
    proc, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
    batch = pa.record_batch([pa.array(range(10), pa.int64()), pa.array(["a"] * 10)], schema=SCHEMA)
    retry(lambda: append_table(client, "db.events", batch))
    client.close()
    assert proc.stop() == 0, "SIGTERM closes cleanly"
    again = NodeProcess(mink_node, tmp_path)
    try:
        client2 = flight.connect(again.location)
        rows = retry(lambda: scan_all(client2, "db.events"))
        assert sorted(r["id"] for r in rows) == list(range(10))
        client2.close()
    finally:
        again.kill()


USERS = {
    "schema": {
        "columns": [
            {"name": "id", "type": "BIGINT", "nullable": False},
            {"name": "name", "type": "STRING"},
            {"name": "score", "type": "BIGINT"},
        ]
    },
    "primary_key": ["id"],
    "bucket_count": 2,
}
USER_SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("score", pa.int64())]
)


def put_table(client, batch, meta=None, target_columns=None, path="db.users", schema_id=1):
    descriptor = flight.FlightDescriptor.for_command(
        json.dumps({"PutTable": {"path": path, "schema_id": schema_id, "target_columns": target_columns}})
    )
    writer, reader = client.do_put(descriptor, batch.schema)
    writer.write_with_metadata(batch, pa.py_buffer(json.dumps(meta or {}).encode()))
    writer.done_writing()
    answer = reader.read()
    writer.close()
    assert answer is not None
    return json.loads(answer.to_pybytes())


def changelog(client, meta):
    """Every bucket's (change type, id) pairs, from offset 0."""
    changes = []
    for b in meta["buckets"]:
        ticket = flight.Ticket(json.dumps({"Scan": {"bucket": b["bucket"], "offset": 0}}).encode())
        for chunk in client.do_get(ticket):
            scan = json.loads(chunk.app_metadata.to_pybytes())
            changes.extend(zip(scan["change_types"], chunk.data.column(0).to_pylist()))
    return changes


def lookup(client, ids):
    [result] = client.do_action(
        flight.Action("lookup", json.dumps({"path": "db.users", "keys": [[i] for i in ids]}).encode())
    )
    table = pa.ipc.open_stream(result.body.to_pybytes()).read_all()
    return {r["id"]: (r["name"], r["score"]) for r in table.to_pylist()}


def test_a_kv_snapshot_past_one_part_round_trips_through_s3(mink_node, tmp_path, s3_url):
    """A KV snapshot larger than one upload part (8 MiB) goes up to a real S3 API (moto)
    as a multipart upload, streams back through the Snapshot ticket (read in ranged
    GETs), and is what a node with no local KV store loads."""
    import shutil

    proc = NodeProcess(mink_node, tmp_path, env=s3_url)
    client = flight.connect(proc.location)
    try:
        action(client, "create_database", {"name": "db"})
        # Uncompressed, so that the snapshot's bytes pass one part (its rows compress
        # to a few per cent under the default zstd).
        descriptor = dict(USERS, bucket_count=1, properties={"compression": "none"})
        action(client, "create_table", {"path": "db.users", "descriptor": descriptor})
        rows, per = 100_000, 10_000
        for first in range(0, rows, per):
            ids = list(range(first, first + per))
            batch = pa.record_batch(
                [pa.array(ids, pa.int64()), pa.array([f"{i:08d}" + "n" * 100 for i in ids]), pa.array(ids, pa.int64())],
                schema=USER_SCHEMA,
            )
            retry(lambda: put_table(client, batch))
        bucket = action(client, "metadata", {"path": "db.users"})["buckets"][0]["bucket"]
        snap = action(client, "latest_kv_snapshot", {"bucket": bucket})
        assert snap["rows"] == rows and snap["bytes"] > 8 << 20, snap
        state = client.do_get(flight.Ticket(json.dumps({"Snapshot": {"bucket": bucket}}).encode())).read_all()
        assert state.num_rows == rows
        assert sorted(state.column("id").to_pylist()) == list(range(rows))
    finally:
        client.close()
        proc.kill()
    # A node without its local KV store loads the snapshot (then replays nothing).
    shutil.rmtree(tmp_path / "mink-data" / "kv")
    proc = NodeProcess(mink_node, tmp_path, env=s3_url)
    client = flight.connect(proc.location)
    try:
        probe = [0, 4_242, 99_999]
        found = wait_for(lambda: _ok_lookup(client, probe), timeout=60, what="lookups after the reload")
        assert found == {i: (f"{i:08d}" + "n" * 100, i) for i in probe}
        assert any("KV store loaded from a snapshot" in line for line in proc.lines), "no snapshot was loaded"
    finally:
        client.close()
        proc.kill()


def _ok_lookup(client, ids):
    try:
        found = lookup(client, ids)
    except pa.ArrowException:
        return None
    return found if len(found) == len(ids) else None


def test_primary_key_tables_upsert_partially_update_delete_and_look_up(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.users", "descriptor": USERS})
    rows = pa.record_batch(
        [pa.array([1, 2, 3], pa.int64()), pa.array(["ann", "bob", "cy"]), pa.array([10, 20, 30], pa.int64())],
        schema=USER_SCHEMA,
    )
    retry(lambda: put_table(client, rows))
    assert lookup(client, [1, 2, 3, 4]) == {1: ("ann", 10), 2: ("bob", 20), 3: ("cy", 30)}

    # A partial update touches only the target columns.
    partial_schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("score", pa.int64())])
    partial = pa.record_batch([pa.array([1], pa.int64()), pa.array([11], pa.int64())], schema=partial_schema)
    put_table(client, partial, target_columns=["id", "score"])
    # Deletes through the changes vector.
    gone = pa.record_batch([pa.array([2], pa.int64()), pa.array([None], pa.string()), pa.array([None], pa.int64())], schema=USER_SCHEMA)
    put_table(client, gone, meta={"changes": ["-D"]})
    assert lookup(client, [1, 2, 3]) == {1: ("ann", 11), 3: ("cy", 30)}

    # The changelog is readable with its change types.
    meta = action(client, "metadata", {"path": "db.users"})
    changes = changelog(client, meta)
    assert sorted(changes) == sorted([("+I", 1), ("+I", 2), ("+I", 3), ("-U", 1), ("+U", 1), ("-D", 2)])

    # An idempotent writer's retry is recognised and not applied twice.
    writer_id = action(client, "init_writer")["writer_id"]
    bucket = meta["buckets"][0]["bucket"]
    descriptor = flight.FlightDescriptor.for_command(
        json.dumps({"Put": {"bucket": bucket, "schema_id": 1, "writer_id": writer_id}})
    )
    latest = {b["bucket"]["bucket"]: b for b in action(client, "list_offsets", {"path": "db.users", "spec": "latest"})}
    assert set(latest) == {0, 1}

    def put_bucket(key, sequence):
        writer, reader = client.do_put(descriptor, USER_SCHEMA)
        batch = pa.record_batch([pa.array([key], pa.int64()), pa.array(["w"]), pa.array([1], pa.int64())], schema=USER_SCHEMA)
        writer.write_with_metadata(batch, pa.py_buffer(json.dumps({"batch_sequence": sequence}).encode()))
        writer.done_writing()
        answer = reader.read()
        writer.close()
        return json.loads(answer.to_pybytes())["Written"]

    # Rows of another bucket are refused precisely; find a key of bucket 0.
    key = None
    for candidate in range(100, 140):
        try:
            first = put_bucket(candidate, 0)
        except pa.ArrowInvalid as e:
            assert "belongs to bucket 1" in str(e)
            continue
        key = candidate
        assert first["duplicated"] is False
        break
    assert key is not None
    again = put_bucket(key, 0)
    assert again["duplicated"] is True
    assert (again["first_offset"], again["last_offset"]) == (first["first_offset"], first["last_offset"])
    assert lookup(client, [key]) == {key: ("w", 1)}


def one_bucket_writer(client, path, descriptor, kind):
    """Creates `path` (in a new database) with one bucket; returns the bucket and the
    `kind` ("Append" or "Put") descriptor of a new writer for it."""
    action(client, "create_database", {"name": path.split(".")[0]})
    action(client, "create_table", {"path": path, "descriptor": {**descriptor, "bucket_count": 1}})
    bucket = action(client, "metadata", {"path": path})["buckets"][0]["bucket"]
    writer_id = action(client, "init_writer")["writer_id"]
    return bucket, flight.FlightDescriptor.for_command(
        json.dumps({kind: {"bucket": bucket, "schema_id": 1, "writer_id": writer_id}})
    )


def test_a_put_that_changes_nothing_is_durable_and_readers_step_over_it(node, mink_node, tmp_path):
    """A Put that changes nothing is logged as a sequence marker: one offset, no rows
    (docs/log-format.md). A pyarrow scan that ends at it gets an empty batch whose
    base_offset is past it, so a reader going on from base_offset + rows reaches the
    high watermark; GetFlightInfo reads every row. After a restart, a late attempt of
    the no-op (the same writer and sequence) is a duplicate: it does not undo what
    another writer wrote since."""
    proc, client = node
    bucket, descriptor = one_bucket_writer(client, "db.users", USERS, "Put")

    def put(c, sequence, name):
        writer, reader = c.do_put(descriptor, USER_SCHEMA)
        batch = pa.record_batch([pa.array([7], pa.int64()), pa.array([name]), pa.array([1], pa.int64())], schema=USER_SCHEMA)
        writer.write_with_metadata(batch, pa.py_buffer(json.dumps({"batch_sequence": sequence}).encode()))
        writer.done_writing()
        answer = reader.read()
        writer.close()
        return json.loads(answer.to_pybytes())["Written"]

    first = retry(lambda: put(client, 0, "ann"))
    noop = put(client, 1, "ann")  # the row it already holds
    assert noop["duplicated"] is False
    assert noop["first_offset"] == noop["last_offset"] + 1 == first["last_offset"] + 2, noop
    [latest] = action(client, "list_offsets", {"path": "db.users", "spec": "latest"})
    assert latest["offset"] == noop["first_offset"], "the marker takes one offset"

    ticket = flight.Ticket(json.dumps({"Scan": {"bucket": bucket, "offset": 0}}).encode())
    chunks = [(json.loads(c.app_metadata.to_pybytes()), c.data) for c in client.do_get(ticket)]
    assert [(m["base_offset"], d.num_rows) for m, d in chunks] == [(0, 1), (latest["offset"], 0)], chunks
    base, rows = chunks[-1][0]["base_offset"], chunks[-1][1].num_rows
    assert base + rows == chunks[-1][0]["high_watermark"], "a reader steps over the marker"
    _, read = read_flight(client, "db.users")
    assert [(r["id"], r["name"]) for r in read] == [(7, "ann")]

    # Another writer changes the key after the no-op; then a restart.
    put_table(client, pa.record_batch([pa.array([7], pa.int64()), pa.array(["bob"]), pa.array([2], pa.int64())], schema=USER_SCHEMA))
    client.close()
    assert proc.stop() == 0
    again = NodeProcess(mink_node, tmp_path)
    try:
        c2 = flight.connect(again.location)
        stale = retry(lambda: put(c2, 1, "ann"))
        assert stale["duplicated"] is True, stale
        assert (stale["first_offset"], stale["last_offset"]) == (noop["first_offset"], noop["last_offset"])
        [result] = c2.do_action(flight.Action("lookup", json.dumps({"path": "db.users", "keys": [[7]]}).encode()))
        assert pa.ipc.open_stream(result.body.to_pybytes()).read_all().to_pylist() == [{"id": 7, "name": "bob", "score": 2}]
        assert put(c2, 2, "cy")["duplicated"] is False, "the writer goes on after its no-op"
        c2.close()
    finally:
        again.kill()


def test_a_write_is_followed_from_its_request_to_its_wal_upload(mink_node, tmp_path):
    """docs/operations.md: with JSON logs at debug, a bucket write's `written` event
    carries its request span's bucket, writer and sequence and the `wal_seq` of the WAL
    upload that carried it, and that upload's `uploaded` event names the same `seq`."""
    proc = NodeProcess(mink_node, tmp_path, {"RUST_LOG": "info,mink_node=debug,mink_wal=debug", "MINK_LOGGING__FORMAT": "json"})
    client = flight.connect(proc.location)
    try:
        bucket, descriptor = one_bucket_writer(client, "db.events", EVENTS, "Append")
        writer_id = json.loads(descriptor.command)["Append"]["writer_id"]
        batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], schema=SCHEMA)

        def append():
            writer, reader = client.do_put(descriptor, SCHEMA)
            writer.write_with_metadata(batch, pa.py_buffer(json.dumps({"batch_sequence": 7}).encode()))
            writer.done_writing()
            answer = reader.read()
            writer.close()
            return json.loads(answer.to_pybytes())

        retry(append)

        def written():
            for line in list(proc.lines):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("fields", {}).get("message") != "written":
                    continue
                span = event.get("span", {})
                if span.get("name") == "append" and span.get("writer") == f"Some({writer_id})":
                    return event
            return None

        event = wait_for(written, what="the write's `written` event")
        span = event["span"]
        assert span["sequence"] == "Some(7)", event
        wal_seq = int(span["wal_seq"])

        def uploaded():
            for line in list(proc.lines):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("fields", {}).get("message") == "uploaded" and event.get("span", {}).get("name") == "wal.upload":
                    if int(event["span"]["seq"]) == wal_seq:
                        return event
            return None

        wait_for(uploaded, what=f"the `uploaded` event of WAL upload {wal_seq}")
    finally:
        client.close()
        proc.kill()


def test_sigkill_loses_nothing_acknowledged(node, mink_node, tmp_path):
    import signal

    proc, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
    action(client, "create_table", {"path": "db.users", "descriptor": USERS})
    acked = []
    for i in range(20):
        batch = pa.record_batch([pa.array([i], pa.int64()), pa.array([f"m{i}"])], schema=SCHEMA)
        retry(lambda: append_table(client, "db.events", batch))
        acked.append(i)
    users = pa.record_batch(
        [pa.array([1, 2], pa.int64()), pa.array(["ann", "bob"]), pa.array([1, 2], pa.int64())], schema=USER_SCHEMA
    )
    retry(lambda: put_table(client, users))
    client.close()
    proc.stop(signal.SIGKILL)
    again = NodeProcess(mink_node, tmp_path)
    try:
        client2 = flight.connect(again.location)
        rows = retry(lambda: scan_all(client2, "db.events"))
        assert sorted(r["id"] for r in rows) == acked, "every acknowledged row, once"
        assert retry(lambda: lookup(client2, [1, 2])) == {1: ("ann", 1), 2: ("bob", 2)}
        # And the node keeps taking writes.
        more = pa.record_batch([pa.array([99], pa.int64()), pa.array(["after"])], schema=SCHEMA)
        retry(lambda: append_table(client2, "db.events", more))
        assert len(scan_all(client2, "db.events")) == 21
        client2.close()
    finally:
        again.kill()


def test_tail_long_polls_and_wakes_when_rows_arrive(node):
    import threading

    _, client = node
    action(client, "create_database", {"name": "db"})
    one_bucket = dict(EVENTS, bucket_count=1)
    action(client, "create_table", {"path": "db.events", "descriptor": one_bucket})
    bucket = action(client, "metadata", {"path": "db.events"})["buckets"][0]
    descriptor = flight.FlightDescriptor.for_command(json.dumps({"Tail": {"bucket": bucket["bucket"]}}))
    writer, reader = client.do_exchange(descriptor)

    def poll(offset, max_wait_ms, min_bytes=1):
        writer.write_metadata(
            pa.py_buffer(json.dumps({"offset": offset, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes}).encode())
        )
        rows = []
        while True:
            chunk = reader.read_chunk()
            meta = json.loads(chunk.app_metadata.to_pybytes())
            if "TailEnd" in meta:
                return rows, meta["TailEnd"]
            rows.extend(chunk.data.to_pylist())

    # Nothing to read yet beyond what exists: the poll waits until rows arrive. The
    # writer runs later on its own thread; the assertion is on the rows, not on time.
    start = retry(lambda: action(client, "list_offsets", {"path": "db.events", "spec": "latest"}))[0]["offset"]
    batch = pa.record_batch([pa.array([7, 8], pa.int64()), pa.array(["a", "b"])], schema=SCHEMA)
    later = threading.Timer(0.3, lambda: append_table(flight.connect(node[0].location), "db.events", batch))
    later.start()
    rows, end = poll(start, 20_000)
    later.join()
    assert [r["id"] for r in rows] == [7, 8]
    assert end["next_offset"] == start + 2
    # With nothing new, the poll ends empty at its deadline.
    rows, end = poll(end["next_offset"], 50)
    assert rows == [] and end["next_offset"] == start + 2
    writer.done_writing()
    writer.close()


def test_partitions_are_created_on_demand(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    daily = {
        "schema": {
            "columns": [
                {"name": "day", "type": "STRING", "nullable": False},
                {"name": "id", "type": "BIGINT", "nullable": False},
                {"name": "msg", "type": "STRING"},
            ]
        },
        "partition_keys": ["day"],
        "bucket_keys": ["id"],
        "bucket_count": 2,
    }
    action(client, "create_table", {"path": "db.daily", "descriptor": daily})
    schema = pa.schema(
        [pa.field("day", pa.string(), nullable=False), pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())]
    )
    batch = pa.record_batch(
        [pa.array(["2026-11-28", "2026-11-29", "2026-11-29"]), pa.array([1, 2, 3], pa.int64()), pa.array(["a", "b", "c"])],
        schema=schema,
    )
    routed = retry(lambda: append_table(client, "db.daily", batch))
    assert sum(b["last_offset"] - b["first_offset"] + 1 for b in routed["Routed"]["buckets"]) == 3
    names = sorted(p["name"] for p in action(client, "list_partitions", {"path": "db.daily"}))
    assert names == ["2026-11-28", "2026-11-29"]
    rows = scan_all(client, "db.daily")
    assert sorted((r["day"], r["id"]) for r in rows) == [("2026-11-28", 1), ("2026-11-29", 2), ("2026-11-29", 3)]
    # Offsets are per partition, which a partitioned table's list_offsets must name.
    latest = action(client, "list_offsets", {"path": "db.daily", "spec": "latest", "partition": "2026-11-29"})
    assert len(latest) == 2 and sum(o["offset"] for o in latest) == 2
    with pytest.raises(pa.ArrowInvalid, match="name the partition"):
        action(client, "list_offsets", {"path": "db.daily", "spec": "latest"})
    with pytest.raises(pa.ArrowKeyError, match="partition 2026-01-01"):
        action(client, "list_offsets", {"path": "db.daily", "spec": "latest", "partition": "2026-01-01"})
    # A value that makes no partition name is refused precisely, and nothing is written.
    bad = pa.record_batch([pa.array(["no/slash"]), pa.array([4], pa.int64()), pa.array(["x"])], schema=schema)
    with pytest.raises(pa.ArrowInvalid, match="partition name"):
        append_table(client, "db.daily", bad)
    assert len(scan_all(client, "db.daily")) == 3


def test_a_wal_changelog_image_writes_no_before_images(node):
    """`changelog_image=wal`: upserts are +U rows whether new, changed or unchanged, no
    -U anywhere; deletes are -D; lookups see the same state as with full images. A log
    table cannot have the property."""
    _, client = node
    action(client, "create_database", {"name": "db"})
    descriptor = dict(USERS, properties={"changelog_image": "wal"})
    action(client, "create_table", {"path": "db.users", "descriptor": descriptor})
    rows = pa.record_batch(
        [pa.array([1, 2], pa.int64()), pa.array(["ann", "bob"]), pa.array([10, 20], pa.int64())],
        schema=USER_SCHEMA,
    )
    retry(lambda: put_table(client, rows))
    again = pa.record_batch(
        [pa.array([1, 2], pa.int64()), pa.array(["ann", "bob"]), pa.array([11, 20], pa.int64())],
        schema=USER_SCHEMA,
    )
    put_table(client, again)
    gone = pa.record_batch([pa.array([2], pa.int64()), pa.array([None], pa.string()), pa.array([None], pa.int64())], schema=USER_SCHEMA)
    put_table(client, gone, meta={"changes": ["-D"]})
    assert lookup(client, [1, 2]) == {1: ("ann", 11)}
    meta = action(client, "metadata", {"path": "db.users"})
    changes = changelog(client, meta)
    assert sorted(changes) == sorted([("+U", 1), ("+U", 2), ("+U", 1), ("+U", 2), ("-D", 2)])

    log_table = {"schema": USERS["schema"], "properties": {"changelog_image": "wal"}}
    with pytest.raises(pa.ArrowInvalid, match="changelog_image"):
        action(client, "create_table", {"path": "db.plain", "descriptor": log_table})


def test_lookups_on_a_partitioned_primary_key_table(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    daily = {
        "schema": {
            "columns": [
                {"name": "day", "type": "STRING", "nullable": False},
                {"name": "id", "type": "BIGINT", "nullable": False},
                {"name": "msg", "type": "STRING"},
            ]
        },
        "primary_key": ["day", "id"],
        "partition_keys": ["day"],
        "bucket_count": 2,
    }
    action(client, "create_table", {"path": "db.daily_kv", "descriptor": daily})
    schema = pa.schema(
        [pa.field("day", pa.string(), nullable=False), pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())]
    )
    batch = pa.record_batch(
        [pa.array(["2026-11-28", "2026-11-29", "2026-11-29"]), pa.array([1, 1, 2], pa.int64()), pa.array(["a", "b", "c"])],
        schema=schema,
    )
    retry(lambda: put_table(client, batch, path="db.daily_kv"))
    keys = [["2026-11-29", 1], ["2026-11-28", 1], ["2026-11-29", 3], ["2026-12-01", 1]]
    [result] = client.do_action(flight.Action("lookup", json.dumps({"path": "db.daily_kv", "keys": keys}).encode()))
    rows = pa.ipc.open_stream(result.body.to_pybytes()).read_all().to_pylist()
    assert sorted((r["day"], r["id"], r["msg"]) for r in rows) == [("2026-11-28", 1, "a"), ("2026-11-29", 1, "b")]
    # A lookup creates no partition.
    names = sorted(p["name"] for p in action(client, "list_partitions", {"path": "db.daily_kv"}))
    assert names == ["2026-11-28", "2026-11-29"]


def test_alter_snapshots_limit_scan_and_stats(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": dict(EVENTS, bucket_count=1)})
    action(client, "create_table", {"path": "db.users", "descriptor": dict(USERS, bucket_count=1)})
    batch = pa.record_batch([pa.array(range(5), pa.int64()), pa.array(["a"] * 5)], schema=SCHEMA)
    retry(lambda: append_table(client, "db.events", batch))

    # Schema evolution: a nullable column at the end, then rows under schema 2.
    action(client, "alter_table", {"path": "db.events", "add_columns": [{"name": "tag", "type": "STRING"}]})
    table = action(client, "get_table", {"path": "db.events"})
    assert [s["schema_id"] for s in table["schemas"]] == [1, 2]
    v2 = pa.schema(list(SCHEMA) + [pa.field("tag", pa.string())])
    tagged = pa.record_batch([pa.array([9], pa.int64()), pa.array(["b"]), pa.array(["new"])], schema=v2)
    append_table(client, "db.events", tagged, schema_id=2)
    # A writer still on schema 1: its rows keep their schema id and read with the new
    # column null; rows that do not match the version they claim are refused.
    old_rows = pa.record_batch([pa.array([10], pa.int64()), pa.array(["c"])], schema=SCHEMA)
    append_table(client, "db.events", old_rows, schema_id=1)
    with pytest.raises(pa.ArrowInvalid, match="schema"):
        append_table(client, "db.events", tagged, schema_id=1)
    with pytest.raises(pa.ArrowInvalid, match="has no schema 3"):
        append_table(client, "db.events", tagged, schema_id=3)
    bucket = action(client, "metadata", {"path": "db.events"})["buckets"][0]["bucket"]
    rows = client.do_get(flight.Ticket(json.dumps({"Scan": {"bucket": bucket, "offset": 0}}).encode())).read_all()
    assert rows.schema.names == ["id", "msg", "tag"]
    assert rows.column("tag").to_pylist() == [None] * 5 + ["new", None], "old rows read with the new column null"
    assert rows.column("id").to_pylist() == [0, 1, 2, 3, 4, 9, 10]

    # LimitScan: the first rows of a bucket.
    first = client.do_get(flight.Ticket(json.dumps({"LimitScan": {"bucket": bucket, "limit": 3}}).encode())).read_all()
    assert first.column("id").to_pylist() == [0, 1, 2]

    # KV snapshots, readable through the Snapshot ticket.
    users = pa.record_batch(
        [pa.array([1, 2], pa.int64()), pa.array(["ann", "bob"]), pa.array([1, 2], pa.int64())], schema=USER_SCHEMA
    )
    put_table(client, users)
    # A primary-key table upgrades rows of an older schema version to the current one.
    action(client, "alter_table", {"path": "db.users", "add_columns": [{"name": "vip", "type": "BOOLEAN"}]})
    carol = pa.record_batch([pa.array([3], pa.int64()), pa.array(["cy"]), pa.array([3], pa.int64())], schema=USER_SCHEMA)
    put_table(client, carol, schema_id=1)
    [result] = client.do_action(flight.Action("lookup", json.dumps({"path": "db.users", "keys": [[3]]}).encode()))
    found = pa.ipc.open_stream(result.body.to_pybytes()).read_all().to_pylist()
    assert found == [{"id": 3, "name": "cy", "score": 3, "vip": None}]
    ubucket = action(client, "metadata", {"path": "db.users"})["buckets"][0]["bucket"]
    snap = action(client, "latest_kv_snapshot", {"bucket": ubucket})
    assert snap["rows"] == 3
    state = client.do_get(flight.Ticket(json.dumps({"Snapshot": {"bucket": ubucket}}).encode())).read_all()
    assert sorted(state.column("name").to_pylist()) == ["ann", "bob", "cy"]

    with pytest.raises(pa.ArrowKeyError, match="lake.enabled is off"):
        action(client, "lake_snapshot", {"path": "db.events"})
    stats = action(client, "node_stats")
    assert stats["tablets_open"] == 2 and stats["wal_failure"] is None
    # Every object-store request is counted by operation and purpose.
    counted = stats["object_store"]
    assert counted["requests"] == sum(k["requests"] for k in counted["by_kind"])
    assert any(k["op"] == "put" and k["purpose"] == "wal" for k in counted["by_kind"])


def test_prefix_lookup_by_the_leading_bucket_key(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    orders = {
        "schema": {
            "columns": [
                {"name": "user", "type": "STRING", "nullable": False},
                {"name": "order", "type": "BIGINT", "nullable": False},
                {"name": "qty", "type": "BIGINT"},
            ]
        },
        "primary_key": ["user", "order"],
        "bucket_keys": ["user"],
        "bucket_count": 3,
    }
    action(client, "create_table", {"path": "db.orders", "descriptor": orders})
    schema = pa.schema(
        [pa.field("user", pa.string(), nullable=False), pa.field("order", pa.int64(), nullable=False), pa.field("qty", pa.int64())]
    )
    batch = pa.record_batch(
        [pa.array(["ann", "bob", "ann", "annie"]), pa.array([2, 1, 1, 9], pa.int64()), pa.array([1, 2, 3, 4], pa.int64())],
        schema=schema,
    )
    retry(lambda: put_table(client, batch, path="db.orders"))
    [result] = client.do_action(
        flight.Action("prefix_lookup", json.dumps({"path": "db.orders", "prefix": ["ann"]}).encode())
    )
    rows = pa.ipc.open_stream(result.body.to_pybytes()).read_all().to_pylist()
    assert [(r["user"], r["order"]) for r in rows] == [("ann", 1), ("ann", 2)], "ann's orders in key order, not annie's"
    with pytest.raises(pa.ArrowInvalid, match="bucket-key columns"):
        list(client.do_action(flight.Action("prefix_lookup", json.dumps({"path": "db.orders", "prefix": []}).encode())))


def prefix_lookup(client, path, prefix):
    [result] = client.do_action(flight.Action("prefix_lookup", json.dumps({"path": path, "prefix": prefix}).encode()))
    return pa.ipc.open_stream(result.body.to_pybytes()).read_all().to_pylist()


def test_prefix_lookup_on_a_partitioned_table(node):
    _, client = node
    action(client, "create_database", {"name": "db"})
    orders = {
        "schema": {
            "columns": [
                {"name": "day", "type": "DATE", "nullable": False},
                {"name": "user", "type": "STRING", "nullable": False},
                {"name": "order", "type": "BIGINT", "nullable": False},
            ]
        },
        "primary_key": ["day", "user", "order"],
        "partition_keys": ["day"],
        "bucket_keys": ["user"],
        "bucket_count": 3,
    }
    action(client, "create_table", {"path": "db.daily_orders", "descriptor": orders})
    schema = pa.schema([pa.field("day", pa.date32(), nullable=False), pa.field("user", pa.string(), nullable=False),
                        pa.field("order", pa.int64(), nullable=False)])
    import datetime
    d28, d29 = datetime.date(2026, 11, 28), datetime.date(2026, 11, 29)
    batch = pa.record_batch(
        [pa.array([d28, d29, d29, d29], pa.date32()), pa.array(["ann", "ann", "ann", "bob"]), pa.array([1, 3, 2, 4], pa.int64())],
        schema=schema,
    )
    retry(lambda: put_table(client, batch, path="db.daily_orders"))
    rows = prefix_lookup(client, "db.daily_orders", ["2026-11-29", "ann"])
    assert [(str(r["day"]), r["user"], r["order"]) for r in rows] == [("2026-11-29", "ann", 2), ("2026-11-29", "ann", 3)]
    # DATE keys are YYYY-MM-DD or days since 1970-01-01.
    assert prefix_lookup(client, "db.daily_orders", [20786, "ann"]) == rows
    assert prefix_lookup(client, "db.daily_orders", ["2026-12-25", "ann"]) == [], "no such partition: no rows"
    with pytest.raises(pa.ArrowInvalid, match="day, user: the partition and bucket-key columns"):
        prefix_lookup(client, "db.daily_orders", ["ann"])


def test_admin_health_and_metrics_after_a_write(node):
    import urllib.request

    proc, client = node
    base = f"http://127.0.0.1:{proc.admin_port}"
    with urllib.request.urlopen(f"{base}/health") as r:
        assert r.status == 200 and json.loads(r.read())["status"] == "serving"
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
    batch = pa.record_batch([pa.array(range(30), pa.int64()), pa.array(["x"] * 30)], schema=SCHEMA)
    retry(lambda: append_table(client, "db.events", batch))
    with urllib.request.urlopen(f"{base}/metrics") as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    assert samples['mink_flight_requests_total{method="do_put"}'] >= 1
    assert samples["mink_flight_put_rows_total"] == 30
    assert samples['mink_flight_actions_total{action="create_table"}'] == 1
    assert samples["mink_wal_uploads_total"] >= 1
    assert samples["mink_node_buckets_led"] == 3
    assert samples["mink_meta_lease_holder"] == 1
    assert samples["mink_node_tablets_open"] == 3
    assert samples["mink_node_tablets_opening"] == 0
    assert samples["mink_node_tablet_open_seconds_count"] == 3

    # A node that lost its object store answers 503 and says why.
    import urllib.error

    def unhealthy():
        try:
            urllib.request.urlopen(f"{base}/health")
            return None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    lose_object_store(proc.workdir / "mink-data" / "objects")
    code, body = wait_for(unhealthy, what="/health reports the loss")
    assert code == 503 and body["status"] == "unavailable"
    assert "object store refused the last heartbeat" in body["problem"]


def metric(proc, name):
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{proc.admin_port}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


def snapshot_read(client, bucket):
    """A Snapshot ticket's rows (by id) and each batch's app metadata."""
    reader = client.do_get(flight.Ticket(json.dumps({"Snapshot": {"bucket": bucket}}).encode()))
    rows, metas = {}, []
    for chunk in reader:
        metas.append(json.loads(chunk.app_metadata.to_pybytes()))
        rows.update({r["id"]: r["name"] for r in chunk.data.to_pylist()})
    return rows, metas


def test_snapshot_reads_send_snapshot_batches_and_reuse_a_recent_snapshot(node):
    """A Snapshot ticket's batches carry SnapshotBatch metadata (spec/protocols.txt);
    reads and latest_kv_snapshot return the newest snapshot while it is younger than
    kv.snapshot_interval_ms (10 minutes here) instead of writing one each."""
    proc, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.users", "descriptor": dict(USERS, bucket_count=1)})
    users = pa.record_batch(
        [pa.array([1, 2], pa.int64()), pa.array(["ann", "bob"]), pa.array([1, 2], pa.int64())], schema=USER_SCHEMA
    )
    retry(lambda: put_table(client, users))
    bucket = action(client, "metadata", {"path": "db.users"})["buckets"][0]["bucket"]
    snap = action(client, "latest_kv_snapshot", {"bucket": bucket})
    assert snap["rows"] == 2 and snap["log_offset"] == 2
    rows, metas = snapshot_read(client, bucket)
    assert rows == {1: "ann", 2: "bob"}
    expected = {"bucket": bucket, "log_offset": 2, "written_at_ms": snap["written_at_ms"]}
    assert metas and all(m == expected for m in metas), metas

    # A later write is not in the reused snapshot; its log_offset says where the
    # changelog continues.
    put_table(client, pa.record_batch(
        [pa.array([3], pa.int64()), pa.array(["cy"]), pa.array([3], pa.int64())], schema=USER_SCHEMA))
    rows, metas = snapshot_read(client, bucket)
    assert rows == {1: "ann", 2: "bob"} and all(m == expected for m in metas)
    assert action(client, "latest_kv_snapshot", {"bucket": bucket}) == snap
    ticket = {"Scan": {"bucket": bucket, "offset": expected["log_offset"]}}
    later = client.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all()
    assert later.column("id").to_pylist() == [3]
    assert metric(proc, "mink_kv_snapshots_written_total") == 1, "one snapshot for two actions and two reads"


def test_a_snapshot_older_than_the_interval_is_renewed_by_the_next_read(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path, {"MINK_KV__SNAPSHOT_INTERVAL_MS": "1"})
    client = flight.connect(proc.location)
    try:
        action(client, "create_database", {"name": "db"})
        action(client, "create_table", {"path": "db.users", "descriptor": dict(USERS, bucket_count=1)})
        for i, name in enumerate(["ann", "bob"]):
            batch = pa.record_batch(
                [pa.array([i], pa.int64()), pa.array([name]), pa.array([i], pa.int64())], schema=USER_SCHEMA)
            retry(lambda: put_table(client, batch))
            bucket = action(client, "metadata", {"path": "db.users"})["buckets"][0]["bucket"]
            # One older than 1 ms is renewed by the next read, which then holds the
            # write.
            # (A snapshot with no rows sends no batch, hence no metadata: an empty
            # read says nothing about which offset it is at.)
            for _ in range(200):
                rows, metas = snapshot_read(client, bucket)
                if metas and all(m["log_offset"] == i + 1 for m in metas):
                    break
                time.sleep(0.005)
            assert metas and all(m["log_offset"] == i + 1 for m in metas), metas
            assert len(rows) == i + 1, "older than 1 ms: a new snapshot with the latest write"
        # The reads wrote at least these two; the periodic snapshotter (every 1 ms
        # here, when the bucket changed) may have written more.
        assert metric(proc, "mink_kv_snapshots_written_total") >= 2
    finally:
        client.close()
        proc.kill()


def read_flight(client, path):
    """Every row of a table the standard Flight way: GetFlightInfo, then DoGet of each
    endpoint's ticket at the endpoint's location."""
    info = client.get_flight_info(flight.FlightDescriptor.for_path(path))
    rows = []
    for endpoint in info.endpoints:
        assert endpoint.ticket.ticket, "every endpoint has a ticket"
        [location] = endpoint.locations
        at = flight.connect(location)
        try:
            rows.extend(at.do_get(endpoint.ticket).read_all().to_pylist())
        finally:
            at.close()
    return info, rows


def test_get_flight_info_endpoints_read_back_every_row(mink_node, tmp_path):
    # Scans of at most 1 KiB, so an endpoint is read in many scans.
    proc = NodeProcess(mink_node, tmp_path, {"MINK_LOG__SCAN_BYTES_MAX": "1024"})
    client = flight.connect(proc.location)
    try:
        action(client, "create_database", {"name": "db"})
        action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
        for start in range(0, 1000, 100):
            batch = pa.record_batch(
                [pa.array(range(start, start + 100), pa.int64()), pa.array([f"message {i}" for i in range(start, start + 100)])],
                schema=SCHEMA,
            )
            retry(lambda: append_table(client, "db.events", batch))
        info, rows = read_flight(client, "db.events")
        assert len(info.endpoints) == 3, "one endpoint per bucket"
        assert all(loc.uri.decode() == proc.location for e in info.endpoints for loc in e.locations)
        assert sorted(r["id"] for r in rows) == list(range(1000))
        assert info.total_records == 1000
        assert info.schema.names == ["id", "msg"]

        # Rows written after GetFlightInfo are not in its endpoints: each reads the
        # bucket as it was then.
        later = pa.record_batch([pa.array([5000], pa.int64()), pa.array(["later"])], schema=SCHEMA)
        append_table(client, "db.events", later)
        for endpoint in info.endpoints:
            got = client.do_get(endpoint.ticket).read_all().column("id").to_pylist()
            assert 5000 not in got
        assert sorted(r["id"] for r in read_flight(client, "db.events")[1]) == list(range(1000)) + [5000]

        # A partitioned table: one endpoint per bucket of every partition.
        daily = {
            "schema": {"columns": [{"name": "day", "type": "STRING", "nullable": False},
                                   {"name": "id", "type": "BIGINT", "nullable": False}]},
            "partition_keys": ["day"], "bucket_keys": ["id"], "bucket_count": 2,
        }
        action(client, "create_table", {"path": "db.daily", "descriptor": daily})
        schema = pa.schema([pa.field("day", pa.string(), nullable=False), pa.field("id", pa.int64(), nullable=False)])
        batch = pa.record_batch([pa.array(["d1", "d2", "d2"]), pa.array([1, 2, 3], pa.int64())], schema=schema)
        retry(lambda: append_table(client, "db.daily", batch))
        info, rows = read_flight(client, "db.daily")
        assert len(info.endpoints) == 4
        assert sorted((r["day"], r["id"]) for r in rows) == [("d1", 1), ("d2", 2), ("d2", 3)]
    finally:
        client.close()
        proc.kill()


def test_producer_offsets_name_tables_partitions_and_buckets(node):
    """register_producer_offsets takes, and get_producer_offsets answers, offsets by
    table path, partition name and bucket: the same bucket number of two partitions,
    or of two tables, are different offsets."""
    _, client = node
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": dict(EVENTS, bucket_count=2)})
    daily = {
        "schema": {"columns": [{"name": "day", "type": "STRING", "nullable": False},
                               {"name": "id", "type": "BIGINT", "nullable": False}]},
        "partition_keys": ["day"], "bucket_keys": ["id"], "bucket_count": 2,
    }
    action(client, "create_table", {"path": "db.daily", "descriptor": daily})
    for day in ["2026-11-28", "2026-11-29"]:
        action(client, "create_partition", {"path": "db.daily", "name": day})
    offsets = [
        {"path": "db.daily", "partition": "2026-11-28", "bucket": 0, "offset": 5},
        {"path": "db.daily", "partition": "2026-11-29", "bucket": 0, "offset": 7},
        {"path": "db.daily", "partition": "2026-11-29", "bucket": 1, "offset": 8},
        {"path": "db.events", "partition": None, "bucket": 0, "offset": 6},
    ]
    action(client, "register_producer_offsets", {"producer_id": "sink-1", "offsets": offsets, "ttl_ms": 60_000})
    got = action(client, "get_producer_offsets", {"producer_id": "sink-1"})
    assert got["offsets"] == offsets
    assert got["expires_at_ms"] > 0

    # A registration replaces the producer's offsets; `partition` may be left out for
    # a table that has none.
    action(client, "register_producer_offsets",
           {"producer_id": "sink-1", "offsets": [{"path": "db.events", "bucket": 1, "offset": 9}]})
    assert action(client, "get_producer_offsets", {"producer_id": "sink-1"})["offsets"] == [
        {"path": "db.events", "partition": None, "bucket": 1, "offset": 9}
    ]

    def register(entry):
        return action(client, "register_producer_offsets", {"producer_id": "sink-2", "offsets": [entry]})

    with pytest.raises(pa.ArrowInvalid, match="db.daily is partitioned"):
        register({"path": "db.daily", "bucket": 0, "offset": 1})
    with pytest.raises(pa.ArrowKeyError, match="partition 2026-01-01 of db.daily"):
        register({"path": "db.daily", "partition": "2026-01-01", "bucket": 0, "offset": 1})
    with pytest.raises(pa.ArrowInvalid, match="db.events is not partitioned"):
        register({"path": "db.events", "partition": "2026-11-28", "bucket": 0, "offset": 1})
    with pytest.raises(pa.ArrowInvalid, match="db.events has no bucket 2"):
        register({"path": "db.events", "bucket": 2, "offset": 1})
    with pytest.raises(pa.ArrowKeyError, match="table db.nope"):
        register({"path": "db.nope", "bucket": 0, "offset": 1})
    with pytest.raises(pa.ArrowKeyError):
        action(client, "get_producer_offsets", {"producer_id": "sink-2"})

    # Offsets of a dropped partition are gone with it.
    action(client, "register_producer_offsets", {"producer_id": "sink-1", "offsets": offsets})
    action(client, "drop_partition", {"path": "db.daily", "name": "2026-11-28"})
    assert action(client, "get_producer_offsets", {"producer_id": "sink-1"})["offsets"] == offsets[1:]

    action(client, "delete_producer_offsets", {"producer_id": "sink-1"})
    with pytest.raises(pa.ArrowKeyError):
        action(client, "get_producer_offsets", {"producer_id": "sink-1"})


class HeaderRecorder(flight.ClientMiddlewareFactory):
    """Records the headers of every response, errors included."""

    def __init__(self):
        self.seen = []

    def start_call(self, info):
        factory = self

        class Middleware(flight.ClientMiddleware):
            def received_headers(self, headers):
                factory.seen.append((info.method, dict(headers)))

        return Middleware()


def test_error_responses_carry_the_applied_index(node):
    proc, _ = node
    recorder = HeaderRecorder()
    client = flight.connect(proc.location, middleware=[recorder])
    created = action(client, "create_database", {"name": "db"})
    failing = [
        lambda: action(client, "get_table", {"path": "db.nope"}),
        lambda: action(client, "make_coffee"),
        lambda: client.get_flight_info(flight.FlightDescriptor.for_path("db.nope")),
        lambda: client.do_get(flight.Ticket(b"{not json")).read_all(),
        lambda: append_table(client, "db.nope", pa.record_batch([pa.array([1], pa.int64()), pa.array(["x"])], schema=SCHEMA)),
    ]
    for call in failing:
        recorder.seen.clear()
        with pytest.raises(pa.ArrowException):
            call()
        indices = [h.get("mink-applied-index") for _, h in recorder.seen]
        assert indices and all(i is not None for i in indices), recorder.seen
        assert all(int(i[0]) >= created["index"] for i in indices)
    client.close()


def test_pipelined_puts_through_a_wal_failure_apply_in_order(mink_node, tmp_path):
    """A pyarrow writer pipelines Puts of one key: 5 fails with the WAL, the node
    replaces its WAL and reopens the bucket by itself, and 6 reaches it before 5 is
    re-sent. The node must not take 6 past the undecided 5: 6 waits for 5 and both land
    in order (the key ends at 6's value); a 6 whose 5 never comes is refused as out of
    order, and nothing of it is written."""
    import threading
    import urllib.request

    proc = NodeProcess(
        mink_node,
        tmp_path,
        # A failed upload fails the WAL at once (no retries), so the test needs no minute.
        env={"MINK_TESTING__FAULT_INJECTION": "true", "MINK_WAL__UPLOAD_RETRY_BUDGET_MS": "0"},
    )
    client = flight.connect(proc.location)
    base = f"http://127.0.0.1:{proc.admin_port}"

    def fault(body):
        req = urllib.request.Request(f"{base}/fault", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req) as r:
            assert r.status == 200

    def serving():
        try:
            with urllib.request.urlopen(f"{base}/health") as r:
                return r.status == 200
        except Exception:  # noqa: BLE001 - 503 while the WAL is being replaced
            return False

    try:
        action(client, "create_database", {"name": "db"})
        users = dict(USERS, bucket_count=1)
        action(client, "create_table", {"path": "db.users", "descriptor": users})
        meta = retry(lambda: action(client, "metadata", {"path": "db.users"}))
        bucket = meta["buckets"][0]["bucket"]
        writer_id = action(client, "init_writer")["writer_id"]
        descriptor = flight.FlightDescriptor.for_command(
            json.dumps({"Put": {"bucket": bucket, "schema_id": 1, "writer_id": writer_id}})
        )

        def put(sequence, name):
            batch = pa.record_batch(
                [pa.array([7], pa.int64()), pa.array([name]), pa.array([sequence], pa.int64())],
                schema=USER_SCHEMA,
            )
            w, reader = client.do_put(descriptor, USER_SCHEMA)
            w.write_with_metadata(batch, pa.py_buffer(json.dumps({"batch_sequence": sequence}).encode()))
            w.done_writing()
            answer = reader.read()
            w.close()
            return json.loads(answer.to_pybytes())["Written"]

        for sequence in range(5):
            retry(lambda: put(sequence, f"v{sequence}"))
        fault({"put_failure_rate": 1.0})
        with pytest.raises(pa.ArrowException):
            put(5, "five")
        fault({})
        wait_for(serving, what="the node serving again on a new WAL")

        # 6 first; 5 a moment later, as a pipelining client's retries may arrive.
        outcome = {}

        def send_six():
            try:
                outcome["six"] = put(6, "six")
            except Exception as e:  # noqa: BLE001 - reported below
                outcome["six"] = e

        six = threading.Thread(target=send_six)
        six.start()
        time.sleep(0.02)
        five = wait_for(lambda: _try(lambda: put(5, "five")), what="5 accepted after the reopen")
        six.join()
        assert isinstance(outcome["six"], dict), outcome["six"]
        assert five["last_offset"] < outcome["six"]["first_offset"], (five, outcome["six"])
        assert lookup(client, [7]) == {7: ("six", 6)}

        # 8 with no 7 in sight: refused after a short wait, nothing written.
        with pytest.raises(pa.ArrowException, match="out-of-order sequence.*expected 7"):
            put(8, "eight")
        assert lookup(client, [7]) == {7: ("six", 6)}
    finally:
        client.close()
        proc.kill()


def _try(fn):
    """`fn()`, or None while the bucket is reopening (Unavailable)."""
    try:
        return fn()
    except pa.ArrowException as e:
        if "unavailable" in str(e).lower() or "being opened" in str(e):
            return None
        raise


def test_compression_is_per_table_and_a_mixed_log_reads_after_a_crash(mink_node, tmp_path):
    """A table's `compression` property: batches written under `none`, then `zstd`
    (the node's encoding and a client's own zstd IPC, kept as it came), then `lz4`,
    read back as one log, before and after a SIGKILL, and the bytes the log keeps on
    object storage shrink with the codec. A codec Mink does not know is refused and
    changes nothing."""
    env = {"MINK_DATA_DIR": str(tmp_path / "data")}
    proc = NodeProcess(mink_node, tmp_path, env)
    again = None
    try:
        client = flight.connect(f"grpc://127.0.0.1:{proc.flight_port}")
        action(client, "create_database", {"name": "db"})
        descriptor = dict(EVENTS, bucket_count=1, properties={"compression": "none"})
        action(client, "create_table", {"path": "db.c", "descriptor": descriptor})

        def rows(first):
            ids = range(first, first + 5000)
            return pa.record_batch(
                [pa.array(ids, pa.int64()), pa.array([f"customer-{i % 50}" for i in ids])], schema=SCHEMA
            )

        def stored():
            [stat] = action(client, "bucket_stats", {"path": "db.c", "open": True})
            return stat["stored_bytes"]

        retry(lambda: append_table(client, "db.c", rows(0)))
        plain = stored()

        with pytest.raises(pa.ArrowInvalid, match="properties.compression"):
            action(client, "alter_table", {"path": "db.c", "set_properties": {"compression": "brotli"}})
        assert action(client, "get_table", {"path": "db.c"})["descriptor"]["properties"]["compression"] == "none"

        action(client, "alter_table", {"path": "db.c", "set_properties": {"compression": "zstd"}})
        append_table(client, "db.c", rows(5000))
        zstd = stored() - plain
        assert zstd * 2 < plain, f"zstd kept {zstd} bytes for rows that took {plain} uncompressed"

        # A client that compresses its IPC with the table's codec.
        path = json.dumps({"AppendTable": {"path": "db.c", "schema_id": 1}})
        options = flight.FlightCallOptions(write_options=pa.ipc.IpcWriteOptions(compression="zstd"))
        writer, reader = client.do_put(flight.FlightDescriptor.for_command(path), SCHEMA, options=options)
        writer.write_with_metadata(rows(10000), pa.py_buffer(b"{}"))
        writer.done_writing()
        assert reader.read() is not None
        writer.close()

        action(client, "alter_table", {"path": "db.c", "set_properties": {"compression": "lz4"}})
        append_table(client, "db.c", rows(15000))
        got = action(client, "get_table", {"path": "db.c"})["descriptor"]["properties"]
        assert got["compression"] == "lz4"

        def check(c):
            table = sorted(scan_all(c, "db.c"), key=lambda r: r["id"])
            assert [r["id"] for r in table] == list(range(20000))
            assert all(r["msg"] == f"customer-{r['id'] % 50}" for r in table)

        check(client)
        # A reader that asks for compressed IPC bodies gets the same rows.
        bucket = action(client, "metadata", {"path": "db.c"})["buckets"][0]["bucket"]
        ticket = flight.Ticket(json.dumps({"Scan": {"bucket": bucket, "offset": 0}}).encode())
        for codec in [b"zstd", b"lz4"]:
            options = flight.FlightCallOptions(headers=[(b"mink-read-compression", codec)])
            got = client.do_get(ticket, options=options).read_all()
            assert got.column("id").to_pylist() == list(range(got.num_rows)) and got.num_rows > 0
        bad = flight.FlightCallOptions(headers=[(b"mink-read-compression", b"brotli")])
        with pytest.raises(pa.ArrowInvalid, match="mink-read-compression"):
            client.do_get(ticket, options=bad).read_all()
        proc.kill()
        again = NodeProcess(mink_node, tmp_path, env)
        after = flight.connect(f"grpc://127.0.0.1:{again.flight_port}")
        # The node recovers the bucket on its own; reads answer once it has.
        deadline = time.monotonic() + 60
        while True:
            try:
                check(after)
                break
            except flight.FlightError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        proc.kill()
        if again is not None:
            again.kill()
