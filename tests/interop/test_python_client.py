"""The Python client (clients/python, `import mink`) against real nodes: catalog,
writes through the node and through the client-routed Writer, reads, lookups, tail,
typed errors, SQL through mink-query, a leader kill under the Writer, and the wheel in a
fresh venv. The Writer's routing is checked by the nodes themselves: a bucket-addressed
write holding a row of another bucket is refused."""

import asyncio
import datetime
import decimal
import os
import pathlib
import random
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from node_proc import NodeProcess, QueryProcess, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
sys.path.insert(0, str(CLIENT / "src"))

import mink  # noqa: E402
from mink.routing import bucket_of_rows, murmur3_rows  # noqa: E402


@pytest.fixture(scope="module")
def node(mink_node, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pyclient")
    n = NodeProcess(mink_node, workdir, {"MINK_DATA_DIR": str(workdir / "data")})
    yield n
    n.kill()


@pytest.fixture()
def client(node):
    c = mink.connect(node.location)
    yield c
    c.close()


def fresh_db(client, name):
    client.create_database(name)
    return name


# -- routing, against published vectors -----------------------------------------------


def murmur(data: bytes) -> int:
    h = int(murmur3_rows(np.frombuffer(data, np.uint8).reshape(1, len(data)))[0])
    return h - (1 << 32) if h >= 1 << 31 else h


def test_murmur3_and_the_iceberg_transform_match_their_published_vectors():
    assert murmur(b"") == 0
    assert murmur(b"hello") == 0x248BFA47
    assert murmur(b"hello, world") == 0x149BBB7F
    # Iceberg spec, Appendix B (the values are hashes, before the bucket modulo).
    from mink.routing import _iceberg_hashes

    def ice(values, t):
        h = int(_iceberg_hashes(pa.array(values, t), "k")[0])
        return h - (1 << 32) if h >= 1 << 31 else h

    assert ice([34], pa.int32()) == 2017239379
    assert ice([34], pa.int64()) == 2017239379
    assert ice([decimal.Decimal("14.20")], pa.decimal128(4, 2)) == -500754589
    assert ice([datetime.date(2017, 11, 16)], pa.date32()) == -653330422
    assert ice([datetime.time(22, 31, 8)], pa.time64("us")) == -662762989
    assert ice([datetime.datetime(2017, 11, 16, 22, 31, 8)], pa.timestamp("us")) == -2047944441
    assert ice([datetime.datetime(2017, 11, 16, 22, 31, 8, tzinfo=datetime.timezone.utc)], pa.timestamp("us", "UTC")) == -2047944441
    assert ice(["iceberg"], pa.string()) == 1210000089
    assert ice([bytes([0, 1, 2, 3])], pa.binary()) == -188683207


def test_the_kafka_rule_is_kafkas_partitioner_and_the_nodes(client):
    """A compacted topic's bucketing: Kafka's murmur2 (its UtilsTest vectors), and rows
    the client routes by it land in the buckets the node gives them."""
    from mink.routing import kafka_murmur2

    for key, h in [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ]:
        assert kafka_murmur2(key) == h, key
    db = fresh_db(client, "kafka_rule")
    schema = pa.schema([pa.field("key", pa.binary(), nullable=False), pa.field("v", pa.string())])
    t = client.create_table(f"{db}.keyed", schema, primary_key=["key"], buckets=5, bucketing="kafka")
    rows = [{"key": f"k-{i}".encode(), "v": str(i)} for i in range(200)]
    with t.writer() as w:
        w.write(rows)
    for b in range(t.bucket_count):
        part = t.scan(buckets=[b]).to_arrow()
        if part.num_rows:
            assert set(bucket_of_rows(part, t.bucket_keys, t.bucket_count, t.bucketing)) == {b}
    assert t.scan().to_arrow().num_rows == 200


# -- catalog --------------------------------------------------------------------------


def test_catalog_calls_and_schema_mapping(client):
    db = fresh_db(client, "cat")
    assert db in client.databases() and client.database_exists(db)
    client.create_database(db, ignore_if_exists=True)
    with pytest.raises(mink.AlreadyExists):
        client.create_database(db)
    schema = pa.schema(
        [
            pa.field("day", pa.date32()),
            pa.field("id", pa.int64()),
            pa.field("name", pa.large_string()),
            pa.field("at", pa.timestamp("ms", tz="Europe/Berlin")),
        ]
    )
    t = client.create_table(
        f"{db}.visits",
        schema,
        primary_key=["day", "id"],
        partition_keys=["day"],
        buckets=3,
        properties={"log_ttl": "3d"},
    )
    assert t.has_primary_key and t.bucket_keys == ["id"] and t.bucket_count == 3
    assert [c["type"] for c in t.columns] == ["DATE", "BIGINT", "STRING", "TIMESTAMP_LTZ(3)"]
    assert [c["nullable"] for c in t.columns] == [False, False, True, True]
    assert client.tables(db) == ["visits"] and client.table_exists(f"{db}.visits")
    t.alter(add_columns=pa.schema([pa.field("tag", pa.string())]))
    assert [len(s["columns"]) for s in t.schemas] == [4, 5]
    assert t.arrow_schema.names[-1] == "tag"
    assert t.create_partition("2026-12-01") > 0
    assert t.partition_names() == ["2026-12-01"]
    # A type Mink lacks is refused before anything is created.
    with pytest.raises(mink.InvalidArgument, match="list<item: int64>.*no Mink type"):
        client.create_table(f"{db}.bad", pa.schema([pa.field("xs", pa.list_(pa.int64()))]))
    assert not client.table_exists(f"{db}.bad")
    with pytest.raises(mink.NotFound, match="nope"):
        client.table(f"{db}.nope")
    with pytest.raises(mink.InvalidArgument) as bad:
        client.create_table(f"{db}.k", schema, primary_key=["missing"])
    assert "primary_key" in bad.value.field
    t.drop()
    assert client.tables(db) == []
    client.drop_database(db)
    assert not client.database_exists(db)


# -- every type, through pandas and Polars, routed by the client -----------------------

EVERY = pa.schema(
    [
        pa.field("b", pa.bool_(), False),
        pa.field("i8", pa.int8(), False),
        pa.field("i16", pa.int16(), False),
        pa.field("i32", pa.int32(), False),
        pa.field("i64", pa.int64(), False),
        pa.field("f32", pa.float32(), False),
        pa.field("f64", pa.float64(), False),
        pa.field("dec", pa.decimal128(12, 3), False),
        pa.field("s", pa.string(), False),
        pa.field("bin", pa.binary(), False),
        pa.field("d", pa.date32(), False),
        pa.field("t3", pa.time32("ms"), False),
        pa.field("t6", pa.time64("us"), False),
        pa.field("ts", pa.timestamp("us"), False),
        pa.field("tsz", pa.timestamp("ns", tz="UTC"), False),
        pa.field("note", pa.string()),
        pa.field("amount", pa.decimal128(12, 3)),
    ]
)
KEY_COLUMNS = [f.name for f in EVERY if not f.nullable]


def random_rows(rng, n, start=0):
    strings = ["", "a", "a\x00b", "\x00", "ü€", "x" * 40, "zz\x00\x00"]
    rows = []
    for i in range(start, start + n):
        rows.append(
            {
                "b": rng.random() < 0.5,
                "i8": rng.randint(-128, 127),
                "i16": rng.randint(-(2**15), 2**15 - 1),
                "i32": rng.randint(-(2**31), 2**31 - 1),
                "i64": i * (1 if i % 2 else -1) * 7919,
                "f32": rng.choice([0.0, -0.0, 1.5, -2.25, 3.0e10, -1e-3]),
                "f64": rng.uniform(-1e9, 1e9),
                "dec": decimal.Decimal(rng.randint(-10**9, 10**9)).scaleb(-3),
                "s": rng.choice(strings) + str(i % 3),
                "bin": bytes(rng.randrange(256) for _ in range(rng.randint(0, 9))),
                "d": datetime.date(1969, 12, 1) + datetime.timedelta(days=rng.randint(0, 30000)),
                "t3": datetime.time(rng.randint(0, 23), rng.randint(0, 59), 1, 1000 * rng.randint(0, 999)),
                "t6": datetime.time(rng.randint(0, 23), 0, 0, rng.randint(0, 999999)),
                "ts": datetime.datetime(1960, 1, 1) + datetime.timedelta(microseconds=rng.randint(0, 2**50)),
                "tsz": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
                + datetime.timedelta(seconds=rng.randint(-(10**8), 10**8)),
                "note": None if i % 4 == 0 else f"n{i}",
                "amount": None if i % 3 == 0 else decimal.Decimal(i).scaleb(-3),
            }
        )
    return rows


@pytest.mark.parametrize("bucketing", ["hash", "iceberg"])
def test_every_type_round_trips_through_pandas_and_polars_routed_by_the_client(client, bucketing):
    db = fresh_db(client, f"types_{bucketing}")
    rng = random.Random(7)
    if bucketing == "hash":
        # Every type in one composite bucket key: the node refuses a row of another bucket.
        t = client.create_table(f"{db}.every", EVERY, bucket_keys=KEY_COLUMNS, buckets=7)
        keyed = [t]
    else:
        keyed = [
            client.create_table(f"{db}.by_{k}", EVERY, bucket_keys=[k], buckets=5, bucketing="iceberg")
            for k in ["i8", "i32", "i64", "dec", "s", "bin", "d", "t3", "t6", "ts", "tsz"]
        ]
    rows = random_rows(rng, 300)
    expected = pa.Table.from_pylist(rows, schema=EVERY)
    for t in keyed:
        with t.writer() as w:
            w.write(expected.slice(0, 100).to_pandas())  # pandas
            w.write(pl.from_arrow(expected.slice(100, 100)))  # Polars
            w.write(rows[200:])  # Python rows
        got = t.scan().to_arrow()
        assert got.schema == EVERY
        assert got.sort_by("i64").equals(expected.sort_by("i64")), t.path
        # The client's buckets are the node's: every bucket holds only its rows.
        for b in range(t.bucket_count):
            part = t.scan(buckets=[b]).to_arrow()
            if part.num_rows:
                assert set(bucket_of_rows(part, t.bucket_keys, t.bucket_count, t.bucketing)) == {b}
    # Ranges of offsets.
    b0 = keyed[0].scan(buckets=[0]).to_arrow().num_rows
    assert keyed[0].scan(buckets=[0], from_offsets={0: 1}, until={0: 3}).to_arrow().num_rows == min(2, max(0, b0 - 1))
    assert len(keyed[0].buckets()) == keyed[0].bucket_count
    # Round trips out through pandas and Polars keep every value (nulls included).
    t = keyed[0]
    frame = t.scan().to_pandas()
    assert len(frame) == 300 and frame["note"].isna().sum() == 75
    assert isinstance(frame["tsz"].dtype, pd.DatetimeTZDtype)
    polars_frame = t.scan().to_polars()
    assert polars_frame.height == 300 and polars_frame["amount"].null_count() == 100


# -- primary keys ---------------------------------------------------------------------

USERS = pa.schema(
    [
        pa.field("region", pa.string(), False),
        pa.field("id", pa.int64(), False),
        pa.field("name", pa.string()),
        pa.field("score", pa.int32(), False),
    ]
)


def test_a_client_that_asks_for_compressed_reads_gets_the_same_rows(client, node):
    db = fresh_db(client, "zipped")
    t = client.create_table(f"{db}.lines", pa.schema([("id", pa.int64()), ("note", pa.string())]), buckets=2,
                            properties={"compression": "lz4"})
    t.append(pa.table({"id": list(range(3000)), "note": [f"line {i % 40}" for i in range(3000)]}))
    plain = t.scan().to_arrow().sort_by("id")
    for codec in ["zstd", "lz4"]:
        with mink.connect(node.location, compression=codec) as zipped:
            got = zipped.table(f"{db}.lines").scan().to_arrow().sort_by("id")
            assert got.equals(plain)
    with pytest.raises(ValueError, match="brotli"):
        mink.connect(node.location, compression="brotli")
    # What a compressed client sends with every call.
    from mink._conn import _Applied, _Middleware

    assert _Middleware(_Applied(), "zstd").sending_headers() == {"mink-read-compression": "zstd"}
    assert _Middleware(_Applied(), None).sending_headers() == {}


def test_upserts_partial_updates_deletes_lookups_and_state(client):
    db = fresh_db(client, "pk")
    t = client.create_table(f"{db}.users", USERS, primary_key=["region", "id"], partition_keys=["region"], buckets=2)
    assert t.bucket_keys == ["id"]
    # Table-addressed (the node routes), creating partitions on demand.
    t.upsert([{"region": "eu", "id": i, "name": f"u{i}", "score": i} for i in range(10)])
    t.upsert(pd.DataFrame({"region": ["us"] * 3, "id": [1, 2, 3], "name": ["a", "b", "c"], "score": [1, 2, 3]}))
    # Client-routed.
    w = t.writer()
    w.write([{"region": "eu", "id": 1, "name": "one", "score": 100}])
    w.write([{"region": "eu", "id": 2, "score": 200}], columns=["region", "id", "score"])  # partial: name kept
    w.delete([{"region": "eu", "id": 3}])
    t.delete([{"region": "us", "id": 3}])
    w.write([{"region": "ap", "id": 9, "name": "new", "score": 9}])  # a partition the writer creates
    w.close()
    assert sorted(t.partition_names()) == ["ap", "eu", "us"]

    found = t.lookup([("eu", 1), ("eu", 2), ("eu", 3), ("zz", 1)]).to_pylist()
    assert sorted((r["id"], r["name"], r["score"]) for r in found) == [(1, "one", 100), (2, "u2", 200)]
    assert t.lookup(pa.table({"region": ["us"], "id": [2]})).to_pylist()[0]["name"] == "b"
    # More keys than one lookup call takes.
    many = t.lookup([("eu", i % 10) for i in range(12_000)])
    assert many.num_rows == 12_000 - 1200
    orders = client.create_table(
        f"{db}.orders",
        pa.schema([("region", pa.string()), ("customer", pa.string()), ("order", pa.int64()), ("total", pa.float64())]),
        primary_key=["region", "customer", "order"],
        partition_keys=["region"],
        bucket_keys=["customer"],
        buckets=4,
    )
    orders.writer().write([{"region": "eu", "customer": c, "order": o, "total": o * 1.5} for c in ("ann", "bo") for o in (3, 1, 2)])
    prefix = orders.prefix_lookup(["eu", "ann"]).to_pylist()
    assert [r["order"] for r in prefix] == [1, 2, 3] and {r["customer"] for r in prefix} == {"ann"}
    assert orders.prefix_lookup(["eu", "ann"], limit=2).num_rows == 2
    assert orders.prefix_lookup(("us", "ann")).num_rows == 0

    state = {(r["region"], r["id"]): (r["name"], r["score"]) for r in t.snapshot().to_pylist()}
    expected = {("eu", i): (f"u{i}", i) for i in range(10) if i != 3}
    expected.update({("eu", 1): ("one", 100), ("eu", 2): ("u2", 200), ("us", 1): ("a", 1), ("us", 2): ("b", 2)})
    expected[("ap", 9)] = ("new", 9)
    assert state == expected
    # Read with the key alone besides: the same state, cut to the column asked.
    scores = t.snapshot(columns=["score"]).to_arrow()
    assert scores.column_names == ["score"]
    assert sorted(scores.column("score").to_pylist()) == sorted(v[1] for v in expected.values())
    changes = t.scan(partitions=["eu"]).to_arrow()
    kinds = changes.column("_change_type").to_pylist()
    assert kinds.count("-D") == 1 and kinds.count("+U") == 2 and kinds.count("-U") == 2
    assert t.scan(columns=["id"], partitions=["us"]).to_arrow().column_names == ["id", "_change_type"]
    # Filters go to the nodes: the state by its key, the changelog by any column.
    above = t.snapshot(filter={"compare": {"column": "id", "op": ">=", "value": 8}}).to_pylist()
    assert sorted((r["region"], r["id"]) for r in above) == [("ap", 9), ("eu", 8), ("eu", 9)]
    big = t.scan(columns=["id"], filter={"compare": {"column": "score", "op": ">=", "value": 100}}).to_arrow()
    assert sorted(zip(big.column("id").to_pylist(), big.column("_change_type").to_pylist())) == [
        (1, "+U"),
        (2, "+U"),
    ]
    with pytest.raises(mink.InvalidArgument, match="primary-key columns only"):
        t.snapshot(filter={"compare": {"column": "score", "op": ">", "value": 1}}).to_arrow()


# -- bad input ------------------------------------------------------------------------


def test_bad_input_is_refused_before_anything_is_written(client):
    db = fresh_db(client, "bad")
    t = client.create_table(f"{db}.users", USERS, primary_key=["region", "id"], partition_keys=["region"])
    log = client.create_table(f"{db}.events", pa.schema([("id", pa.int64()), ("msg", pa.string())]), bucket_keys=["id"], buckets=2)
    w, lw = t.writer(), log.writer()
    cases = [
        (lambda: w.write(pd.DataFrame({"region": ["eu"], "id": ["seven"], "score": [1]})), mink.InvalidArgument, "column 'id'"),
        (lambda: w.write([{"region": None, "id": 1, "score": 1}]), mink.InvalidArgument, "region"),
        (lambda: t.upsert([{"region": "eu", "id": 1, "score": 1, "colour": "red"}]), mink.InvalidArgument, "colour"),
        (lambda: t.upsert([{"region": "eu", "id": 1}]), mink.InvalidArgument, "'score'.*NOT NULL"),
        (lambda: t.upsert([{"region": "bad name!", "id": 1, "score": 1}]), mink.InvalidArgument, "partition name"),
        (lambda: t.upsert([{"region": "eu", "id": 1, "score": 1}], columns=["score"]), mink.InvalidArgument, "primary key"),
        (lambda: w.write([{"region": "eu", "id": 1, "score": 1}], changes=["+X"]), mink.InvalidArgument, "changes"),
        (lambda: t.append([{"region": "eu", "id": 1, "score": 1}]), mink.InvalidArgument, "primary key"),
        (lambda: lw.write(pl.DataFrame({"id": [None, 2], "msg": ["a", "b"]})), mink.InvalidArgument, "bucket key 'id'.*row 0"),
        (lambda: log.append(pd.DataFrame({"id": [2**70], "msg": ["a"]})), mink.InvalidArgument, "column 'id'"),
        (lambda: log.append(object()), mink.InvalidArgument, "cannot write a object"),
        (lambda: lw.write([{"id": 1, "msg": "x" * (17 << 20)}]), mink.LimitExceeded, "limit"),
        (lambda: t.lookup([("eu",)]), mink.InvalidArgument, "key"),
        (lambda: log.scan(columns=["nope"]), mink.InvalidArgument, "nope"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
    assert t.scan().to_arrow().num_rows == 0 and t.partition_names() == []
    assert log.scan().to_arrow().num_rows == 0
    # The writers are still usable: a refused batch left their sequences free.
    w.write([{"region": "eu", "id": 1, "score": 1}])
    lw.write([{"id": 1, "msg": "ok"}])
    assert log.scan().to_pylist() == [{"id": 1, "msg": "ok"}]


# -- typed errors from the server -----------------------------------------------------


def test_server_errors_arrive_typed_with_their_context(client, node):
    db = fresh_db(client, "errs")
    log = client.create_table(f"{db}.events", pa.schema([("id", pa.int64())]), buckets=1)
    log.append([{"id": 1}])
    writer_id = client.action("init_writer")["writer_id"]
    command = {"Append": {"bucket": {"table_id": log.id, "partition_id": None, "bucket": 0}, "schema_id": 1, "writer_id": writer_id}}
    batch = pa.record_batch([pa.array([5], pa.int64())], names=["id"])
    log._do_put(command, batch, {"batch_sequence": 0}, None)
    with pytest.raises(mink.OutOfOrderSequence) as gap:
        log._do_put(command, batch, {"batch_sequence": 5}, None)
    assert gap.value.writer_id == writer_id and gap.value.sequence == 5 and gap.value.expected == 1
    with pytest.raises(mink.SchemaMismatch):
        log._do_put({"AppendTable": {"path": log.path, "schema_id": 9}}, batch, None, None)
    with pytest.raises(mink.OffsetOutOfRange) as beyond:
        for _ in log.tail(from_={0: 1000}, stop_after=10):
            pass
    assert beyond.value.offset == 1000 and beyond.value.high_watermark == 2
    with pytest.raises(mink.Unimplemented, match="sql"):
        client.sql("SELECT 1")
    with pytest.raises(mink.InvalidArgument) as invalid:
        client.action("create_database", {"name": "no spaces"})
    assert invalid.value.field == "database name" or "name" in invalid.value.field
    with pytest.raises(mink.Unavailable):
        mink.connect("grpc://127.0.0.1:9", timeout=5).databases()


# -- tail -----------------------------------------------------------------------------


def test_tail_follows_every_bucket_and_new_partitions_and_resumes(client):
    db = fresh_db(client, "tail")
    schema = pa.schema([pa.field("day", pa.string(), False), pa.field("id", pa.int64())])
    t = client.create_table(f"{db}.clicks", schema, partition_keys=["day"], bucket_keys=["id"], buckets=3)
    t.append([{"day": "d1", "id": i} for i in range(5)])  # before the tail: not seen from latest
    tail = t.tail(from_="latest", max_rows=40, stop_after=60)
    got = []

    def write_later():
        time.sleep(0.5)
        t.append([{"day": "d1", "id": i} for i in range(100, 120)])
        t.append([{"day": "d2", "id": i} for i in range(200, 220)])  # a new partition

    writer = threading.Thread(target=write_later)
    writer.start()
    for b in tail:
        got += b.to_pylist()
        assert b.partition in ("d1", "d2")
    writer.join()
    assert sorted(r["id"] for r in got) == list(range(100, 120)) + list(range(200, 220))
    # Resuming from the positions reads only what came after.
    positions = dict(tail.positions)
    t.append([{"day": "d2", "id": 999}])
    again = [r for b in t.tail(from_=positions, max_rows=1, stop_after=30) for r in b.to_pylist()]
    assert again == [{"day": "d2", "id": 999}]
    # The asyncio variant.

    async def first_rows():
        out = []
        async for b in t.tail(from_="earliest", partitions=["d1"], max_rows=25, stop_after=30):
            out += b.to_pylist()
        return out

    assert sorted(r["id"] for r in asyncio.run(first_rows())) == list(range(5)) + list(range(100, 120))
    # Idle: stops when nothing comes.
    assert list(t.tail(from_="latest", idle_timeout=0.5)) == []


def test_a_writer_spreads_rows_over_buckets_a_topic_grew(client, node, monkeypatch):
    """A round-robin table that grows buckets (a Kafka topic given partitions by
    CreatePartitions) is written across all of them once the Writer's routing is
    older than its maximum age, without a new Writer; every row lands once."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    import mink.writer

    monkeypatch.setattr(mink.writer, "ROUTING_MAX_AGE_S", 0.3)
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30_000)
    try:
        admin.create_topics([NewTopic("grown", num_partitions=1, replication_factor=1)])
        t = client.table("kafka.grown")
        assert t.bucket_count == 1
        w = t.writer()
        schema = t.arrow_schema

        def rows(start, n):
            cols = {f.name: pa.nulls(n, f.type) for f in schema}
            cols["value"] = pa.array([b"%d" % i for i in range(start, start + n)], schema.field("value").type)
            cols["timestamp"] = pa.array([1_700_000_000_000] * n, pa.int64()).cast(schema.field("timestamp").type)
            return pa.table(cols, schema=schema)

        before = w.write(rows(0, 10))
        assert {p.bucket for p in before} == {0}
        admin.create_partitions({"grown": 3})
        wait_for(lambda: client.table("kafka.grown").bucket_count == 3, timeout=30)
        time.sleep(0.4)  # the Writer's routing is now older than its maximum age
        landed = set()
        written = 10
        deadline = time.monotonic() + 30
        while landed != {0, 1, 2}:
            assert time.monotonic() < deadline, landed
            landed |= {p.bucket for p in w.write(rows(written, 30))}
            written += 30
        w.close()
        got = sorted(int(v) for v in t.refresh().scan().to_arrow().column("value").to_pylist())
        assert got == list(range(written))
    finally:
        admin.close()


# -- SQL ------------------------------------------------------------------------------


def test_sql_through_mink_query(node, mink_query, tmp_path):
    q = QueryProcess(mink_query, tmp_path, [f"127.0.0.1:{node.flight_port}"])
    try:
        c = mink.connect(node.location, sql=q.uri)
        db = fresh_db(c, "sqldb")
        t = c.create_table(f"{db}.events", pa.schema([("id", pa.int64()), ("msg", pa.string())]))
        t.append([{"id": i, "msg": "m"} for i in range(10)])
        got = c.sql(f"SELECT count(*) AS n, sum(id) AS s FROM {db}.events").to_pylist()
        assert got == [{"n": 10, "s": 45}]
        with pytest.raises(mink.MinkError, match="nope"):
            c.sql(f"SELECT * FROM {db}.nope")
        c.close()
    finally:
        q.kill()


# -- a leader killed under the Writer -------------------------------------------------


def test_the_writer_loses_and_duplicates_nothing_across_a_leader_kill(mink_node, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    nodes = [
        NodeProcess(
            mink_node,
            tmp_path,
            {"MINK_NODE_ID": f"n{i}", "MINK_DATA_DIR": str(tmp_path / f"n{i}"), "MINK_OBJECT_STORE__URL": f"file://{shared}"},
        )
        for i in range(3)
    ]
    try:
        c = mink.connect(nodes[0].location)
        c.create_database("db")
        t = c.create_table("db.events", pa.schema([("id", pa.int64()), ("w", pa.int32())]), bucket_keys=["id"], buckets=6)
        spread = wait_for(
            lambda: (lambda leaders: leaders if len(set(leaders)) == 3 else None)(
                [b["leader"] for b in c.action("metadata", {"path": "db.events"})["buckets"]]
            ),
            timeout=30,
            what="buckets on all three nodes",
        )
        assert spread
        # A node answers NotLeader for a bucket it does not lead, with the leader.
        meta = c.action("metadata", {"path": "db.events"})
        b0 = meta["buckets"][0]
        other = next(n for n in nodes if f"127.0.0.1:{n.flight_port}" != b0["leader_address"])
        wid = c.action("init_writer")["writer_id"]
        with pytest.raises(mink.NotLeader) as redirect:
            t._do_put(
                {"Append": {"bucket": b0["bucket"], "schema_id": 1, "writer_id": wid}},
                pa.record_batch([pa.array([0], pa.int64()), pa.array([0], pa.int32())], names=["id", "w"]),
                {"batch_sequence": 0},
                other.location,
            )
        assert redirect.value.leader == b0["leader_address"] and redirect.value.bucket == b0["bucket"]

        # Writers run while the node that is not the bootstrap (n1) is killed.
        acked: list[int] = []
        errors: list[Exception] = []
        w = t.writer()
        stop = threading.Event()

        def run(k):
            i = 0
            while not stop.is_set():
                ids = [k * 1_000_000 + i * 10 + j for j in range(10)]
                try:
                    w.write(pa.table({"id": pa.array(ids, pa.int64()), "w": pa.array([k] * 10, pa.int32())}))
                    acked.extend(ids)
                except mink.MinkError as e:
                    errors.append(e)
                i += 1

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        wait_for(lambda: len(acked) > 200, timeout=60, what="writes before the kill")
        nodes[1].kill()
        before = len(acked)
        wait_for(lambda: len(acked) > before + 400, timeout=90, what="writes after the buckets moved")
        stop.set()
        for th in threads:
            th.join()
        w.close()
        rows = t.scan().to_arrow().column("id").to_pylist()
        print(f"acknowledged {len(acked)} rows, {len(errors)} writes failed, {len(rows)} rows in the table")
        assert len(rows) == len(set(rows)), "no row written twice"
        assert set(acked) <= set(rows), "every acknowledged row is there"
        # A write that failed may or may not be in the log; nothing else is.
        assert not errors or all(e.retriable or isinstance(e, mink.Internal) for e in errors)
        c.close()
    finally:
        for n in nodes:
            n.kill()


# -- packaging ------------------------------------------------------------------------


def test_the_type_hints_check_with_mypy():
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "src/mink"], cwd=CLIENT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_wheel_builds_and_installs_into_a_fresh_venv(node, tmp_path):
    dist = tmp_path / "dist"
    # Built from a copy, so that the build leaves nothing in the source tree.
    source = tmp_path / "source"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".mypy_cache"))
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [wheel] = list(dist.glob("mink_client-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    script = (
        "import mink, pyarrow as pa\n"
        f"c = mink.connect({node.location!r})\n"
        "c.create_database('wheel')\n"
        "t = c.create_table('wheel.t', pa.schema([('id', pa.int64())]))\n"
        "t.writer().write([{'id': 42}])\n"
        "print(t.scan().to_pylist(), mink.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "[{'id': 42}]" in out.stdout and str(venv) in out.stdout


def test_a_table_write_whose_call_failed_is_an_unknown_outcome_not_a_refusal():
    """A table write carries no writer id: a node's refusal, or a connection never made,
    wrote nothing, but a call that failed after it was sent may have written the rows,
    and the client says so (as the Rust client and a forwarding node do)."""
    from mink.table import table_write_error

    refusal = mink.Unavailable("unavailable: table 1 bucket 0: the bucket is opening; retry")
    assert table_write_error(refusal) is refusal
    not_sent = mink.Unavailable(
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: "
        "Failed to connect to remote host: Connection refused"
    )
    assert table_write_error(not_sent) is not_sent
    for lost in ("Socket closed", "Deadline Exceeded", "the node closed the write without an answer"):
        e = table_write_error(mink.Unavailable(lost))
        assert isinstance(e, mink.StorageFailure), e
        assert "outcome is unknown" in e.message and lost in e.message
        assert str(e).startswith("storage failure: ")
