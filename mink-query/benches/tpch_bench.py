"""`cargo xtask bench tpch`: the 22 TPC-H queries through mink-query over Mink log
tables, against DataFusion (mink-query's own engine) and DuckDB over the same rows as
local Parquet files, all in one run.

DuckDB's `tpch` extension generates the data (`dbgen`) and gives the query texts;
its answers over the Parquet files are the reference every other answer is checked
against. The tables are loaded into a release mink-node on a file:// store through
Flight (`AppendTable`, 4 buckets each). Each query runs `--runs` times in each engine,
alternating; the report gives each query's median, the sums, and the ratio of
mink-query to DataFusion with its spread over the runs. Progress goes to stderr, the
Markdown report to stdout.
"""

import argparse
import decimal
import glob
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

import adbc_driver_flightsql.dbapi as flightsql
import datafusion
import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from query_bench import action, log, put, spread, start, start_query  # noqa: E402

TABLES = ["nation", "region", "part", "supplier", "partsupp", "customer", "orders", "lineitem"]
# MINK_BENCH_TPCH_COMPRESSION: the tables' `compression` (zstd, lz4, none); the
# table default when unset.
COMPRESSION = os.environ.get("MINK_BENCH_TPCH_COMPRESSION")
ROWS_PER_PUT = 50_000  # lineitem rows are ~170 bytes: within log.batch_bytes_max (16 MiB)


def duck():
    import duckdb_extension_tpch

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    base = os.path.dirname(duckdb_extension_tpch.__file__)
    (path,) = glob.glob(os.path.join(base, "**", "*.duckdb_extension"), recursive=True)
    con.execute(f"LOAD '{path}'")
    return con


def mink_type(t):
    if pa.types.is_int32(t):
        return "INT"
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_date32(t):
        return "DATE"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "STRING"
    if pa.types.is_float64(t):
        return "DOUBLE"
    raise SystemExit(f"no Mink type for {t}")


def plain(table):
    """The table with plain strings (DuckDB may hand out views or large strings)."""
    fields = [pa.field(f.name, pa.string() if mink_type(f.type) == "STRING" else f.type, f.nullable) for f in table.schema]
    return table.cast(pa.schema(fields))


def normalize(rows):
    """Rows comparable across engines: numbers to 2 decimal places (within 0.01 is
    equal after rounding), dates and strings as text."""
    out = []
    for row in rows:
        norm = []
        for v in row:
            if isinstance(v, (float, decimal.Decimal)):
                norm.append(round(float(v), 2))
            elif v is None or isinstance(v, (int, str)):
                norm.append(v)
            else:
                norm.append(str(v))
        out.append(tuple(norm))
    return out


def same(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            if isinstance(u, float) and isinstance(v, float):
                if abs(u - v) > max(0.011, abs(v) * 1e-9):
                    return False
            elif u != v:
                return False
    return True


def qualify(sql, db):
    """The query's tables named `db.table` (mink-query wants database and table): the
    names in FROM lists and joins, not the columns aliased like them (`AS nation`)."""
    tables = "|".join(TABLES)
    return re.sub(rf"(\b(?:FROM|JOIN)\s+|,\s*)({tables})\b(?!\.)", rf"\1{db}.\2", sql, flags=re.I)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--quick", action="store_true")
    # MINK_BENCH_TPCH_SF sets it through `cargo xtask bench tpch` (default 0.1).
    ap.add_argument("--sf", type=float, default=float(os.environ.get("MINK_BENCH_TPCH_SF", "0.1")))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sf = 0.01 if args.quick else args.sf
    runs = 1 if args.quick else args.runs
    bin_dir = pathlib.Path(args.bin_dir)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mink-bench-tpch-"))

    log(f"generating TPC-H at scale factor {sf} ...")
    con = duck()
    con.execute(f"CALL dbgen(sf={sf})")
    queries = {int(n): q for n, q in con.execute("SELECT query_nr, query FROM tpch_queries()").fetchall()}
    parquet = work / "parquet"
    parquet.mkdir()
    for t in TABLES:
        pq.write_table(plain(con.execute(f"SELECT * FROM {t}").to_arrow_table()), parquet / f"{t}.parquet")
    con.close()

    node, query = start(bin_dir, work)
    # The same engine with no filter sent to the nodes, for what the pushdown is worth.
    plain_query = start_query(bin_dir, node.port, {"MINK_QUERY_QUERY__FILTER_PUSHDOWN": "false"})
    try:
        report = run(node, (query, plain_query), parquet, queries, sf, runs)
    finally:
        plain_query.stop()
        query.stop()
        node.stop()
    print(report)


def load(client, parquet):
    action(client, "create_database", {"name": "tpch"})
    t0 = time.monotonic()
    total = 0
    for t in TABLES:
        table = pq.read_table(parquet / f"{t}.parquet")
        columns = [
            {"name": f.name, "type": mink_type(f.type), "nullable": f.nullable} for f in table.schema
        ]
        descriptor = {"schema": {"columns": columns}, "bucket_count": 4}
        if COMPRESSION:
            descriptor["properties"] = {"compression": COMPRESSION}
        action(client, "create_table", {"path": f"tpch.{t}", "descriptor": descriptor})
        for batch in table.to_batches(max_chunksize=ROWS_PER_PUT):
            put(client, "AppendTable", f"tpch.{t}", batch)
        total += table.num_rows
    log(f"loaded {total:,} rows in {time.monotonic() - t0:.1f} s")
    return total


def run(node, queries_procs, parquet, queries, sf, runs):
    query, plain_query = queries_procs
    client = flight.connect(f"grpc://127.0.0.1:{node.port}")
    total = load(client, parquet)
    conn = flightsql.connect(f"grpc://127.0.0.1:{query.port}", autocommit=True)
    plain_conn = flightsql.connect(f"grpc://127.0.0.1:{plain_query.port}", autocommit=True)

    ref = duckdb.connect()
    df = datafusion.SessionContext()
    for t in TABLES:
        ref.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{parquet / t}.parquet')")
        df.register_parquet(t, str(parquet / f"{t}.parquet"))

    def mink(q, c=conn):
        with c.cursor() as cur:
            cur.execute(qualify(q, "tpch"))
            return cur.fetch_arrow_table()

    engines = {
        "mink": lambda q: [tuple(r.values()) for r in mink(q).to_pylist()],
        "mink_unfiltered": lambda q: [tuple(r.values()) for r in mink(q, plain_conn).to_pylist()],
        "datafusion": lambda q: [tuple(r.values()) for r in df.sql(q).to_arrow_table().to_pylist()],
        "duckdb": lambda q: ref.execute(q).fetchall(),
    }
    times = {e: {n: [] for n in queries} for e in engines}
    wrong = []
    for r in range(runs):
        for n, q in sorted(queries.items()):
            want = normalize(ref.execute(q).fetchall())
            order = list(engines) if (r + n) % 2 == 0 else list(reversed(engines))
            for e in order:
                t = time.perf_counter()
                got = engines[e](q)
                times[e][n].append(time.perf_counter() - t)
                if r == 0 and e != "duckdb" and not same(normalize(got), want):
                    wrong.append((e, n))
        sums = {e: sum(v[-1] for v in times[e].values()) for e in engines}
        log(f"run {r}: " + ", ".join(f"{e} {s:.2f} s" for e, s in sums.items()))
    if wrong:
        raise SystemExit(f"answers that differ from DuckDB's: {wrong}")

    med = {e: {n: statistics.median(v) for n, v in times[e].items()} for e in engines}
    run_sums = {e: [sum(times[e][n][r] for n in queries) for r in range(runs)] for e in engines}
    ratio = [m / d for m, d in zip(run_sums["mink"], run_sums["datafusion"])]
    lines = [
        f"TPC-H at scale factor {sf} ({total:,} rows; DuckDB's `dbgen` and query texts), loaded through "
        f"Flight into 8 log tables of 4 buckets on one release node (file://), queried through one mink-query "
        f"with the ADBC driver (and a second mink-query with `query.filter_pushdown = false`, every row sent); "
        f"DataFusion {datafusion.__version__} (Python) and DuckDB {duckdb.__version__} over "
        f"the same rows as local Parquet files. Tables at {f'compression {COMPRESSION}' if COMPRESSION else 'the default compression (zstd)'}. Every answer equal to "
        f"DuckDB's. {runs} runs, alternating engines; per query the median.",
        "",
        "| query | mink-query s | without filter pushdown s | DataFusion s | DuckDB s | mink / DataFusion |",
        "|---|---|---|---|---|---|",
    ]
    for n in sorted(queries):
        m, u, d, k = med["mink"][n], med["mink_unfiltered"][n], med["datafusion"][n], med["duckdb"][n]
        lines.append(f"| Q{n} | {m:.3f} | {u:.3f} | {d:.3f} | {k:.3f} | {m / d:.2f} |")
    sums = {e: statistics.median(run_sums[e]) for e in engines}
    unfiltered = [u / d for u, d in zip(run_sums["mink_unfiltered"], run_sums["datafusion"])]
    lines += [
        f"| **sum** | **{sums['mink']:.2f}** | **{sums['mink_unfiltered']:.2f}** | **{sums['datafusion']:.2f}** | "
        f"**{sums['duckdb']:.2f}** | **{sums['mink'] / sums['datafusion']:.2f}** |",
        "",
        f"mink-query / DataFusion, 22-query sum per run (min / median / max): {spread(ratio)}; "
        f"without filter pushdown {spread(unfiltered)}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
