"""Lake tables that Mink tiers, read by engines we did not write: DuckDB's iceberg
extension and pyiceberg, on file:// and on the local S3 server. Each reads exactly the
rows Mink's own `Union` read returns once tiering has caught up, across every type, a
partitioned table and a schema change."""

import datetime
import decimal
import glob
import json
import os
import subprocess

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from pyiceberg.table import StaticTable

from node_proc import NodeProcess, retry, wait_for


def action(client, name, body=None):
    results = list(client.do_action(flight.Action(name, json.dumps(body or {}).encode())))
    assert len(results) == 1
    return json.loads(results[0].body.to_pybytes())


def append_table(client, path, batch, schema_id=1):
    descriptor = flight.FlightDescriptor.for_command(
        json.dumps({"AppendTable": {"path": path, "schema_id": schema_id}})
    )
    writer, reader = client.do_put(descriptor, batch.schema)
    writer.write_with_metadata(batch, pa.py_buffer(b"{}"))
    writer.done_writing()
    answer = reader.read()
    writer.close()
    assert answer is not None
    return json.loads(answer.to_pybytes())


def read(client, ticket):
    return client.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all()


COLUMNS = [
    {"name": "id", "type": "BIGINT", "nullable": False},
    {"name": "msg", "type": "STRING"},
    {"name": "amount", "type": "DECIMAL(10,2)"},
    {"name": "day", "type": "DATE"},
    {"name": "at", "type": "TIMESTAMP_LTZ(3)"},
    {"name": "local", "type": "TIMESTAMP(6)"},
    {"name": "flag", "type": "BOOLEAN"},
    {"name": "small", "type": "SMALLINT"},
    {"name": "data", "type": "BYTES"},
    {"name": "region", "type": "STRING", "nullable": False},
]

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("msg", pa.string()),
        pa.field("amount", pa.decimal128(10, 2)),
        pa.field("day", pa.date32()),
        pa.field("at", pa.timestamp("ms", tz="UTC")),
        pa.field("local", pa.timestamp("us")),
        pa.field("flag", pa.bool_()),
        pa.field("small", pa.int16()),
        pa.field("data", pa.binary()),
        pa.field("region", pa.string(), nullable=False),
    ]
)


def rows(ids, schema=SCHEMA):
    base = datetime.datetime(2026, 11, 30, 12, 0, 0)
    data = {
        "id": list(ids),
        "msg": [None if i % 7 == 0 else f"m{i}" for i in ids],
        "amount": [decimal.Decimal(i) / 4 for i in ids],
        "day": [datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 40) for i in ids],
        "at": [(base + datetime.timedelta(seconds=i)).replace(tzinfo=datetime.timezone.utc) for i in ids],
        "local": [base + datetime.timedelta(microseconds=i) for i in ids],
        "flag": [i % 2 == 0 for i in ids],
        "small": [i % 300 for i in ids],
        "data": [bytes([i % 256]) * 3 for i in ids],
        "region": ["eu" if i % 3 else "us" for i in ids],
    }
    if "extra" in schema.names:
        data["extra"] = [i * 10 for i in ids]
    return pa.record_batch(data, schema=schema)


def duckdb_connection(s3=None):
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    # Offline: the extensions come from their wheels, loaded by path, avro first.
    for module in (duckdb_extension_avro, duckdb_extension_httpfs, duckdb_extension_iceberg):
        base = os.path.dirname(module.__file__)
        (path,) = glob.glob(os.path.join(base, "**", "*.duckdb_extension"), recursive=True)
        con.execute(f"LOAD '{path}'")
    if s3:
        endpoint = s3["MINK_OBJECT_STORE__ENDPOINT"].removeprefix("http://")
        con.execute(
            f"""CREATE SECRET (TYPE s3, KEY_ID 'test', SECRET 'test', REGION 'us-east-1',
                ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false)"""
        )
    return con


def pyiceberg_properties(s3):
    if not s3:
        return {}
    return {
        "s3.endpoint": s3["MINK_OBJECT_STORE__ENDPOINT"],
        "s3.access-key-id": "test",
        "s3.secret-access-key": "test",
        "s3.region": "us-east-1",
    }


def tiered(client, path, count):
    """Waits for the node's rounds to put `count` rows of `path` in the lake."""

    def probe():
        try:
            snap = action(client, "lake_snapshot", {"path": path})
        except pa.ArrowException:
            return None
        return snap if sum(snap["offsets"].values()) >= count else None

    return wait_for(probe, timeout=60, what=f"{count} rows of {path} in the lake")


def by_id(table):
    return table.sort_by("id")


@pytest.fixture(params=["file", "s3"])
def lake_node(request, mink_node, tmp_path):
    s3 = request.getfixturevalue("s3_url") if request.param == "s3" else None
    env = dict(s3) if s3 else {"MINK_OBJECT_STORE__URL": f"file://{tmp_path}/objects"}
    env["MINK_LAKE__CHECK_INTERVAL_MS"] = "100"
    if s3:
        # No key index on S3: merge-on-read rounds find the changed keys' rows by
        # range reads of the lake's key columns (file:// runs use the index).
        env["MINK_LAKE__KEY_INDEX_BYTES_MAX"] = "0"
    proc = NodeProcess(mink_node, tmp_path, env)
    client = flight.connect(proc.location)
    yield proc, client, s3, env["MINK_OBJECT_STORE__URL"]
    client.close()
    proc.kill()


def test_duckdb_and_pyiceberg_read_what_union_reads(lake_node):
    proc, client, s3, root = lake_node
    action(client, "create_database", {"name": "db"})
    action(
        client,
        "create_table",
        {
            "path": "db.events",
            "descriptor": {
                "schema": {"columns": COLUMNS},
                "partition_keys": ["region"],
                "bucket_keys": ["id"],
                "bucket_count": 3,
                "properties": {"lake": {"enabled": True, "freshness": "1s"}},
            },
        },
    )
    retry(lambda: append_table(client, "db.events", rows(range(0, 200))))
    append_table(client, "db.events", rows(range(200, 300)))
    snap = tiered(client, "db.events", 300)
    assert snap["records"] == 300

    union = by_id(read(client, {"Union": {"path": "db.events"}}))
    lake = by_id(read(client, {"Lake": {"path": "db.events"}}))
    assert union.num_rows == 300
    assert union.equals(lake)
    assert union.column("id").to_pylist() == list(range(300))

    # pyiceberg, from the snapshot's metadata file.
    table = StaticTable.from_metadata(snap["metadata_location"], properties=pyiceberg_properties(s3))
    assert table.current_snapshot().snapshot_id == snap["snapshot_id"]
    theirs = by_id(table.scan().to_arrow())
    assert theirs.num_rows == 300
    for name in ["id", "msg", "amount", "day", "flag", "data", "region"]:
        assert theirs.column(name).to_pylist() == union.column(name).to_pylist(), name
    assert theirs.column("small").to_pylist() == union.column("small").to_pylist()
    # Timestamps: the lake keeps microseconds, UTC for TIMESTAMP_LTZ.
    assert theirs.column("at").cast(pa.timestamp("ms", tz="UTC")).equals(union.column("at"))
    assert theirs.column("local").to_pylist() == union.column("local").to_pylist()
    per_bucket = {}
    # A bucket is (partition, bucket number): each one's offsets run from 0, once.
    for r, b, o in zip(
        theirs.column("region").to_pylist(),
        theirs.column("__bucket").to_pylist(),
        theirs.column("__offset").to_pylist(),
    ):
        per_bucket.setdefault((r, b), []).append(o)
    for offsets in per_bucket.values():
        assert sorted(offsets) == list(range(len(offsets))), "each bucket's offsets from 0, once"
    # Partition pruning works on the identity partition.
    eu = table.scan(row_filter="region == 'eu'").to_arrow()
    assert eu.num_rows == sum(1 for r in union.column("region").to_pylist() if r == "eu")

    # DuckDB, from the table directory (version-hint.text).
    location = f"{root}/lake/db/events"
    if not s3:
        location = location.removeprefix("file://")
    con = duckdb_connection(s3)
    count, total, eu_count = con.execute(
        f"SELECT count(*), sum(id), count(*) FILTER (WHERE region = 'eu') FROM iceberg_scan('{location}')"
    ).fetchone()
    assert (count, total) == (300, sum(range(300)))
    assert eu_count == eu.num_rows
    msgs = con.execute(
        f"SELECT id, msg, amount, data FROM iceberg_scan('{location}') ORDER BY id LIMIT 8"
    ).fetchall()
    assert [m[1] for m in msgs] == union.column("msg").to_pylist()[:8]
    assert [m[2] for m in msgs] == union.column("amount").to_pylist()[:8]
    assert [bytes(m[3]) for m in msgs] == union.column("data").to_pylist()[:8]

    # A schema change: the new column reads as null in the old files, everywhere.
    action(client, "alter_table", {"path": "db.events", "add_columns": [{"name": "extra", "type": "BIGINT"}]})
    schema2 = SCHEMA.append(pa.field("extra", pa.int64()))
    retry(lambda: append_table(client, "db.events", rows(range(300, 350), schema2), schema_id=2))
    snap = tiered(client, "db.events", 350)
    union = by_id(read(client, {"Union": {"path": "db.events"}}))
    assert union.column("extra").to_pylist() == [None] * 300 + [i * 10 for i in range(300, 350)]
    table = StaticTable.from_metadata(snap["metadata_location"], properties=pyiceberg_properties(s3))
    theirs = by_id(table.scan().to_arrow())
    assert theirs.column("extra").to_pylist() == union.column("extra").to_pylist()
    extra_count, extra_sum = con.execute(
        f"SELECT count(extra), sum(extra) FROM iceberg_scan('{location}')"
    ).fetchone()
    assert (extra_count, extra_sum) == (50, sum(i * 10 for i in range(300, 350)))


def test_union_is_whole_before_and_between_rounds(lake_node, bin_dir):
    proc, client, s3, root = lake_node
    action(client, "create_database", {"name": "db"})
    columns = [c for c in COLUMNS if c["name"] in ("id", "msg", "region")]
    schema = pa.schema([SCHEMA.field(c["name"]) for c in columns])
    action(
        client,
        "create_table",
        {
            "path": "db.t",
            "descriptor": {
                "schema": {"columns": columns},
                "bucket_count": 2,
                "properties": {"lake": {"enabled": True, "freshness": "1s"}},
            },
        },
    )

    def batch(ids):
        return pa.record_batch(
            {"id": list(ids), "msg": [f"m{i}" for i in ids], "region": ["x"] * len(ids)}, schema=schema
        )

    # Nothing tiered yet: Union is the log; Lake is empty; no snapshot yet.
    retry(lambda: append_table(client, "db.t", batch(range(0, 10))))
    assert read(client, {"Union": {"path": "db.t"}}).num_rows == 10
    written = 10
    for start in range(10, 400, 10):
        append_table(client, "db.t", batch(range(start, start + 10)))
        written = start + 10
        union = read(client, {"Union": {"path": "db.t"}})
        ids = sorted(union.column("id").to_pylist())
        assert ids == list(range(written)), f"after {written} rows"
    tiered(client, "db.t", written)
    assert sorted(read(client, {"Lake": {"path": "db.t"}}).column("id").to_pylist()) == list(range(written))
    # `mink lake status`: the snapshot and no lag left.
    status = json.loads(
        subprocess.run(
            [str(bin_dir / "mink"), "--addr", f"127.0.0.1:{proc.flight_port}", "lake", "status", "db.t"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert status["snapshot"]["records"] == written
    assert len(status["buckets"]) == 2
    assert [b["lag_rows"] for b in status["buckets"]] == [0, 0]
    assert sum(b["lake_offset"] for b in status["buckets"]) == written
    # Unknown tables and snapshots are NotFound.
    with pytest.raises(pa.ArrowKeyError, match="db.nope"):
        read(client, {"Union": {"path": "db.nope"}})
    with pytest.raises(pa.ArrowKeyError, match="lake snapshot"):
        read(client, {"Lake": {"path": "db.t", "snapshot_id": 12345}})


def put_table(client, path, batch, meta=None, target_columns=None):
    command = {"PutTable": {"path": path, "schema_id": 1, "target_columns": target_columns}}
    descriptor = flight.FlightDescriptor.for_command(json.dumps(command))
    writer, reader = client.do_put(descriptor, batch.schema)
    writer.write_with_metadata(batch, pa.py_buffer(json.dumps(meta or {}).encode()))
    writer.done_writing()
    answer = reader.read()
    writer.close()
    assert answer is not None
    return json.loads(answer.to_pybytes())


def test_a_primary_key_table_reads_as_its_latest_state(lake_node):
    """Updates and deletes are tiered copy-on-write: every engine reads the state."""
    proc, client, s3, root = lake_node
    action(client, "create_database", {"name": "db"})
    action(
        client,
        "create_table",
        {
            "path": "db.users",
            "descriptor": {
                "schema": {
                    "columns": [
                        {"name": "id", "type": "BIGINT", "nullable": False},
                        {"name": "name", "type": "STRING"},
                        {"name": "score", "type": "BIGINT"},
                    ]
                },
                "primary_key": ["id"],
                "bucket_count": 2,
                "properties": {"lake": {"enabled": True, "freshness": "1s"}},
            },
        },
    )
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("score", pa.int64())]
    )

    def users(ids, tag):
        return pa.record_batch(
            {"id": list(ids), "name": [f"{tag}{i}" for i in ids], "score": [i * 2 for i in ids]}, schema=schema
        )

    retry(lambda: put_table(client, "db.users", users(range(0, 40), "a")))
    put_table(client, "db.users", users(range(0, 10), "b"))
    put_table(client, "db.users", users(range(30, 40), "a"), meta={"changes": ["-D"] * 10})
    want = sorted([(i, f"b{i}") for i in range(10)] + [(i, f"a{i}") for i in range(10, 30)])

    def log_end():
        return sum(o["offset"] or 0 for o in action(client, "list_offsets", {"path": "db.users", "spec": "latest"}))

    snap = tiered(client, "db.users", log_end())
    union = read(client, {"Union": {"path": "db.users"}})
    assert sorted(zip(union.column("id").to_pylist(), union.column("name").to_pylist())) == want

    table = StaticTable.from_metadata(snap["metadata_location"], properties=pyiceberg_properties(s3))
    theirs = table.scan().to_arrow()
    assert sorted(zip(theirs.column("id").to_pylist(), theirs.column("name").to_pylist())) == want

    location = f"{root}/lake/db/users"
    if not s3:
        location = location.removeprefix("file://")
    con = duckdb_connection(s3)
    rows = con.execute(f"SELECT id, name FROM iceberg_scan('{location}') ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == want


def test_a_primary_key_lake_merges_on_read_and_every_engine_applies_the_deletes(lake_node):
    """After the first round, a primary-key table's rounds add the changed rows and
    Iceberg v2 position deletes of the rows they replace (merge-on-read): updates,
    deletes, re-inserts of deleted keys and a partial update, on an unpartitioned and a
    partitioned table. DuckDB, pyiceberg and Mink's Union read the same state after
    every round."""
    proc, client, s3, root = lake_node
    action(client, "create_database", {"name": "db"})
    columns = [
        {"name": "region", "type": "STRING", "nullable": False},
        {"name": "id", "type": "BIGINT", "nullable": False},
        {"name": "name", "type": "STRING"},
        {"name": "score", "type": "BIGINT"},
    ]
    lake = {"lake": {"enabled": True, "freshness": "1s"}}
    for path, extra in [
        ("db.flat", {"primary_key": ["region", "id"]}),
        ("db.regional", {"primary_key": ["region", "id"], "partition_keys": ["region"], "bucket_keys": ["id"]}),
    ]:
        action(
            client,
            "create_table",
            {"path": path, "descriptor": {"schema": {"columns": columns}, "bucket_count": 2, "properties": lake, **extra}},
        )
    schema = pa.schema(
        [
            pa.field("region", pa.string(), nullable=False),
            pa.field("id", pa.int64(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("score", pa.int64()),
        ]
    )

    def region(i):
        return "eu" if i % 3 else "us"

    def users(ids, tag):
        ids = list(ids)
        return pa.record_batch(
            {
                "region": [region(i) for i in ids],
                "id": ids,
                "name": [f"{tag}{i}" for i in ids],
                "score": [i * 2 for i in ids],
            },
            schema=schema,
        )

    state = {path: {} for path in ("db.flat", "db.regional")}

    def put(path, ids, tag, delete=False):
        batch = users(ids, tag)
        meta = {"changes": ["-D"] * batch.num_rows} if delete else None
        retry(lambda: put_table(client, path, batch, meta=meta))
        for i in ids:
            if delete:
                state[path].pop(i, None)
            else:
                state[path][i] = (region(i), i, f"{tag}{i}", i * 2)

    def partial_score(path, ids, score):
        ids = list(ids)
        partial = pa.record_batch(
            {"region": [region(i) for i in ids], "id": ids, "score": [score] * len(ids)},
            schema=pa.schema([schema.field("region"), schema.field("id"), schema.field("score")]),
        )
        put_table(client, path, partial, target_columns=["region", "id", "score"])
        for i in ids:
            r, _, name, _ = state[path][i]
            state[path][i] = (r, i, name, score)

    def log_end(path):
        partitions = ["eu", "us"] if path == "db.regional" else [None]
        return sum(
            o["offset"] or 0
            for p in partitions
            for o in action(client, "list_offsets", {"path": path, "spec": "latest", "partition": p})
        )

    def check(path, merged_on_read):
        snap = tiered(client, path, log_end(path))
        want = sorted(state[path].values())
        union = read(client, {"Union": {"path": path}})
        cols = ["region", "id", "name", "score"]
        assert sorted(zip(*(union.column(c).to_pylist() for c in cols))) == want
        table = StaticTable.from_metadata(snap["metadata_location"], properties=pyiceberg_properties(s3))
        theirs = table.scan().to_arrow()
        assert sorted(zip(*(theirs.column(c).to_pylist() for c in cols))) == want, "pyiceberg"
        location = f"{root}/lake/{path.replace('.', '/')}"
        if not s3:
            location = location.removeprefix("file://")
        got = duckdb_connection(s3).execute(f"SELECT region, id, name, score FROM iceberg_scan('{location}')").fetchall()
        assert sorted(tuple(r) for r in got) == want, "DuckDB"
        if merged_on_read:
            assert snap["delete_files"] > 0, snap
        assert snap["records"] - snap["position_deletes"] == len(want), snap
        return snap

    for path in state:
        put(path, range(0, 200), "a")
        check(path, merged_on_read=False)
        put(path, range(0, 10), "b")
        put(path, range(190, 200), "x", delete=True)
        snap = check(path, merged_on_read=True)
        assert snap["position_deletes"] == 20, snap
        put(path, range(192, 195), "c")
        partial_score(path, range(10, 15), -1)
        snap = check(path, merged_on_read=True)
        assert snap["position_deletes"] == 25, snap


def test_a_lake_turned_on_after_the_changelog_was_trimmed_holds_every_key(mink_node, tmp_path):
    """A primary-key table whose changelog the TTL trimmed (behind KV snapshots) before
    `lake.enabled` was set: the first round seeds each bucket from its KV snapshot, so
    DuckDB, pyiceberg and Union read every key, not only those changed since the log
    start; later changes merge on top as usual."""
    env = {
        "MINK_OBJECT_STORE__URL": f"file://{tmp_path}/objects",
        "MINK_LAKE__CHECK_INTERVAL_MS": "100",
        "MINK_LOG__TTL_CHECK_INTERVAL_MS": "100",
        "MINK_WAL__COMPACTION_INTERVAL_MS": "100",
    }
    proc = NodeProcess(mink_node, tmp_path, env)
    client = flight.connect(proc.location)
    try:
        action(client, "create_database", {"name": "db"})
        columns = [
            {"name": "id", "type": "BIGINT", "nullable": False},
            {"name": "name", "type": "STRING"},
        ]
        descriptor = {
            "schema": {"columns": columns},
            "primary_key": ["id"],
            "bucket_count": 2,
            "properties": {"log_ttl": "1s"},
        }
        action(client, "create_table", {"path": "db.users", "descriptor": descriptor})
        schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])

        def put(ids, tag, delete=False):
            batch = pa.record_batch({"id": list(ids), "name": [f"{tag}{i}" for i in ids]}, schema=schema)
            meta = {"changes": ["-D"] * batch.num_rows} if delete else None
            retry(lambda: put_table(client, "db.users", batch, meta=meta))

        def offsets(spec):
            return [o["offset"] or 0 for o in action(client, "list_offsets", {"path": "db.users", "spec": spec})]

        put(range(0, 100), "a")
        put(range(0, 10), "b")
        put(range(90, 100), "x", delete=True)
        # Every bucket's changelog trimmed past its first rows.
        wait_for(lambda: all(o > 0 for o in offsets("earliest")), 60, "the TTL trimming every bucket")

        action(
            client,
            "alter_table",
            {"path": "db.users", "set_properties": {"lake.enabled": "true", "lake.freshness": "1s"}},
        )
        want = {i: f"b{i}" if i < 10 else f"a{i}" for i in range(0, 90)}

        def check():
            snap = tiered(client, "db.users", sum(offsets("latest")))
            union = read(client, {"Union": {"path": "db.users"}})
            assert dict(zip(union.column("id").to_pylist(), union.column("name").to_pylist())) == want
            theirs = StaticTable.from_metadata(snap["metadata_location"]).scan().to_arrow()
            assert dict(zip(theirs.column("id").to_pylist(), theirs.column("name").to_pylist())) == want, "pyiceberg"
            location = f"{tmp_path}/objects/lake/db/users"
            got = duckdb_connection().execute(f"SELECT id, name FROM iceberg_scan('{location}')").fetchall()
            assert dict(got) == want, "DuckDB"
            assert len(got) == len(want), "one row per key"

        check()
        # Changes after the seed merge on top of it.
        put(range(20, 30), "c")
        put(range(0, 5), "x", delete=True)
        want.update({i: f"c{i}" for i in range(20, 30)})
        for i in range(0, 5):
            del want[i]
        check()
    finally:
        client.close()
        proc.kill()


def test_a_kafka_topic_tiers_to_the_lake(lake_node):
    """Records produced by librdkafka reach the lake; pyiceberg reads their keys,
    values and timestamps."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    proc, client, s3, root = lake_node
    admin = AdminClient({"bootstrap.servers": proc.bootstrap})
    admin.create_topics([NewTopic("clicks", num_partitions=2, replication_factor=1)])["clicks"].result(30)
    action(
        client,
        "alter_table",
        {"path": "kafka.clicks", "set_properties": {"lake.enabled": "true", "lake.freshness": "1s"}},
    )
    p = Producer({"bootstrap.servers": proc.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(100):
        p.produce("clicks", key=f"k{i}".encode(), value=f"v{i}".encode(), timestamp=1_700_000_000_000 + i)
    assert p.flush(30) == 0
    snap = tiered(client, "kafka.clicks", 100)
    table = StaticTable.from_metadata(snap["metadata_location"], properties=pyiceberg_properties(s3))
    rows = table.scan().to_arrow().sort_by("timestamp")
    assert rows.column("key").to_pylist() == [f"k{i}".encode() for i in range(100)]
    assert rows.column("value").to_pylist() == [f"v{i}".encode() for i in range(100)]
    first = rows.column("timestamp")[0].as_py()
    assert first == datetime.datetime.fromtimestamp(1_700_000_000, tz=datetime.timezone.utc)
