"""A node on S3 whose store asks it to slow down: a proxy in front of the local S3
server (moto) answers some requests with 503 SlowDown, as S3 does when a prefix is
asked too much. Every acknowledged row is still there (object_store retries such
answers), and the node counts them apart from failures: `status="throttled"` in
`mink_object_store_http_requests_total`, and `http_throttled` on the console's cost
API."""

import http.client
import http.server
import json
import threading
import time
import urllib.parse
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight

from node_proc import NodeProcess, retry
from test_flight import EVENTS, SCHEMA, action, append_table

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class SlowDownProxy:
    """Forwards every request to `upstream`, except that every `every`-th PUT, while
    `on`, is answered 503 SlowDown without reaching it."""

    def __init__(self, upstream, every=3):
        target = urllib.parse.urlparse(upstream)
        self.on = True
        self.throttled = 0
        proxy = self
        counter = {"puts": 0}
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "PUT" and proxy.on:
                    with lock:
                        counter["puts"] += 1
                        refuse = counter["puts"] % every == 0
                        if refuse:
                            proxy.throttled += 1
                    if refuse:
                        self.send_response(503)
                        self.send_header("Content-Type", "application/xml")
                        self.send_header("Content-Length", str(len(SLOW_DOWN)))
                        self.end_headers()
                        self.wfile.write(SLOW_DOWN)
                        return
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                finally:
                    conn.close()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def get_json(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def counted(text, status):
    """The sum of `mink_object_store_http_requests_total` series with `status`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("mink_object_store_http_requests_total{") and f'status="{status}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_store_that_asks_to_slow_down_loses_nothing_and_is_shown_as_throttling(mink_node, tmp_path, s3_url):
    proxy = SlowDownProxy(s3_url["MINK_OBJECT_STORE__ENDPOINT"])
    node = NodeProcess(mink_node, tmp_path, dict(s3_url, MINK_OBJECT_STORE__ENDPOINT=proxy.endpoint))
    client = flight.connect(node.location)
    try:
        retry(lambda: action(client, "create_database", {"name": "db"}))
        retry(lambda: action(client, "create_table", {"path": "db.events", "descriptor": EVENTS}))
        written = []
        for start in range(0, 200, 20):
            ids = list(range(start, start + 20))
            batch = pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"m{i}" for i in ids])], schema=SCHEMA)
            append_table(client, "db.events", batch)
            written += ids
        assert proxy.throttled > 0
        # Every acknowledged row is there, once.
        info = client.get_flight_info(flight.FlightDescriptor.for_path("db.events"))
        got = []
        for e in info.endpoints:
            got += client.do_get(e.ticket).read_all().column("id").to_pylist()
        assert sorted(got) == written

        text = metrics(node.admin_port)
        assert counted(text, "throttled") >= 1, "503 SlowDown counted as throttled"
        assert counted(text, "5xx") == 0, "and not as a 5xx failure"
        # The console's cost page shows it per second (two samples, 2 s apart, are
        # needed before there is a rate).
        deadline = time.monotonic() + 30
        while True:
            now = get_json(node.admin_port, "/api/v1/cost")["now"]
            if now and now["per_s"]["http_throttled"] > 0:
                assert now["per_s"]["http_requests"] >= now["per_s"]["http_throttled"]
                break
            assert time.monotonic() < deadline, f"no throttled rate on the cost API: {now}"
            # Keep the node writing, so that the store keeps asking it to slow down.
            ids = [1000 + int(time.monotonic() * 1000) % 1_000_000]
            batch = pa.record_batch([pa.array(ids, pa.int64()), pa.array(["more"])], schema=SCHEMA)
            append_table(client, "db.events", batch)
            time.sleep(0.5)
    finally:
        client.close()
        node.kill()
        proxy.close()
