"""A local S3 API server (moto) for Mink's tests.

Binds 127.0.0.1 on a port the OS chooses, creates the bucket the tests use, prints
one line `MINK_S3_ENDPOINT=http://127.0.0.1:PORT` on stdout, and serves until its
standard input closes or it is terminated. `cargo xtask test` starts it, reads the
line, and passes the endpoint to the Rust and Python suites.
"""

import logging
import signal
import sys
import threading

import boto3
from moto.server import ThreadedMotoServer

BUCKET = "mink-test"


def main() -> None:
    # One log line per request drowns the test output; keep errors only.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    s3.create_bucket(Bucket=BUCKET)
    print(f"MINK_S3_ENDPOINT={endpoint}", flush=True)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    # Stop when the parent goes away (its end of our stdin closes), unless told to
    # run until terminated (`cargo xtask cluster up --s3`).
    if "--forever" not in sys.argv:
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    server.stop()


if __name__ == "__main__":
    main()
