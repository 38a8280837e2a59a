"""A pyarrow.flight AppendTable writer for the chaos harness (mink-node/tests/it/chaos.rs).

Usage: python chaos_pyarrow_writer.py ADDRS_FILE TABLE_PATH WRITER

Writes 12-row batches (ids WRITER * 10**9 + n * 12 + i, the harness's schema) with
AppendTable to one of the Flight addresses listed in ADDRS_FILE (re-read after every
failure, as nodes restart on new ports) and prints one JSON line per call:
{"ids": [...], "answer": <the node's WriteResult>} when acknowledged, {"failed": "..."}
otherwise. AppendTable carries no writer id, so a failed call is never retried with
the same rows: its rows may or may not be in the table, and an acknowledged row must be
there exactly once, at the offsets the answer gave. Runs until killed.
"""

import json
import random
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight

from chaos_common import live_addresses

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())])


def append(client, table_path, ids):
    batch = pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([f"m{i}" for i in ids])], schema=SCHEMA
    )
    descriptor = flight.FlightDescriptor.for_command(
        json.dumps({"AppendTable": {"path": table_path, "schema_id": 1}})
    )
    options = flight.FlightCallOptions(timeout=40)
    writer, reader = client.do_put(descriptor, SCHEMA, options=options)
    writer.write_with_metadata(batch, pa.py_buffer(b"{}"))
    writer.done_writing()
    answer = reader.read()
    # Without an answer the node ended the call with an error: close raises it.
    writer.close()
    if answer is None:
        raise RuntimeError("no answer and no error")
    return json.loads(answer.to_pybytes())


def main():
    addrs_file, table_path, writer_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(writer_id)
    client = None
    n = 0
    while True:
        if client is None:
            addrs = live_addresses(addrs_file)
            if not addrs:
                time.sleep(0.2)
                continue
            client = flight.connect(f"grpc://{rng.choice(addrs)}")
        ids = [writer_id * 1_000_000_000 + n * 12 + i for i in range(12)]
        n += 1
        try:
            answer = append(client, table_path, ids)
            print(json.dumps({"ids": ids, "answer": answer}), flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            print(json.dumps({"failed": str(e)[:300]}), flush=True)
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
            client = None
            time.sleep(0.1)


if __name__ == "__main__":
    main()
