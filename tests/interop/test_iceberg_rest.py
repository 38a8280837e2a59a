"""The Iceberg REST catalog every node serves, used by engines we did not write:
pyiceberg's RestCatalog and DuckDB's iceberg extension (ATTACH ... TYPE iceberg) find
Mink's lake tables by name and read exactly what Mink's own Lake read returns, on
file:// and on the local S3 server; the catalog follows the tiering rounds; and
everything that would write is refused as the specification says, changing nothing."""

import json
import re
import urllib.error
import urllib.request

import pyarrow as pa
import pyarrow.parquet
import pyarrow.flight as flight
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from node_proc import NodeProcess, retry
from test_lake import action, append_table, duckdb_connection, read, tiered

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())])
COLUMNS = [{"name": "id", "type": "BIGINT", "nullable": False}, {"name": "msg", "type": "STRING"}]


def batch(ids):
    return pa.record_batch({"id": list(ids), "msg": [f"m{i}" for i in ids]}, schema=SCHEMA)


def create(client, path, lake=True):
    properties = {"lake": {"enabled": True, "freshness": "1s"}} if lake else {}
    descriptor = {
        "schema": {"columns": COLUMNS},
        "bucket_keys": ["id"],
        "bucket_count": 2,
        "properties": properties,
    }
    action(client, "create_table", {"path": path, "descriptor": descriptor})


def http(method, url, body=None, headers=None):
    """(status, headers, parsed JSON body or None) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            raw = r.read()
            return r.status, dict(r.headers), json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, dict(e.headers), json.loads(raw) if raw else None


@pytest.fixture(params=["file", "s3"])
def catalog_node(request, mink_node, tmp_path):
    s3 = request.getfixturevalue("s3_url") if request.param == "s3" else None
    env = dict(s3) if s3 else {"MINK_OBJECT_STORE__URL": f"file://{tmp_path}/objects"}
    env["MINK_LAKE__CHECK_INTERVAL_MS"] = "100"
    # A bucket's third round merges its two older files (compaction).
    env["MINK_LAKE__COMPACT_FILES_MIN"] = "2"
    if s3:
        # The S3 node hands its keys to the engines (the file:// node has none).
        env["MINK_ICEBERG_REST__VEND_CREDENTIALS"] = "true"
    proc = NodeProcess(mink_node, tmp_path, env)
    client = flight.connect(proc.location)
    yield proc, client, s3
    client.close()
    proc.kill()


def test_engines_find_the_lake_tables_by_name_and_read_what_mink_reads(catalog_node):
    proc, client, s3 = catalog_node
    action(client, "create_database", {"name": "db"})
    action(client, "create_database", {"name": "empty"})
    create(client, "db.events")
    create(client, "db.orders.v1")
    create(client, "db.plain", lake=False)
    for path in ("db.events", "db.orders.v1", "db.plain"):
        retry(lambda path=path: append_table(client, path, batch(range(0, 50))))
    tiered(client, "db.events", 50)
    tiered(client, "db.orders.v1", 50)

    catalog = RestCatalog("mink", uri=proc.iceberg_rest)
    assert sorted(catalog.list_namespaces()) == [("db",), ("empty",)]
    # Only lake-enabled tables are Iceberg tables.
    assert sorted(catalog.list_tables("db")) == [("db", "events"), ("db", "orders.v1")]
    assert catalog.list_tables("empty") == []
    assert catalog.namespace_exists("db") and not catalog.namespace_exists("nope")
    assert catalog.table_exists(("db", "orders.v1"))
    assert not catalog.table_exists(("db", "plain")), "lake.enabled is off"
    assert not catalog.table_exists(("db", "missing"))
    with pytest.raises(NoSuchTableError):
        catalog.load_table(("db", "plain"))
    with pytest.raises(NoSuchNamespaceError):
        catalog.list_tables("nope")

    mink = read(client, {"Lake": {"path": "db.orders.v1"}}).sort_by("id")
    table = catalog.load_table(("db", "orders.v1"))
    theirs = table.scan().to_arrow().sort_by("id")
    assert theirs.column("id").to_pylist() == mink.column("id").to_pylist() == list(range(50))
    assert theirs.column("msg").to_pylist() == mink.column("msg").to_pylist()

    # DuckDB attaches the catalog and reads by SQL name (the S3 node's keys are vended).
    con = duckdb_connection()
    con.execute(f"ATTACH 'mink' AS lake (TYPE iceberg, ENDPOINT '{proc.iceberg_rest}', AUTHORIZATION_TYPE 'none')")
    assert con.execute('SELECT count(*), sum(id) FROM lake.db."orders.v1"').fetchall() == [(50, sum(range(50)))]
    assert con.execute("SELECT count(*) FROM lake.db.events WHERE msg = 'm7'").fetchall() == [(1,)]

    # The catalog follows the rounds: no location to re-point by hand.
    before = table.metadata_location
    append_table(client, "db.orders.v1", batch(range(50, 80)))
    tiered(client, "db.orders.v1", 80)
    again = catalog.load_table(("db", "orders.v1"))
    assert again.metadata_location != before
    assert again.scan().to_arrow().num_rows == 80
    assert con.execute('SELECT count(*) FROM lake.db."orders.v1"').fetchall() == [(80,)]

    # A third round compacts each bucket's two older files into one: its rows as an
    # `append` snapshot, then the merge as a `replace` snapshot on top, in one
    # metadata version; both engines still read every row once.
    append_table(client, "db.orders.v1", batch(range(80, 100)))
    tiered(client, "db.orders.v1", 100)
    compacted = catalog.load_table(("db", "orders.v1"))
    current = compacted.current_snapshot()
    assert current.summary.operation.value == "replace", current.summary
    assert int(current.summary["deleted-data-files"]) >= 2, current.summary
    assert current.summary["deleted-records"] == current.summary["added-records"]
    parent = compacted.snapshot_by_id(current.parent_snapshot_id)
    assert parent.summary.operation.value == "append", parent.summary
    ids = compacted.scan().to_arrow().column("id").to_pylist()
    assert sorted(ids) == list(range(100))
    got = con.execute('SELECT count(*), count(DISTINCT id), sum(id) FROM lake.db."orders.v1"').fetchall()
    assert got == [(100, 100, sum(range(100)))]

    # What the engines were told about the store: its keys only where vended.
    status, _, body = http("GET", f"{proc.iceberg_rest}/v1/namespaces/db/tables/events")
    assert status == 200
    if s3:
        assert body["config"]["s3.endpoint"] == s3["MINK_OBJECT_STORE__ENDPOINT"]
        assert body["config"]["s3.access-key-id"] == "test"
        assert body["storage-credentials"][0]["prefix"] == s3["MINK_OBJECT_STORE__URL"]
    else:
        assert body["config"] == {} and "storage-credentials" not in body


def test_the_catalog_refuses_writes_and_bad_requests_precisely(mink_node, s3_url, tmp_path):
    # The default node: credentials are not vended.
    proc = NodeProcess(mink_node, tmp_path, dict(s3_url, MINK_LAKE__CHECK_INTERVAL_MS="100"))
    client = flight.connect(proc.location)
    try:
        action(client, "create_database", {"name": "db"})
        create(client, "db.events")
        retry(lambda: append_table(client, "db.events", batch(range(10))))
        tiered(client, "db.events", 10)
        base = f"{proc.iceberg_rest}/v1"

        status, _, config = http("GET", f"{base.removesuffix('/v1')}/v1/config?warehouse=anything")
        assert status == 200 and config["defaults"] == {} and config["overrides"] == {}
        assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in config["endpoints"]
        assert not any(e.startswith(("POST /v1/{prefix}/namespaces ", "DELETE")) for e in config["endpoints"])

        status, headers, body = http("GET", f"{base}/namespaces/db/tables/events")
        assert status == 200
        assert body["metadata-location"].endswith(".metadata.json")
        assert body["metadata"]["format-version"] == 2
        assert "s3.access-key-id" not in body["config"] and "storage-credentials" not in body
        assert "test" not in json.dumps(body["config"]), "no secret is served unless vended"
        etag = headers["etag"]
        status, _, _ = http("GET", f"{base}/namespaces/db/tables/events", headers={"If-None-Match": etag})
        assert status == 304
        status, _, refs = http("GET", f"{base}/namespaces/db/tables/events?snapshots=refs")
        current = refs["metadata"]["current-snapshot-id"]
        assert [s["snapshot-id"] for s in refs["metadata"]["snapshots"]] == [current]

        # Everything that would write: 406, the spec's UnsupportedOperation, and no change.
        writes = [
            ("POST", "/namespaces", {"namespace": ["made"], "properties": {}}),
            ("DELETE", "/namespaces/db", None),
            ("POST", "/namespaces/db/properties", {"removals": [], "updates": {"a": "b"}}),
            ("POST", "/namespaces/db/tables", {"name": "t", "schema": {"type": "struct", "fields": []}}),
            ("POST", "/namespaces/db/register", {"name": "t", "metadata-location": "file:///x"}),
            ("POST", "/namespaces/db/tables/events", {"requirements": [], "updates": []}),
            ("DELETE", "/namespaces/db/tables/events", None),
            ("POST", "/tables/rename", {"source": {"namespace": ["db"], "name": "events"}, "destination": {"namespace": ["db"], "name": "e2"}}),
            ("POST", "/transactions/commit", {"table-changes": []}),
        ]
        for method, path, body in writes:
            status, _, error = http(method, base + path, body)
            assert status == 406, (method, path, status)
            assert error["error"]["type"] == "UnsupportedOperationException"
            assert error["error"]["code"] == 406 and "read-only" in error["error"]["message"]
        assert action(client, "list_databases") == ["db"]
        assert sorted(action(client, "list_tables", {"database": "db"})) == ["events"]
        assert read(client, {"Lake": {"path": "db.events"}}).num_rows == 10

        # Reads of what is not there, and malformed requests.
        missing = [
            ("/namespaces/nope", "NoSuchNamespaceException"),
            ("/namespaces/nope/tables", "NoSuchNamespaceException"),
            ("/namespaces/a%1Fb/tables", "NoSuchNamespaceException"),
            ("/namespaces/db/tables/missing", "NoSuchTableException"),
            ("/namespaces/db/tables/bad%20name", "NoSuchTableException"),
            ("/namespaces/db/views/v", "NoSuchViewException"),
            ("/nowhere", "NoSuchEndpointException"),
        ]
        for path, kind in missing:
            status, _, error = http("GET", base + path)
            assert (status, error["error"]["type"]) == (404, kind), path
        for path in ("/namespaces/nope", "/namespaces/db/tables/missing"):
            assert http("HEAD", base + path)[0] == 404
        assert http("HEAD", f"{base}/namespaces/db")[0] == 204
        assert http("HEAD", f"{base}/namespaces/db/tables/events")[0] == 204
        for query in ("pageSize=0", "pageSize=1001", "pageSize=x"):
            status, _, error = http("GET", f"{base}/namespaces?{query}")
            assert (status, error["error"]["type"]) == (400, "BadRequestException"), query
        status, _, error = http("GET", f"{base}/namespaces/db/tables/events?snapshots=some")
        assert status == 400
        assert http("GET", f"{base}/namespaces/db/views")[2] == {"identifiers": [], "next-page-token": None}
        # Metrics reports are taken (and dropped), for engines that send them.
        assert http("POST", f"{base}/namespaces/db/tables/events/metrics", {"report-type": "scan-report"})[0] == 204

        # Paging: every table once, a page at a time.
        for i in range(5):
            create(client, f"db.t{i}")
        seen, token = [], ""
        while token is not None:
            status, _, page = http("GET", f"{base}/namespaces/db/tables?pageSize=2&pageToken={token}")
            assert status == 200 and len(page["identifiers"]) <= 2
            seen += [i["name"] for i in page["identifiers"]]
            token = page["next-page-token"]
        assert seen == ["events", "t0", "t1", "t2", "t3", "t4"]
    finally:
        client.close()
        proc.kill()


def test_any_of_three_nodes_serves_the_catalog_across_a_schema_change(mink_node, tmp_path):
    """Three nodes on one store: each one's catalog lists and loads the same table;
    after a column is added and more rounds run (compacting files of both schemas),
    pyiceberg and DuckDB through any node read what Union reads."""
    shared = tmp_path / "shared"
    shared.mkdir()
    nodes = []
    try:
        for i in range(3):
            env = {
                "MINK_NODE_ID": f"n{i}",
                "MINK_DATA_DIR": str(tmp_path / f"n{i}"),
                "MINK_OBJECT_STORE__URL": f"file://{shared}",
                "MINK_LAKE__CHECK_INTERVAL_MS": "100",
                "MINK_LAKE__COMPACT_FILES_MIN": "2",
            }
            nodes.append(NodeProcess(mink_node, tmp_path, env))
        client = flight.connect(nodes[0].location)
        action(client, "create_database", {"name": "db"})
        create(client, "db.events")
        retry(lambda: append_table(client, "db.events", batch(range(0, 40))), timeout=30)
        tiered(client, "db.events", 40)
        action(client, "alter_table", {"path": "db.events", "add_columns": [{"name": "extra", "type": "BIGINT"}]})
        schema2 = SCHEMA.append(pa.field("extra", pa.int64()))
        for start in (40, 60, 80):
            ids = range(start, start + 20)
            rows2 = pa.record_batch(
                {"id": list(ids), "msg": [f"m{i}" for i in ids], "extra": [i * 10 for i in ids]}, schema=schema2
            )
            retry(lambda rows2=rows2: append_table(client, "db.events", rows2, schema_id=2), timeout=30)
            tiered(client, "db.events", start + 20)
        union = read(client, {"Union": {"path": "db.events"}}).sort_by("id")
        assert union.column("id").to_pylist() == list(range(100))
        want_extra = [None] * 40 + [i * 10 for i in range(40, 100)]
        assert union.column("extra").to_pylist() == want_extra

        locations = set()
        for node in nodes:
            catalog = RestCatalog("mink", uri=node.iceberg_rest)
            assert catalog.list_tables("db") == [("db", "events")]
            table = catalog.load_table(("db", "events"))
            locations.add(table.metadata_location)
            theirs = table.scan().to_arrow().sort_by("id")
            assert theirs.column("id").to_pylist() == list(range(100)), node.iceberg_rest
            assert theirs.column("extra").to_pylist() == want_extra
            ops = [s.summary.operation.value for s in table.snapshots()]
            assert "replace" in ops and set(ops) <= {"append", "replace"}, ops
            con = duckdb_connection()
            con.execute(f"ATTACH 'mink' AS lake (TYPE iceberg, ENDPOINT '{node.iceberg_rest}', AUTHORIZATION_TYPE 'none')")
            got = con.execute("SELECT count(*), count(DISTINCT id), count(extra), sum(extra) FROM lake.db.events").fetchall()
            assert got == [(100, 100, 60, sum(i * 10 for i in range(40, 100)))]
        assert len(locations) == 1, "every node serves the same newest version"
    finally:
        for n in nodes:
            n.kill()


def test_a_time_partition_prunes_in_the_engines(mink_node, tmp_path):
    """`lake.partition = day(at)`: the lake table is partitioned by Iceberg's day
    transform of a column that is not a Mink partition key. Rows of three days,
    written out of order, land in files of one day each; pyiceberg prunes a scan to
    the day asked for and DuckDB reads every row; the spec cannot change later."""
    import datetime

    proc = NodeProcess(
        mink_node,
        tmp_path,
        {"MINK_OBJECT_STORE__URL": f"file://{tmp_path}/objects", "MINK_LAKE__CHECK_INTERVAL_MS": "100"},
    )
    client = flight.connect(proc.location)
    try:
        action(client, "create_database", {"name": "db"})
        columns = COLUMNS + [{"name": "at", "type": "TIMESTAMP_LTZ(6)"}]
        descriptor = {
            "schema": {"columns": columns},
            "bucket_keys": ["id"],
            "bucket_count": 2,
            "properties": {"lake": {"enabled": True, "freshness": "1s", "partition": "day(at)"}},
        }
        action(client, "create_table", {"path": "db.clicks", "descriptor": descriptor})
        schema = SCHEMA.append(pa.field("at", pa.timestamp("us", tz="UTC")))
        base = datetime.datetime(2026, 12, 1, 12, tzinfo=datetime.timezone.utc)
        days = [(i * 7) % 3 for i in range(60)]  # 0, 1, 2, 0, 1, 2, ...: out of order
        rows = pa.record_batch(
            {
                "id": list(range(60)),
                "msg": [f"m{i}" for i in range(60)],
                "at": [base + datetime.timedelta(days=d, seconds=i) for i, d in enumerate(days)],
            },
            schema=schema,
        )
        retry(lambda: append_table(client, "db.clicks", rows))
        tiered(client, "db.clicks", 60)

        table = RestCatalog("mink", uri=proc.iceberg_rest).load_table(("db", "clicks"))
        [field] = table.spec().fields
        assert (field.name, str(field.transform)) == ("at_day", "day")
        assert table.scan().to_arrow().num_rows == 60
        tasks = list(table.scan().plan_files())
        # Each file holds one day (runs of one value: many small files here).
        for task in tasks:
            ats = pa.parquet.read_table(task.file.file_path.removeprefix("file://")).column("at")
            assert len({t.as_py().date() for t in ats}) == 1, task.file.file_path
        day3 = "at >= '2026-12-03T00:00:00+00:00'"
        pruned = list(table.scan(row_filter=day3).plan_files())
        assert 0 < len(pruned) < len(tasks), "pyiceberg prunes by the day transform"
        got = table.scan(row_filter=day3).to_arrow().column("id").to_pylist()
        assert sorted(got) == [i for i in range(60) if days[i] == 2]

        con = duckdb_connection()
        con.execute(f"ATTACH 'mink' AS lake (TYPE iceberg, ENDPOINT '{proc.iceberg_rest}', AUTHORIZATION_TYPE 'none')")
        query = """SELECT count(*) FROM lake.db.clicks WHERE "at" >= TIMESTAMPTZ '2026-12-03 00:00:00+00'"""
        assert con.execute(query).fetchall() == [(20,)]
        plan = "\n".join(row[1] for row in con.execute("EXPLAIN ANALYZE " + query).fetchall())
        [read] = re.findall(r"Total Files Read: (\d+)", plan)
        assert 0 < int(read) < len(tasks), f"DuckDB prunes by the day transform: {plan}"

        with pytest.raises(pa.ArrowException, match="lake.partition"):
            action(client, "alter_table", {"path": "db.clicks", "set_properties": {"lake.partition": "hour(at)"}})
    finally:
        client.close()
        proc.kill()
