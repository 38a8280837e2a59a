"""`cargo xtask bench query`: SQL through mink-query against the raw Flight reads it is
built on, and against DuckDB reading the same table's lake, all in one run.

Release binaries of mink-node and mink-query on a file:// store in a temporary
directory. Prints a Markdown report on stdout (progress on stderr):

- `SELECT count(msg)` and a GROUP BY over a log table, as rows/s against raw Flight
  Scans of the same buckets (every endpoint of GetFlightInfo read at once, as
  pyarrow.flight does it), ratio per run;
- primary-key point queries (`WHERE id = k`) through the ADBC driver, and as the two
  Flight SQL calls (GetFlightInfo, DoGet) made by pyarrow, p50/p99 against the raw
  `lookup` action;
- the same GROUP BY through DuckDB over the table's lake Parquet files, as a peer.

Every figure is measured `--runs` times; the report gives min, median and max.
"""

import argparse
import json
import os
import pathlib
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import pyarrow as pa
import pyarrow.flight as flight


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class Proc:
    def __init__(self, cmd, env, marker):
        self.lines = []
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.port = None
        found = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(marker, line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(60):
            self.proc.kill()
            raise SystemExit("did not start:\n" + "".join(self.lines[-30:]))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def action(client, name, body=None):
    [r] = list(client.do_action(flight.Action(name, json.dumps(body or {}).encode())))
    return r.body.to_pybytes()


def put(client, command, path, batch):
    """One DoPut of `batch` (`AppendTable` or `PutTable`), waiting for its answer."""
    descriptor = flight.FlightDescriptor.for_command(json.dumps({command: {"path": path, "schema_id": 1}}))
    writer, reader = client.do_put(descriptor, batch.schema)
    writer.write_with_metadata(batch, pa.py_buffer(b"{}"))
    writer.done_writing()
    reader.read()
    writer.close()


def _field(number, payload):
    """One length-delimited protobuf field."""
    head, n = bytearray([(number << 3) | 2]), len(payload)
    while n > 0x7F:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + payload


def statement_descriptor(sql):
    """A Flight SQL `CommandStatementQuery` descriptor, packed in its `Any` as Flight SQL
    clients send it (no ADBC driver in between)."""
    url = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
    return flight.FlightDescriptor.for_command(_field(1, url) + _field(2, _field(1, sql.encode())))


def spread(values, unit="", digits=2):
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{lo:.{digits}f} / {mid:.{digits}f} / {hi:.{digits}f}{unit}"


def start(bin_dir, work, node_env=None):
    """A release mink-node on `work` (file://) and a mink-query against it, on ports
    the OS chose."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MINK_")}
    node = Proc(
        [str(bin_dir / "mink-node")],
        {
            **base,
            "RUST_LOG": "warn,mink_node=info",
            "MINK_DATA_DIR": str(work / "node"),
            "MINK_LISTENERS__FLIGHT": "127.0.0.1:0",
            "MINK_LISTENERS__ADMIN": "127.0.0.1:0",
            "MINK_LISTENERS__KAFKA": "127.0.0.1:0",
            "MINK_LISTENERS__ICEBERG_REST": "127.0.0.1:0",
            **(node_env or {}),
        },
        r"Flight listening on 127\.0\.0\.1:(\d+)",
    )
    return node, start_query(bin_dir, node.port)


def start_query(bin_dir, node_port, env=None):
    """A release mink-query against the node at `node_port`, with `env` (`MINK_QUERY_*`)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MINK_")}
    return Proc(
        [str(bin_dir / "mink-query")],
        {
            **base,
            "RUST_LOG": "warn,mink_query=info",
            "MINK_QUERY_LISTEN": "127.0.0.1:0",
            "MINK_QUERY_NODES": f'["127.0.0.1:{node_port}"]',
            **(env or {}),
        },
        r"Flight SQL listening on 127\.0\.0\.1:(\d+)",
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    rows = 1_000_000 if args.quick else 10_000_000
    runs = 1 if args.quick else args.runs
    keys = 20_000 if args.quick else 100_000
    points = 200 if args.quick else 1000
    bin_dir = pathlib.Path(args.bin_dir)

    work = pathlib.Path(tempfile.mkdtemp(prefix="mink-bench-query-"))
    node, query = start(bin_dir, work, {"MINK_LAKE__CHECK_INTERVAL_MS": "200"})
    try:
        report = run(node, query, work, rows, runs, keys, points)
    finally:
        query.stop()
        node.stop()
    print(report)


def run(node, query, work, rows, runs, keys, points):
    client = flight.connect(f"grpc://127.0.0.1:{node.port}")
    action(client, "create_database", {"name": "bench"})
    buckets = 4
    action(
        client,
        "create_table",
        {
            "path": "bench.events",
            "descriptor": {
                "schema": {
                    "columns": [
                        {"name": "id", "type": "BIGINT", "nullable": False},
                        {"name": "msg", "type": "STRING"},
                        {"name": "amount", "type": "DOUBLE"},
                    ]
                },
                "bucket_count": buckets,
            },
        },
    )
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string()), pa.field("amount", pa.float64())]
    )
    log(f"loading {rows:,} rows ...")
    t0 = time.monotonic()
    step = 250_000
    for start in range(0, rows, step):
        ids = pa.array(range(start, min(rows, start + step)), pa.int64())
        batch = pa.record_batch(
            [ids, pa.array([f"m{i % 100}" for i in range(start, start + len(ids))]), pa.array([i * 0.5 for i in range(len(ids))])],
            schema=schema,
        )
        put(client, "AppendTable", "bench.events", batch)
    log(f"loaded in {time.monotonic() - t0:.1f} s")

    def raw_scan():
        info = client.get_flight_info(flight.FlightDescriptor.for_path("bench.events"))
        counts = []

        def read(e):
            c = flight.connect(e.locations[0])
            n = 0
            for chunk in c.do_get(e.ticket):
                n += chunk.data.num_rows
            counts.append(n)
            c.close()

        threads = [threading.Thread(target=read, args=(e,)) for e in info.endpoints]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts)

    conn = flightsql.connect(f"grpc://127.0.0.1:{query.port}", autocommit=True)

    def sql(q, params=None):
        with conn.cursor() as cur:
            cur.execute(q, params)
            return cur.fetch_arrow_table()

    scan_rate, count_rate, group_rate = [], [], []
    for r in range(runs):
        t = time.monotonic()
        assert raw_scan() == rows
        scan_rate.append(rows / (time.monotonic() - t))
        t = time.monotonic()
        # count(msg), not count(*): a log table's count(*) is answered from its exact row
        # count without a read (docs/query.md, Statistics).
        assert sql("SELECT count(msg) AS n FROM bench.events").column("n")[0].as_py() == rows
        count_rate.append(rows / (time.monotonic() - t))
        t = time.monotonic()
        g = sql("SELECT msg, count(*) AS n, sum(amount) AS s FROM bench.events GROUP BY msg")
        group_rate.append(rows / (time.monotonic() - t))
        assert g.num_rows == 100
        log(f"run {r}: raw {scan_rate[-1]:,.0f} rows/s, count {count_rate[-1]:,.0f}, group by {group_rate[-1]:,.0f}")

    # Primary-key point queries against the raw lookup action.
    action(
        client,
        "create_table",
        {
            "path": "bench.users",
            "descriptor": {
                "schema": {
                    "columns": [
                        {"name": "id", "type": "BIGINT", "nullable": False},
                        {"name": "name", "type": "STRING"},
                    ]
                },
                "primary_key": ["id"],
                "bucket_count": buckets,
            },
        },
    )
    uschema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
    for start in range(0, keys, 50_000):
        ids = list(range(start, min(keys, start + 50_000)))
        batch = pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"u{i}" for i in ids])], schema=uschema)
        put(client, "PutTable", "bench.users", batch)
    rng = random.Random(7)
    sql_client = flight.connect(f"grpc://127.0.0.1:{query.port}")
    # The same query by the two calls Flight SQL needs (GetFlightInfo, DoGet), from
    # pyarrow: what mink-query itself costs, without the ADBC driver's own overhead.
    def flight_sql(q):
        info = sql_client.get_flight_info(statement_descriptor(q))
        return sql_client.do_get(info.endpoints[0].ticket).read_all()

    raw_p50, raw_p99, sql_p50, sql_p99, fs_p50, fs_p99 = [], [], [], [], [], []
    for r in range(runs):
        raw, viasql, viaflight = [], [], []
        for _ in range(points):
            k = rng.randrange(keys)
            t = time.perf_counter()
            action(client, "lookup", {"path": "bench.users", "keys": [[k]]})
            raw.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = sql(f"SELECT name FROM bench.users WHERE id = {k}")
            viasql.append(time.perf_counter() - t)
            assert got.column("name")[0].as_py() == f"u{k}"
            t = time.perf_counter()
            got = flight_sql(f"SELECT name FROM bench.users WHERE id = {k}")
            viaflight.append(time.perf_counter() - t)
            assert got.column("name")[0].as_py() == f"u{k}"
        q = statistics.quantiles
        raw_p50.append(q(raw, n=100)[49] * 1000)
        raw_p99.append(q(raw, n=100)[98] * 1000)
        sql_p50.append(q(viasql, n=100)[49] * 1000)
        sql_p99.append(q(viasql, n=100)[98] * 1000)
        fs_p50.append(q(viaflight, n=100)[49] * 1000)
        fs_p99.append(q(viaflight, n=100)[98] * 1000)
        log(
            f"run {r}: lookup p50 {raw_p50[-1]:.2f} ms, SQL point query p50 {sql_p50[-1]:.2f} ms (ADBC), "
            f"{fs_p50[-1]:.2f} ms (pyarrow Flight SQL calls)"
        )

    # The lake, read by DuckDB.
    action(
        client,
        "alter_table",
        {"path": "bench.events", "set_properties": {"lake.enabled": "true", "lake.freshness": "1s"}},
    )
    log("tiering to the lake ...")
    deadline = time.monotonic() + 600
    while True:
        try:
            snap = json.loads(action(client, "lake_snapshot", {"path": "bench.events"}))
            if sum(snap["offsets"].values()) >= rows:
                break
        except pa.ArrowException:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the lake did not catch up in 10 minutes")
        time.sleep(0.5)
    files = sorted(str(p) for p in (work / "node" / "objects" / "lake").rglob("*.parquet"))
    duck_rate = []
    for _ in range(runs):
        t = time.monotonic()
        d = duckdb.sql(
            f"SELECT msg, count(*) AS n, sum(amount) AS s FROM read_parquet({files!r}) GROUP BY msg"
        ).fetchall()
        duck_rate.append(rows / (time.monotonic() - t))
        assert len(d) == 100

    ratio = lambda a, b: [x / y for x, y in zip(a, b)]  # noqa: E731
    m = lambda v: f"{statistics.median(v) / 1e6:.2f} M"  # noqa: E731
    return "\n".join(
        [
            f"{rows:,} rows (BIGINT, STRING, DOUBLE) in {buckets} buckets of a log table on file://, one node and "
            f"one mink-query (release), clients in Python (pyarrow.flight, the ADBC Flight SQL driver, DuckDB); "
            f"{runs} runs, min / median / max.",
            "",
            "| what | rows/s (median) | ratio to raw Flight scans (min / median / max) |",
            "|---|---|---|",
            f"| raw Flight Scans of every bucket at once (baseline) | {m(scan_rate)} | 1 |",
            f"| `SELECT count(msg)` | {m(count_rate)} | {spread(ratio(count_rate, scan_rate))} |",
            f"| `SELECT msg, count(*), sum(amount) ... GROUP BY msg` (100 groups) | {m(group_rate)} | {spread(ratio(group_rate, scan_rate))} |",
            f"| the same GROUP BY in DuckDB over the lake's {len(files)} Parquet files (peer) | {m(duck_rate)} | {spread(ratio(duck_rate, scan_rate))} |",
            "",
            f"Primary-key point queries, {points} random keys of {keys:,} per run:",
            "",
            "| what | p50 ms | p99 ms |",
            "|---|---|---|",
            f"| raw `lookup` action (baseline) | {spread(raw_p50)} | {spread(raw_p99)} |",
            f"| `SELECT name FROM t WHERE id = k` through ADBC | {spread(sql_p50)} | {spread(sql_p99)} |",
            f"| ratio ADBC / lookup | {spread(ratio(sql_p50, raw_p50))} | {spread(ratio(sql_p99, raw_p99))} |",
            f"| the same query as pyarrow Flight SQL calls (GetFlightInfo, DoGet) | {spread(fs_p50)} | {spread(fs_p99)} |",
            f"| ratio Flight SQL calls / lookup | {spread(ratio(fs_p50, raw_p50))} | {spread(ratio(fs_p99, raw_p99))} |",
            "",
        ]
    )


if __name__ == "__main__":
    main()
