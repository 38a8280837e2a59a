"""mink-query, the Flight SQL door, through clients we did not write: the ADBC Flight
SQL driver (its DB-API) and Polars on top of it. Against one node and against three:
every answer is checked against what the node's own Flight reads return, and each
pushdown against the same query without it (and in EXPLAIN, for the request it makes).
"""

import json
import threading
import time

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from confluent_kafka import Producer

from node_proc import NodeProcess, QueryProcess, retry, wait_for
from test_flight import EVENTS, SCHEMA, USER_SCHEMA, USERS, action, append_table, metric, put_table


def connect(q):
    return flightsql.connect(q.uri, autocommit=True)


def sql(conn, query, parameters=None):
    with conn.cursor() as cur:
        cur.execute(query, parameters)
        return cur.fetch_arrow_table()


def explain(conn, query):
    plan = sql(conn, "EXPLAIN " + query).to_pylist()
    return "\n".join(r["plan"] for r in plan)


def events_batch(ids):
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"m{i % 5}" for i in ids])], schema=SCHEMA)


def users_batch(rows):
    ids, names, scores = zip(*rows)
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array(names), pa.array(scores, pa.int64())], schema=USER_SCHEMA
    )


def delete_users(client, ids):
    batch = users_batch([(i, None, None) for i in ids])
    return put_table(client, batch, meta={"changes": ["-D"] * len(ids)})


@pytest.fixture()
def single(mink_node, mink_query, tmp_path):
    node = NodeProcess(mink_node, tmp_path, {"MINK_LAKE__CHECK_INTERVAL_MS": "100"})
    client = flight.connect(node.location)
    q = QueryProcess(mink_query, tmp_path, [f"127.0.0.1:{node.flight_port}"])
    try:
        yield node, client, q
    finally:
        client.close()
        q.kill()
        node.kill()


def load_events_and_users(client):
    action(client, "create_database", {"name": "db"})
    action(client, "create_table", {"path": "db.events", "descriptor": EVENTS})
    action(client, "create_table", {"path": "db.users", "descriptor": USERS})
    for start in range(0, 300, 100):
        retry(lambda: append_table(client, "db.events", events_batch(list(range(start, start + 100)))))
    retry(lambda: put_table(client, users_batch([(i, f"u{i}", i * 10) for i in range(1, 11)])))
    # Updates and deletes after the first image.
    put_table(client, users_batch([(2, "two", 200), (3, "three", 300)]))
    delete_users(client, [4, 5])


def test_queries_over_log_and_primary_key_tables(single):
    node, client, q = single
    load_events_and_users(client)
    with connect(q) as conn:
        # Aggregates over every bucket of the log table.
        t = sql(conn, "SELECT count(*) AS n, sum(id) AS s, min(id) AS lo, max(id) AS hi FROM db.events")
        assert t.to_pylist() == [{"n": 300, "s": sum(range(300)), "lo": 0, "hi": 299}]
        # GROUP BY, ORDER BY, a filter.
        t = sql(conn, "SELECT msg, count(*) AS n FROM db.events WHERE id >= 100 GROUP BY msg ORDER BY msg")
        assert t.to_pylist() == [{"msg": f"m{i}", "n": 40} for i in range(5)]
        # LIMIT with ORDER BY.
        t = sql(conn, "SELECT id FROM db.events ORDER BY id DESC LIMIT 3")
        assert t.column("id").to_pylist() == [299, 298, 297]

        # The primary-key table reads as its state: updates applied, deletes gone.
        state = sql(conn, "SELECT id, name, score FROM db.users ORDER BY id").to_pylist()
        expected = [
            {"id": i, "name": {2: "two", 3: "three"}.get(i, f"u{i}"), "score": {2: 200, 3: 300}.get(i, i * 10)}
            for i in range(1, 11)
            if i not in (4, 5)
        ]
        assert state == expected
        assert "read=state" in explain(conn, "SELECT * FROM db.users")

        # A point query is a lookup, never a scan, and answers as the scan does.
        for where in ["id = 2", "id IN (3, 4, 99)", "id = 5"]:
            plan = explain(conn, f"SELECT * FROM db.users WHERE {where}")
            assert "read=lookup" in plan, plan
            looked = sql(conn, f"SELECT id, name FROM db.users WHERE {where} ORDER BY id").to_pylist()
            # `id + 0` cannot be pushed: the same question answered by a state scan.
            scanned_where = where.replace("id", "id + 0", 1)
            assert "read=state" in explain(conn, f"SELECT * FROM db.users WHERE {scanned_where}")
            scanned = sql(conn, f"SELECT id, name FROM db.users WHERE {scanned_where} ORDER BY id").to_pylist()
            assert looked == scanned
        assert sql(conn, "SELECT name FROM db.users WHERE id = 2").to_pylist() == [{"name": "two"}]
        assert sql(conn, "SELECT name FROM db.users WHERE id = 4").num_rows == 0

        # A join of the log table with the primary-key table.
        t = sql(
            conn,
            "SELECT u.name, count(*) AS n FROM db.events e JOIN db.users u ON e.id = u.id "
            "GROUP BY u.name ORDER BY u.name",
        )
        names = sorted(r["name"] for r in expected)
        assert t.to_pylist() == [{"name": n, "n": 1} for n in names]

        # A prepared statement with a parameter (the ADBC driver prepares everything).
        assert sql(conn, "SELECT name FROM db.users WHERE id = $1", (3,)).to_pylist() == [{"name": "three"}]
        assert sql(conn, "SELECT count(*) AS n FROM db.events WHERE id < $1", (10,)).to_pylist() == [{"n": 10}]

        # The changelog: every change with its type, offset and commit time.
        ch = sql(
            conn,
            'SELECT id, _change_type, _log_offset, _commit_timestamp FROM db."users$changelog" '
            "WHERE id IN (2, 4) ORDER BY _log_offset",
        ).to_pylist()
        assert [(r["id"], r["_change_type"]) for r in ch] == [(2, "+I"), (4, "+I"), (2, "-U"), (2, "+U"), (4, "-D")]
        assert all(r["_commit_timestamp"] is not None for r in ch)
        assert [r["_log_offset"] for r in ch] == sorted(r["_log_offset"] for r in ch)

        # Equality on the bucket key reads only the bucket the rows were routed to.
        plan = explain(conn, "SELECT * FROM db.events WHERE id IN (7, 8)")
        assert "pruned to bucket" in plan, plan
        pruned = sql(conn, "SELECT id, msg FROM db.events WHERE id IN (7, 8) ORDER BY id").to_pylist()
        assert pruned == sql(conn, "SELECT id, msg FROM db.events WHERE id + 0 IN (7, 8) ORDER BY id").to_pylist()
        assert [r["id"] for r in pruned] == [7, 8]

        # LIMIT without a filter reads only the first rows of each bucket.
        plan = explain(conn, "SELECT * FROM db.events LIMIT 5")
        assert "limit_scan=5" in plan, plan
        assert sql(conn, "SELECT * FROM db.events LIMIT 5").num_rows == 5

        # Polars through the same driver.
        df = pl.read_database("SELECT id, name FROM db.users WHERE id <= 3 ORDER BY id", connection=conn)
        assert df["name"].to_list() == ["u1", "two", "three"]


def test_only_the_columns_a_query_needs_cross_from_the_nodes(single):
    """Projection pushdown: the read asks the nodes for the columns the plan needs (a
    state merge adds the key; a count none), EXPLAIN shows them, and every answer is
    the one computed from a read of every column."""
    node, client, q = single
    load_events_and_users(client)
    with connect(q) as conn:
        events = sql(conn, "SELECT * FROM db.events").to_pylist()
        users = sql(conn, "SELECT * FROM db.users").to_pylist()
        changes = sql(conn, 'SELECT * FROM db."users$changelog"').to_pylist()
        assert len(events) == 300 and len(users) == 8
        cases = [
            (
                "SELECT msg FROM db.events WHERE id >= 250 ORDER BY id",
                "columns=[id, msg]",
                [{"msg": r["msg"]} for r in sorted(events, key=lambda r: r["id"]) if r["id"] >= 250],
            ),
            ('SELECT count(*) AS n FROM db."users$changelog"', "columns=[]", [{"n": len(changes)}]),
            (
                "SELECT name FROM db.users ORDER BY name",
                "columns=[id, name]",
                [{"name": n} for n in sorted(r["name"] for r in users)],
            ),
            (
                "SELECT score FROM db.users WHERE score > 50 ORDER BY score",
                "columns=[id, score]",
                [{"score": v} for v in sorted(r["score"] for r in users if r["score"] > 50)],
            ),
            (
                # Offsets are per bucket: ordered by every column selected.
                'SELECT _log_offset, _change_type, name FROM db."users$changelog" '
                "ORDER BY _log_offset, _change_type, name",
                "columns=[name]",
                sorted(
                    (
                        {"_log_offset": r["_log_offset"], "_change_type": r["_change_type"], "name": r["name"]}
                        for r in changes
                    ),
                    key=lambda r: (r["_log_offset"], r["_change_type"], r["name"] or ""),
                ),
            ),
        ]
        for query, pushed, want in cases:
            plan = explain(conn, query)
            assert pushed in plan, (query, plan)
            assert sql(conn, query).to_pylist() == want, query


def test_filters_are_applied_on_the_nodes_and_change_no_answer(single, mink_query, tmp_path):
    """Filter pushdown: the predicates a node can evaluate travel with the read
    (EXPLAIN shows them; the rows they leave out stay on the node, as its metrics
    count), and every answer is the one a mink-query that sends no filter gives. A
    primary-key table's state takes filters on its key alone (a row's values may change
    after its snapshot); a `$changelog` none."""
    node, client, q = single
    load_events_and_users(client)
    plain = QueryProcess(mink_query, tmp_path, [f"127.0.0.1:{node.flight_port}"], {"MINK_QUERY_QUERY__FILTER_PUSHDOWN": "false"})
    try:
        wait_for(lambda: plain.port, timeout=30, what="the second mink-query")
        cases = [
            ("SELECT id, msg FROM db.events WHERE id >= 250 AND msg LIKE 'm1%' ORDER BY id", "filter=[id >= 250"),
            ("SELECT id FROM db.events WHERE msg IN ('m1', 'm3') OR id BETWEEN 10 AND 12 ORDER BY id", "filter=["),
            ("SELECT count(*) AS n FROM db.events WHERE NOT (id < 100 OR msg = 'm0')", "filter=["),
            ("SELECT count(*) AS n FROM db.events WHERE msg IS NULL", "filter=[msg IS NULL]"),
            # `id + 1` cannot be said; `msg != 'm2'` can, and goes alone.
            ("SELECT id FROM db.events WHERE id % 7 = 3 AND msg != 'm2' ORDER BY id", "filter=[msg != \"m2\"]"),
            # A key range of a state merge.
            ("SELECT id, name, score FROM db.users WHERE id > 3 ORDER BY id", "filter=[id > 3]"),
            # A value of a state stays with DataFusion: user 2 scored 20, then 200.
            ("SELECT id, score FROM db.users WHERE score > 50 ORDER BY id", None),
            ('SELECT _change_type, id FROM db."users$changelog" WHERE id = 2 ORDER BY _log_offset', None),
        ]
        with connect(q) as conn, connect(plain) as without:
            for query, pushed in cases:
                plan = explain(conn, query)
                if pushed is None:
                    assert "filter=[" not in plan, (query, plan)
                else:
                    assert pushed in plan, (query, plan)
                assert "filter=[" not in explain(without, query), query
                before = metric(node, "mink_flight_read_filtered_rows_total")
                got = sql(conn, query).to_pylist()
                left_out = metric(node, "mink_flight_read_filtered_rows_total") - before
                assert got == sql(without, query).to_pylist(), query
                assert (left_out > 0) == (pushed is not None), (query, left_out)
            assert sql(conn, "SELECT id FROM db.users WHERE id > 3 ORDER BY id").column("id").to_pylist() == [6, 7, 8, 9, 10]
            # A parameter is a literal by the time the read is planned.
            assert sql(conn, "SELECT count(*) AS n FROM db.events WHERE id < ?", (7,)).to_pylist() == [{"n": 7}]
    finally:
        plain.kill()


def test_reads_tell_the_planner_their_rows_and_joins_build_on_the_smaller_side(single):
    """Statistics: each read says about how many rows it yields (a bucket's log up to
    the cut; a lookup its keys), EXPLAIN shows it, and DataFusion builds a join's hash
    table on the smaller input whichever way the query is written."""
    node, client, q = single
    load_events_and_users(client)
    with connect(q) as conn:

        def physical(query):
            rows = sql(conn, "EXPLAIN " + query).to_pylist()
            return "\n".join(r["plan"] for r in rows if r["plan_type"] == "physical_plan")

        assert "rows~300" in physical("SELECT * FROM db.events")
        assert "rows~2" in physical("SELECT * FROM db.users WHERE id IN (2, 3)")
        # A log table's count is exact: `count(*)` reads nothing. A primary-key
        # table's is not (its log holds changes): it is counted.
        assert "MinkReadExec" not in physical("SELECT count(*) AS n FROM db.events")
        assert sql(conn, "SELECT count(*) AS n FROM db.events").to_pylist() == [{"n": 300}]
        assert "MinkReadExec" in physical("SELECT count(*) AS n FROM db.users")
        assert sql(conn, "SELECT count(*) AS n FROM db.users").to_pylist() == [{"n": 8}]
        for query in [
            "SELECT u.name, e.msg FROM db.events e JOIN db.users u ON e.id = u.id",
            "SELECT u.name, e.msg FROM db.users u JOIN db.events e ON e.id = u.id",
        ]:
            plan = physical(query)
            join = plan.index("HashJoinExec")
            build, probe = plan.index("table=db.users", join), plan.index("table=db.events", join)
            assert build < probe, plan
            assert len(sql(conn, query)) == 8


def test_positional_parameters_bind_as_drivers_send_them(single):
    """`?` parameters, as the ADBC DB-API (paramstyle qmark), JDBC and SQLAlchemy's
    Flight SQL dialect send them, bind by position in the order they are written;
    `$n` still binds; a statement mixing both is refused, naming why."""
    import sqlalchemy

    node, client, q = single
    load_events_and_users(client)
    assert flightsql.paramstyle == "qmark"
    with connect(q) as conn:
        assert sql(conn, "SELECT name FROM db.users WHERE id = ?", (3,)).to_pylist() == [{"name": "three"}]
        t = sql(conn, "SELECT count(*) AS n FROM db.events WHERE id >= ? AND id < ? AND msg = ?", (10, 20, "m1"))
        assert t.to_pylist() == [{"n": 2}]  # 11 and 16
        # In the select list, a subquery and LIMIT: numbered as written.
        t = sql(
            conn,
            "SELECT ? AS tag, id FROM (SELECT id FROM db.events WHERE id < ?) s ORDER BY id LIMIT ?",
            ("x", 5, 2),
        )
        assert t.to_pylist() == [{"tag": "x", "id": 0}, {"tag": "x", "id": 1}]
        # A key equality through `?` is still a point lookup, answered as before.
        assert sql(conn, "SELECT name FROM db.users WHERE id IN (?, ?) ORDER BY id", (2, 4)).to_pylist() == [
            {"name": "two"}
        ]
        with pytest.raises(adbc_driver_manager.Error, match="mixes"):
            sql(conn, "SELECT id FROM db.events WHERE id = ? OR id = $1", (1,))
        # Polars passes its parameters to the same driver.
        df = pl.read_database(
            "SELECT id, name FROM db.users WHERE id <= ? ORDER BY id",
            connection=conn,
            execute_options={"parameters": (3,)},
        )
        assert df["name"].to_list() == ["u1", "two", "three"]
    # SQLAlchemy through flightsql-dbapi's dialect (`datafusion://`, the path Superset
    # takes) with its prepared statements on: `:id` is compiled to `?`, and the client
    # executes the handle it prepared, not the bound one (an older protocol's habit).
    # (With them off, the dialect renders text() binds as NULL literals itself.)
    engine = sqlalchemy.create_engine(
        f"datafusion://127.0.0.1:{q.port}?insecure=true&feature-sqlalchemy-prepared-statements=on"
    )
    try:
        with engine.connect() as c:
            query = sqlalchemy.text("SELECT name, score FROM db.users WHERE id = :id OR name = :name ORDER BY id")
            rows = c.execute(query, {"id": 3, "name": "u7"}).fetchall()
            assert [tuple(r) for r in rows] == [("three", 300), ("u7", 70)]
            # Bound again on the same statement: the new values.
            rows = c.execute(query, {"id": 2, "name": "u9"}).fetchall()
            assert [tuple(r) for r in rows] == [("two", 200), ("u9", 90)]
    finally:
        engine.dispose()


def test_catalog_browsing_and_ddl_visibility(single):
    node, client, q = single
    load_events_and_users(client)
    with connect(q) as conn:
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
        [mink] = [c for c in objects if c["catalog_name"] == "mink"]
        [db] = [s for s in mink["catalog_db_schemas"] if s["db_schema_name"] == "db"]
        tables = {t["table_name"]: t for t in db["db_schema_tables"]}
        assert set(tables) == {"events", "users"}
        assert [c["column_name"] for c in tables["users"]["table_columns"]] == ["id", "name", "score"]

        schema = conn.adbc_get_table_schema("users", db_schema_filter="db")
        assert schema.names == ["id", "name", "score"]
        assert schema.field("id").type == pa.int64()

        assert conn.adbc_get_table_types() == ["TABLE"]
        info = conn.adbc_get_info()
        assert info["vendor_name"] == "mink-query"

        # A table created through the node is visible to the next statement.
        action(client, "create_table", {"path": "db.fresh", "descriptor": EVENTS})
        assert sql(conn, "SELECT count(*) AS n FROM db.fresh").to_pylist() == [{"n": 0}]
        names = sql(conn, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'db'")
        assert set(names.column("table_name").to_pylist()) == {"events", "users", "fresh"}

        # Quoted names work.
        assert sql(conn, 'SELECT count(*) AS n FROM "db"."events"').to_pylist() == [{"n": 300}]


def _field(number, payload):
    head, n = bytearray([(number << 3) | 2]), len(payload)
    while n > 0x7F:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + payload


def statement_descriptor(query):
    """A Flight SQL `CommandStatementQuery` descriptor as any Flight SQL client packs it."""
    url = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
    return flight.FlightDescriptor.for_command(_field(1, url) + _field(2, _field(1, query.encode())))


def test_a_kept_plan_serves_one_execution_and_later_ones_plan_again(single):
    """DoGet takes the plan its GetFlightInfo or preparation made (docs/query.md): the
    answers are those of a fresh plan, a ticket presented again plans again, and a
    prepared statement executed again sees the rows and the tables of its own time."""
    node, client, q = single
    load_events_and_users(client)
    raw = flight.connect(q.uri)
    try:
        info = raw.get_flight_info(statement_descriptor("SELECT count(*) AS n FROM db.events"))
        ticket = info.endpoints[0].ticket
        assert raw.do_get(ticket).read_all().to_pylist() == [{"n": 300}]
        # The same ticket again (no kept plan now): planned again, rows of its time.
        retry(lambda: append_table(client, "db.events", events_batch(list(range(300, 310)))))
        assert raw.do_get(ticket).read_all().to_pylist() == [{"n": 310}]
    finally:
        raw.close()
    with connect(q) as conn, conn.cursor() as cur:
        cur.execute("SELECT name FROM db.users WHERE id = 2")
        assert cur.fetch_arrow_table().to_pylist() == [{"name": "two"}]
        put_table(client, users_batch([(2, "deux", 20)]))
        # The same text on the same cursor: ADBC does not prepare again; the handle's
        # second DoGet plans again and reads the update.
        cur.execute("SELECT name FROM db.users WHERE id = 2")
        assert cur.fetch_arrow_table().to_pylist() == [{"name": "deux"}]
        # A table dropped between two executions of one prepared statement is gone for
        # the second.
        cur.execute("SELECT count(*) AS n FROM db.events")
        assert cur.fetch_arrow_table().to_pylist() == [{"n": 310}]
        action(client, "drop_table", {"path": "db.events"})
        with pytest.raises(adbc_driver_manager.Error, match="events"):
            cur.execute("SELECT count(*) AS n FROM db.events")
            cur.fetch_arrow_table()


def test_bad_statements_get_precise_errors_and_disturb_nothing(single):
    node, client, q = single
    load_events_and_users(client)
    with connect(q) as conn:
        cases = [
            ("SELEC 1", "SQL syntax"),
            ("SELECT * FROM db.nope", "table db.nope"),
            ("SELECT * FROM nodb.t", "table nodb.t"),
            ("SELECT * FROM events", "write database.table"),
            ("SELECT nope FROM db.events", "nope"),
            ('SELECT * FROM db."events$changelog"', "is a log table"),
            ('SELECT * FROM db."events$lake"', "not tiered to the lake"),
            ("CREATE TABLE db.x (a INT)", "only reads"),
            ("INSERT INTO db.events VALUES (1, 'a')", "only reads"),
        ]
        for query, words in cases:
            with pytest.raises(adbc_driver_manager.Error) as e:
                sql(conn, query)
            assert words in str(e.value), (query, str(e.value))
        # Everything still answers.
        assert sql(conn, "SELECT count(*) AS n FROM db.events").to_pylist() == [{"n": 300}]

    # A bad config value is refused at start, naming its key.
    import subprocess

    bad = subprocess.run(
        [str(q.proc.args[0]), "--print-config"],
        env={"MINK_QUERY_QUERY__CONCURRENT_MAX": "0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "query.concurrent_max" in bad.stderr, bad.stderr


def test_partitioned_tables_prune_by_partition_and_kafka_topics_answer_sql(single):
    node, client, q = single
    action(client, "create_database", {"name": "db"})
    daily = {
        "schema": {
            "columns": [
                {"name": "day", "type": "STRING", "nullable": False},
                {"name": "id", "type": "BIGINT", "nullable": False},
            ]
        },
        "partition_keys": ["day"],
        "bucket_count": 2,
    }
    action(client, "create_table", {"path": "db.daily", "descriptor": daily})
    schema = pa.schema([pa.field("day", pa.string(), nullable=False), pa.field("id", pa.int64(), nullable=False)])
    days = ["2026-12-01", "2026-12-02", "2026-12-03"]
    batch = pa.record_batch(
        [pa.array([days[i % 3] for i in range(90)]), pa.array(list(range(90)), pa.int64())], schema=schema
    )
    retry(lambda: append_table(client, "db.daily", batch))

    p = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5})
    for i in range(20):
        p.produce("clicks", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=0)
    assert p.flush(30) == 0

    with connect(q) as conn:
        query = "SELECT count(*) AS n FROM db.daily WHERE day = '2026-12-02'"
        # (A count of a log table is answered from the read's exact row count: the
        # read shows in the plan of a query that reads rows.)
        plan = explain(conn, "SELECT id FROM db.daily WHERE day = '2026-12-02'")
        assert "partitions=[2026-12-02]" in plan and "buckets=2" in plan, plan
        assert sql(conn, query).to_pylist() == [{"n": 30}]
        both = "SELECT count(*) AS n FROM db.daily WHERE day IN ('2026-12-01', '2026-12-03')"
        assert sql(conn, both).to_pylist() == [{"n": 60}]
        # The same question without the pushdown.
        assert sql(conn, "SELECT count(*) AS n FROM db.daily WHERE day || '' = '2026-12-02'").to_pylist() == [
            {"n": 30}
        ]
        assert sql(conn, "SELECT count(*) AS n FROM db.daily WHERE day = '1999-01-01'").to_pylist() == [{"n": 0}]

        t = sql(conn, "SELECT CAST(key AS VARCHAR) AS k, CAST(value AS VARCHAR) AS v FROM kafka.clicks ORDER BY v")
        assert t.num_rows == 20
        assert set(t.column("k").to_pylist()) == {f"k{i}" for i in range(20)}

    # A compacted topic answers SQL with its latest value per key; a tombstone deleted
    # its key.
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": node.bootstrap})  # alive until its futures resolve
    created = admin.create_topics([NewTopic("users.latest", num_partitions=2, config={"cleanup.policy": "compact"})])
    created["users.latest"].result(30)
    p = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    for i in range(10):
        p.produce("users.latest", key=f"u{i}".encode(), value=b"v1")
    for i in range(5):
        p.produce("users.latest", key=f"u{i}".encode(), value=b"v2")
    p.produce("users.latest", key=b"u9", value=None)
    assert p.flush(30) == 0
    with connect(q) as conn:
        t = sql(
            conn,
            'SELECT CAST(key AS VARCHAR) AS k, CAST(value AS VARCHAR) AS v FROM kafka."users.latest" ORDER BY k',
        )
        assert t.to_pylist() == [{"k": f"u{i}", "v": "v2" if i < 5 else "v1"} for i in range(9)]


def test_a_lake_tiered_table_reads_through_union_and_its_lake(single):
    node, client, q = single
    action(client, "create_database", {"name": "db"})
    descriptor = dict(EVENTS, properties={"lake": {"enabled": True, "freshness": "1s"}})
    action(client, "create_table", {"path": "db.tiered", "descriptor": descriptor})
    retry(lambda: append_table(client, "db.tiered", events_batch(list(range(50)))))

    def in_lake():
        try:
            snap = action(client, "lake_snapshot", {"path": "db.tiered"})
        except pa.ArrowException:
            return None
        return snap if sum(snap["offsets"].values()) >= 50 else None

    wait_for(in_lake, timeout=60, what="50 rows in the lake")
    append_table(client, "db.tiered", events_batch(list(range(50, 60))))
    with connect(q) as conn:
        # One part per bucket, each its lake files and its log past them.
        plan = explain(conn, "SELECT * FROM db.tiered")
        assert "read=union" in plan and "buckets=3" in plan, plan
        t = sql(conn, "SELECT count(*) AS n, count(DISTINCT id) AS d FROM db.tiered")
        assert t.to_pylist() == [{"n": 60, "d": 60}]
        # Bucket pruning applies to the lake too; a LIMIT is not a LimitScan of the log.
        plan = explain(conn, "SELECT * FROM db.tiered WHERE id = 7")
        assert "read=union" in plan and "pruned to bucket" in plan, plan
        assert sql(conn, "SELECT id, msg FROM db.tiered WHERE id = 7").to_pylist() == [{"id": 7, "msg": "m2"}]
        assert sql(conn, "SELECT id FROM db.tiered WHERE id IN (3, 55)").num_rows == 2
        assert "limit_scan" not in explain(conn, "SELECT * FROM db.tiered LIMIT 5")
        assert sql(conn, "SELECT * FROM db.tiered LIMIT 5").num_rows == 5
        lake = sql(conn, 'SELECT count(*) AS n FROM db."tiered$lake"').to_pylist()[0]["n"]
        assert 50 <= lake <= 60
        # `$lake` reads one snapshot, its id fixed at planning, one part per bucket.
        wait_for(lambda: (snap := in_lake()) and sum(snap["offsets"].values()) == 60, timeout=60, what="60 rows in the lake")
        snapshot = action(client, "lake_snapshot", {"path": "db.tiered"})["snapshot_id"]
        plan = explain(conn, 'SELECT * FROM db."tiered$lake"')
        assert "read=lake" in plan and f"snapshot={snapshot} buckets=3" in plan, plan
        t = sql(conn, 'SELECT count(*) AS n, count(DISTINCT id) AS d, sum(id) AS s FROM db."tiered$lake"')
        assert t.to_pylist() == [{"n": 60, "d": 60, "s": sum(range(60))}]
        plan = explain(conn, 'SELECT * FROM db."tiered$lake" WHERE id = 7')
        assert "read=lake" in plan and "buckets=1 (pruned to bucket" in plan, plan
        assert sql(conn, 'SELECT id, msg FROM db."tiered$lake" WHERE id = 7').to_pylist() == [{"id": 7, "msg": "m2"}]
        assert sql(conn, 'SELECT id FROM db."tiered$lake" WHERE id IN (3, 55, 1000)').num_rows == 2
        # Filters reach the Union and lake reads, evaluated on the node.
        for name in ["tiered", '"tiered$lake"']:
            query = f"SELECT id FROM db.{name} WHERE msg = 'm2' AND id < 55 ORDER BY id"
            assert "filter=[msg = \"m2\" AND id < 55]" in explain(conn, query), name
            assert sql(conn, query).column("id").to_pylist() == [i for i in range(55) if i % 5 == 2], name


def test_limits_concurrency_timeout_and_a_client_that_goes_away(mink_node, mink_query, tmp_path):
    node = NodeProcess(mink_node, tmp_path)
    client = flight.connect(node.location)
    q = QueryProcess(
        mink_query,
        tmp_path,
        [f"127.0.0.1:{node.flight_port}"],
        {"MINK_QUERY_QUERY__CONCURRENT_MAX": "1", "MINK_QUERY_QUERY__TIMEOUT_MS": "4000"},
    )
    try:
        load_events_and_users(client)
        # (A filter: a plain count of the cross join is the product of exact counts.)
        endless = (
            "SELECT count(*) FROM db.events a, db.events b, db.events c, db.events d "
            "WHERE a.id + b.id + c.id + d.id >= 0"
        )
        with connect(q) as conn:
            t0 = time.monotonic()
            with pytest.raises(adbc_driver_manager.Error) as e:
                sql(conn, endless)
            assert "query.timeout_ms" in str(e.value), str(e.value)
            assert time.monotonic() - t0 < 30

        # While one query runs, another is refused at once.
        failures = []

        def run_endless():
            while True:
                try:
                    with connect(q) as c:
                        sql(c, endless)
                except adbc_driver_manager.Error as err:
                    if "concurrent_max" in str(err):
                        continue  # the probe below ran first
                    failures.append(str(err))
                    return

        runner = threading.Thread(target=run_endless)
        runner.start()
        time.sleep(1.0)
        with connect(q) as conn:

            def refused():
                try:
                    sql(conn, "SELECT 1 AS one")
                    return None
                except adbc_driver_manager.Error as err:
                    return str(err) if "concurrent_max" in str(err) else None

            assert "query.concurrent_max" in wait_for(refused, timeout=10, what="a refusal")
        runner.join(timeout=60)
        assert failures and "query.timeout_ms" in failures[0]

        # A client that goes away cancels its query: the slot frees long before the
        # timeout would.
        raw = flight.connect(q.uri)
        info = raw.get_flight_info(
            flight.FlightDescriptor.for_command(
                _statement_query(endless)
            )
        )
        reader = raw.do_get(info.endpoints[0].ticket)
        time.sleep(0.5)
        reader.cancel()
        raw.close()
        with connect(q) as conn:
            ok = wait_for(lambda: _answers(conn), timeout=3.5, what="the slot freed by the cancel")
            assert ok
    finally:
        client.close()
        q.kill()
        node.kill()


def _statement_query(query):
    """A Flight SQL CommandStatementQuery as an Any (protobuf by hand: two fields)."""

    def field(number, payload):
        key = bytes([(number << 3) | 2])
        n, out = len(payload), b""
        while True:
            b = n & 0x7F
            n >>= 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                break
        return key + out + payload

    command = field(1, query.encode())
    url = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
    return field(1, url) + field(2, command)


def _answers(conn):
    try:
        return sql(conn, "SELECT 1 AS one").num_rows == 1
    except adbc_driver_manager.Error:
        return False


def test_three_nodes_any_one_suffices(mink_node, mink_query, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    nodes = []
    q = None
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
                        # One batch per scan: a bucket's rows are read in many scans,
                        # so buckets move in the middle of reads below.
                        "MINK_LOG__SCAN_BYTES_MAX": "1",
                    },
                )
            )
        client = flight.connect(nodes[0].location)
        events6 = dict(EVENTS, bucket_count=6)
        users4 = dict(USERS, bucket_count=4)
        action(client, "create_database", {"name": "db"})
        action(client, "create_table", {"path": "db.events", "descriptor": events6})
        action(client, "create_table", {"path": "db.users", "descriptor": users4})

        def leaders_spread():
            meta = action(client, "metadata", {"path": "db.events"})
            leaders = {b["leader"] for b in meta["buckets"]}
            return leaders if None not in leaders and len(leaders) == 3 else None

        wait_for(leaders_spread, timeout=30, what="buckets led by all three nodes")
        # In many small batches: ~90 per events bucket, ~10 per users bucket.
        for start in range(0, 600, 4):
            ids = list(range(start, start + 4))
            retry(lambda: append_table(client, "db.events", events_batch(ids)), timeout=30)
        for start in range(0, 40, 4):
            rows = [(i, f"u{i}", i) for i in range(start, start + 4)]
            retry(lambda: put_table(client, users_batch(rows)), timeout=30)
        delete_users(client, [0, 1])
        # mink-query knows only the third node; it finds the rest.
        q = QueryProcess(mink_query, tmp_path, [f"127.0.0.1:{nodes[2].flight_port}"])

        def query_all(conn):
            return (
                sql(conn, "SELECT count(*) AS n, sum(id) AS s FROM db.events").to_pylist(),
                sql(conn, "SELECT count(*) AS n FROM db.users").to_pylist(),
                sql(conn, "SELECT name FROM db.users WHERE id IN (7, 0)").to_pylist(),
                # Filtered on the nodes: a read resumed after a move goes on from where
                # the last batch's stored rows ended, not from the rows it kept.
                sql(conn, "SELECT count(*) AS n, sum(id) AS s FROM db.events WHERE msg = 'm2'").to_pylist(),
            )

        m2 = [i for i in range(600) if i % 5 == 2]
        expected = ([{"n": 600, "s": sum(range(600))}], [{"n": 38}], [{"name": "u7"}], [{"n": len(m2), "s": sum(m2)}])
        results = []
        errors = []

        def worker():
            try:
                with connect(q) as conn:
                    for _ in range(3):
                        results.append(query_all(conn))
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(repr(err))

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert len(results) == 12
        for r in results:
            assert r == expected

        # Buckets moving between live nodes while queries run: each read that meets a
        # moved bucket follows the new leader (NotLeader redirects), at its start or in
        # the middle of a bucket's rows (one batch per scan), so every answer is the
        # same. The moves are the cluster's; the test only asks for them.
        stop = threading.Event()
        raced, race_errors = [], []

        def querying():
            try:
                with connect(q) as conn:
                    while not stop.is_set():
                        raced.append(query_all(conn))
            except Exception as err:  # noqa: BLE001 - reported below
                race_errors.append(repr(err))

        racers = [threading.Thread(target=querying) for _ in range(2)]
        for t in racers:
            t.start()
        moves = 0
        for round_ in range(6):
            for path in ("db.events", "db.users"):
                meta = action(client, "metadata", {"path": path})
                b = meta["buckets"][round_ % len(meta["buckets"])]
                to = f"n{(int(b['leader'][1:]) + 1) % 3}"
                moved = action(client, "rebalance", {"moves": [{"bucket": b["bucket"], "to": to}]})
                moves += moved["moved"]
            time.sleep(0.3)
        stop.set()
        for t in racers:
            t.join(timeout=120)
        stuck = [t for t in racers if t.is_alive()]
        assert not stuck, f"{len(stuck)} querying threads still running; mink-query said:\n" + "".join(
            q.lines[-80:]
        ) + "\nnodes said:\n" + "\n".join("".join(n.lines[-60:]) for n in nodes)
        assert moves >= 6, moves
        assert not race_errors, race_errors
        assert len(raced) >= 4, "queries ran while buckets moved"
        for r in raced:
            assert r == expected

        # A node dying while queries run: planning, reads and point queries that meet
        # its buckets wait for the cluster to move them (`query.leader_wait_ms`), so
        # no query fails, and every one answers the same, before, during and after.
        client.close()
        client = flight.connect(nodes[1].location)
        stop.clear()
        raced.clear()
        racers = [threading.Thread(target=querying) for _ in range(2)]
        for t in racers:
            t.start()
        wait_for(lambda: len(raced) >= 2, timeout=60, what="queries before the kill")
        nodes[0].kill()

        def moved_off_n0():
            for path in ("db.events", "db.users"):
                meta = action(client, "metadata", {"path": path})
                if any(b["leader"] in (None, "n0") for b in meta["buckets"]):
                    return None
            return True

        wait_for(moved_off_n0, timeout=60, what="n0's buckets moved after it died")
        moved_at = len(raced)
        wait_for(lambda: race_errors or len(raced) >= moved_at + 4, timeout=120, what="queries after the move")
        stop.set()
        for t in racers:
            t.join(timeout=120)
        assert not [t for t in racers if t.is_alive()], "querying threads still running"
        assert not race_errors, race_errors
        for r in raced:
            assert r == expected
        client.close()
    finally:
        if q:
            q.kill()
        for n in nodes:
            n.kill()


def test_the_memory_limit_answers_resource_exhausted_and_the_server_goes_on(mink_node, mink_query, tmp_path):
    node = NodeProcess(mink_node, tmp_path)
    client = flight.connect(node.location)
    q = QueryProcess(
        mink_query,
        tmp_path,
        [f"127.0.0.1:{node.flight_port}"],
        {"MINK_QUERY_QUERY__MEMORY_LIMIT_BYTES": str(16 << 20)},
    )
    try:
        action(client, "create_database", {"name": "db"})
        action(client, "create_table", {"path": "db.users", "descriptor": dict(USERS, bucket_count=1)})
        # ~40 MB of state in one bucket: more than the 16 MiB all queries may hold.
        pad = "x" * 400
        for start in range(0, 100_000, 20_000):
            ids = range(start, start + 20_000)
            retry(lambda: put_table(client, users_batch([(i, pad, i) for i in ids])))
        with connect(q) as conn:
            with pytest.raises(adbc_driver_manager.Error) as e:
                sql(conn, "SELECT count(*) AS n FROM db.users WHERE name <> ''")
            assert "RESOURCE_EXHAUSTED" in str(e.value) or "Resources exhausted" in str(e.value), str(e.value)
            assert "query.memory_limit_bytes" in str(e.value), str(e.value)
            # A point query needs no merge, and the server answers it.
            assert sql(conn, "SELECT score FROM db.users WHERE id = 77").to_pylist() == [{"score": 77}]
            # A count merges the keys alone (the projection reaches the nodes): it fits.
            assert sql(conn, "SELECT count(*) AS n FROM db.users").to_pylist() == [{"n": 100_000}]
    finally:
        client.close()
        q.kill()
        node.kill()


def test_the_metadata_commands_jdbc_and_dbeaver_ask_answer_through_another_client(single):
    """GetSqlInfo, GetXdbcTypeInfo, GetPrimaryKeys and the key commands, which the
    Flight SQL JDBC driver and DBeaver call and ADBC does not, through flightsql-dbapi
    (a Flight SQL client library we did not write; the JDBC driver itself cannot be
    fetched here: no Maven registry)."""
    from flightsql import FlightSQLClient
    from flightsql.client import TableRef

    node, client, q = single
    load_events_and_users(client)
    fsql = FlightSQLClient(host="127.0.0.1", port=q.port, insecure=True)

    def rows(info):
        assert info.endpoints, info
        return pa.concat_tables([fsql.do_get(e.ticket).read_all() for e in info.endpoints]).to_pylist()

    try:
        # 0 server name, 3 read-only, 5 Substrait, 8 transactions.
        info = {r["info_name"]: r["value"] for r in rows(fsql.get_sql_info([0, 3, 5, 8]))}
        assert info[0] == "mink-query"
        assert info[3] is True and info[5] is False, info
        types = rows(fsql.get_xdbc_type_info(None))
        names = {t["type_name"] for t in types}
        assert {"BIGINT", "STRING", "DOUBLE", "BOOLEAN", "TIMESTAMP"} <= names, names
        # JDBC's BIGINT (-5) alone.
        assert [t["type_name"] for t in rows(fsql.get_xdbc_type_info(-5))] == ["BIGINT"]

        keys = rows(fsql.get_primary_keys(TableRef(catalog="mink", db_schema="db", table="users")))
        assert [(k["catalog_name"], k["db_schema_name"], k["table_name"], k["column_name"], k["key_sequence"]) for k in keys] == [
            ("mink", "db", "users", "id", 1)
        ]
        # A log table has no key; the key commands answer no rows.
        assert rows(fsql.get_primary_keys(TableRef(catalog="mink", db_schema="db", table="events"))) == []
        users = TableRef(catalog="mink", db_schema="db", table="users")
        events = TableRef(catalog="mink", db_schema="db", table="events")
        assert rows(fsql.get_imported_keys(users)) == []
        assert rows(fsql.get_exported_keys(users)) == []
        assert rows(fsql.get_cross_reference(users, events)) == []
        # An unknown table is NotFound, naming it (at the DoGet, which reads the table).
        with pytest.raises(pa.ArrowKeyError, match="not found: table db.no_such"):
            rows(fsql.get_primary_keys(TableRef(catalog="mink", db_schema="db", table="no_such")))

        assert rows(fsql.execute("SELECT name FROM db.users WHERE id = 2")) == [{"name": "two"}]
        # Updates are not served, and say what is missing.
        with pytest.raises(pa.ArrowNotImplementedError, match="(?i)update"):
            fsql.execute_update("DELETE FROM db.users WHERE id = 2")
        assert rows(fsql.execute("SELECT count(*) AS n FROM db.users")) == [{"n": 8}]
    finally:
        fsql.close()
