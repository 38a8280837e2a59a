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


def make_conditional_puts_atomic() -> None:
    """moto checks `If-None-Match: *` and then stores the object, with nothing held in
    between, and ThreadedMotoServer serves requests on many threads: two racing
    conditional creates of one key can both succeed, the second overwriting the
    first. Real S3 decides them atomically, and Mink's coordination rests on that
    (DESIGN.md: conditional create is the one primitive), so every object write here
    takes one lock: the check and the store become one step, as on S3. Seen as an
    ObjectLog entry lost under four concurrent appenders
    (`mink-wal/tests/objectlog.rs`, `s3::concurrent_appenders_agree_on_one_total_order`).
    """
    import moto.s3.responses as responses

    lock = threading.Lock()

    def serialized(method):
        def locked(self, *args, **kwargs):
            with lock:
                return method(self, *args, **kwargs)

        return locked

    # PutObject, and POST (CompleteMultipartUpload, which takes If-None-Match too).
    responses.S3Response.put_object = serialized(responses.S3Response.put_object)
    responses.S3Response._key_response_post = serialized(responses.S3Response._key_response_post)


def main() -> None:
    # One log line per request drowns the test output; keep errors only.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    make_conditional_puts_atomic()
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
