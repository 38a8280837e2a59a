"""`cargo xtask bench python`: the Python client against what it is measured by, in
one run on one release node (file:// store in a temporary directory).

- Writes: the Python `Writer` against the Rust client (`mink write --client-routing`,
  `mink_flight::MinkClient`), same rows from the same Arrow IPC file, same batch size,
  one closed-loop caller each (every call writes all its buckets at once and waits);
  also the Writer with `submit` keeping several calls in flight. Goal ≥ 0.7.
- Reads: `table.scan().to_arrow()` against a raw pyarrow Flight read of the same
  endpoints (GetFlightInfo, then DoGet of each ticket, `read_all`). Goal ≥ 0.9.

Rounds alternate; the report gives every round and min / median / max of the ratios.
Prints Markdown on stdout, progress on stderr.
"""

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow as pa
import pyarrow.flight as flight

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
import mink  # noqa: E402


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def start_node(bin_dir, workdir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINK_")}
    env.update(
        {
            "RUST_LOG": "warn,mink_node=info",
            "MINK_DATA_DIR": str(workdir / "data"),
            "MINK_LISTENERS__FLIGHT": "127.0.0.1:0",
            "MINK_LISTENERS__ADMIN": "127.0.0.1:0",
            "MINK_LISTENERS__KAFKA": "127.0.0.1:0",
            "MINK_LISTENERS__ICEBERG_REST": "127.0.0.1:0",
        }
    )
    proc = subprocess.Popen([str(bin_dir / "mink-node")], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    port = []
    found = threading.Event()

    def pump():
        for line in proc.stderr:
            m = re.search(r"Flight listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                port.append(int(m.group(1)))
                found.set()

    threading.Thread(target=pump, daemon=True).start()
    if not found.wait(60):
        proc.kill()
        raise SystemExit("the node did not start")
    return proc, f"127.0.0.1:{port[0]}"


def rows_table(n, payload):
    ids = pa.array(range(n), pa.int64())
    body = pa.array([("x" * (payload - 8)) + f"{i:08d}" for i in range(n)], pa.string())
    return pa.table({"id": ids, "payload": body})


def rust_write(bin_dir, addr, path, file, batch_rows):
    start = time.perf_counter()
    subprocess.run(
        [str(bin_dir / "mink"), "--addr", addr, "write", path, "--file", str(file), "--client-routing", "--batch-rows", str(batch_rows)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def python_write(table, batches, pipelined):
    start = time.perf_counter()
    with table.writer() as w:
        if pipelined:
            futures = [w.submit(b) for b in batches]
            for f in futures:
                f.result()
        else:
            for b in batches:
                w.write(b)
    return time.perf_counter() - start


def raw_scan(addr, path):
    start = time.perf_counter()
    c = flight.connect(f"grpc://{addr}")
    info = c.get_flight_info(flight.FlightDescriptor.for_path(path))
    rows = 0
    for e in info.endpoints:
        rows += flight.connect(e.locations[0]).do_get(e.ticket).read_all().num_rows
    return time.perf_counter() - start, rows


def client_scan(table):
    start = time.perf_counter()
    rows = table.scan().to_arrow().num_rows
    return time.perf_counter() - start, rows


def spread(values):
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    bin_dir = pathlib.Path(args.bin_dir)
    rows, runs = (20_000, 2) if args.quick else (args.rows, args.runs)
    payload, batch_rows, buckets = 1000, 1000, 4
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        proc, addr = start_node(bin_dir, work)
        try:
            client = mink.connect(addr)
            client.create_database("bench")
            schema = pa.schema([pa.field("id", pa.int64(), False), ("payload", pa.string())])
            data = rows_table(rows, payload)
            file = work / "rows.arrow"
            with pa.ipc.new_file(str(file), data.schema) as f:
                f.write_table(data)
            batches = data.to_batches(max_chunksize=batch_rows)
            results = []
            for run in range(1, runs + 1):
                t_rust = client.create_table(f"bench.rust{run}", schema, bucket_keys=["id"], buckets=buckets)
                t_py = client.create_table(f"bench.py{run}", schema, bucket_keys=["id"], buckets=buckets)
                t_pipe = client.create_table(f"bench.pipe{run}", schema, bucket_keys=["id"], buckets=buckets)
                order = ["rust", "py", "pipe"] if run % 2 else ["py", "pipe", "rust"]
                took = {}
                for who in order:
                    log(f"run {run}: {who}")
                    if who == "rust":
                        took[who] = rust_write(bin_dir, addr, t_rust.path, file, batch_rows)
                    else:
                        took[who] = python_write(t_py if who == "py" else t_pipe, batches, who == "pipe")
                # Reads of the same table, alternating.
                # A read of 200 MB takes well under a second: each round sums three
                # reads of each, interleaved.
                reads = {"raw": 0.0, "client": 0.0}
                for _ in range(3):
                    for who in (["raw", "client"] if run % 2 else ["client", "raw"]):
                        secs, n = raw_scan(addr, t_py.path) if who == "raw" else client_scan(t_py)
                        assert n == rows, (who, n)
                        reads[who] += secs / 3
                results.append((run, took, reads))
            proc.terminate()
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    mb = rows * payload / 1e6
    print(
        f"One release node on `file://`, {rows} rows of ~{payload} bytes ({mb:.0f} MB) in batches of {batch_rows}, "
        f"{buckets} buckets (bucket key `id`), one closed-loop caller. Rust: `mink write --client-routing` "
        "(the Rust client, from an Arrow IPC file; the time includes starting the process and reading the file). "
        "Python: `table.writer().write(batch)` per batch, and `submit` with every batch in flight (the Writer "
        "keeps up to five per bucket). Reads: `table.scan().to_arrow()` against a raw pyarrow Flight read of the "
        "same GetFlightInfo endpoints (each round: the mean of three interleaved reads of each). Rounds alternate the order.\n"
    )
    print("| run | Rust client rows/s | Python Writer rows/s | ratio | Writer, pipelined rows/s | ratio | raw DoGet rows/s | scan().to_arrow() rows/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios, pipe_ratios, read_ratios = [], [], []
    for run, took, reads in results:
        r, p, q = rows / took["rust"], rows / took["py"], rows / took["pipe"]
        raw, cl = rows / reads["raw"], rows / reads["client"]
        ratios.append(p / r)
        pipe_ratios.append(q / r)
        read_ratios.append(cl / raw)
        print(f"| {run} | {r:.0f} | {p:.0f} | {p / r:.2f} | {q:.0f} | {q / r:.2f} | {raw:.0f} | {cl:.0f} | {cl / raw:.2f} |")
    print()
    print("| measure | min / median / max | goal |")
    print("|---|---|---|")
    print(f"| Python Writer vs Rust client | {spread(ratios)} | ≥ 0.7 |")
    print(f"| Python Writer pipelined vs Rust client | {spread(pipe_ratios)} | |")
    print(f"| scan().to_arrow() vs raw DoGet | {spread(read_ratios)} | ≥ 0.9 |")


if __name__ == "__main__":
    main()
