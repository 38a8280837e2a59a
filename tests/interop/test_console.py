"""The console (issue 30): its JSON API against one node, and its pages in a real
browser (Debian's headless Chromium driven by Selenium) against three nodes.

Screenshots of every page are saved under target/console-screenshots/. Pages are
checked by their content (elements and text the page draws from the API), never by
pixels, and every page must load without a browser console error."""

import json
import os
import pathlib
import shutil
import sys
import time
import urllib.error
import urllib.request

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer

from node_proc import NodeProcess
from test_cluster import cluster  # noqa: F401 - the three-node fixture

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients/python/src"))
import mink  # noqa: E402

SHOTS = ROOT / "target/console-screenshots"


def get(port, path):
    """(status, JSON body) of a GET on the admin endpoint."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_until(probe, timeout=30, what="the condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            found = probe()
        except Exception as e:  # the page or node is settling
            last = e
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


@pytest.fixture()
def node(mink_node, tmp_path):
    n = NodeProcess(
        mink_node,
        tmp_path,
        # KV snapshots every second: the table page shows their age.
        {"MINK_DATA_DIR": str(tmp_path / "data"), "MINK_KV__SNAPSHOT_INTERVAL_MS": "1000"},
    )
    yield n
    n.kill()


def test_the_tables_list_counts_buckets_no_tablet_holds_from_the_stream_metadata(mink_node, tmp_path):
    """After a clean restart no tablet is open until a request needs it; the tables
    list counts those buckets from the stream metadata (their compacted rows and
    segment bytes) without opening them."""
    env = {"MINK_DATA_DIR": str(tmp_path / "data")}
    n = NodeProcess(mink_node, tmp_path, env)
    try:
        client = mink.connect(f"127.0.0.1:{n.flight_port}")
        client.create_database("shop")
        events = client.create_table("shop.events", pa.schema([("id", pa.int64())]), buckets=3, bucket_keys=["id"])
        events.append(pa.table({"id": list(range(30))}))
        client.close()
        _, before = get(n.admin_port, "/api/v1/tables")
        [t] = before["tables"]
        assert (t["rows"], t["buckets_reporting"]) == (30, 3)
        n.stop()  # a clean stop closes every stream: all of it compacted
    finally:
        n.kill()
    n = NodeProcess(mink_node, tmp_path, env)
    try:
        _, after = get(n.admin_port, "/api/v1/tables")
        [t] = after["tables"]
        assert (t["rows"], t["buckets_reporting"], t["buckets_from_metadata"]) == (30, 0, 3), t
        assert t["bytes"] > 30 * 8
    finally:
        n.kill()


def test_the_api_answers_every_view_and_refuses_bad_input_with_json(node):
    port = node.admin_port
    client = mink.connect(f"127.0.0.1:{node.flight_port}")
    client.create_database("shop")
    events = client.create_table(
        "shop.events",
        pa.schema([("id", pa.int64()), ("name", pa.string())]),
        buckets=3,
        bucket_keys=["id"],
    )
    events.append(pa.table({"id": list(range(30)), "name": [f"n{i}" for i in range(30)]}))
    users = client.create_table(
        "shop.users",
        pa.schema([("id", pa.int64()), ("email", pa.string())]),
        primary_key=["id"],
        buckets=2,
    )
    users.upsert(pa.table({"id": [1, 2], "email": ["a@x", "b@x"]}))

    status, index = get(port, "/api/v1")
    assert status == 200 and "/api/v1/cluster" in index["endpoints"]
    status, overview = get(port, "/api/v1/cluster")
    assert status == 200
    assert [n["state"] for n in overview["nodes"]] == ["serving"]
    assert overview["nodes"][0]["lease_holder"] and overview["nodes"][0]["buckets_led"] == 5
    assert overview["tables"] == 2 and overview["buckets_without_leader"] == 0
    status, nodes = get(port, "/api/v1/nodes")
    assert status == 200 and nodes["nodes"][0]["wal"]

    status, tables = get(port, "/api/v1/tables")
    by_name = {f'{t["database"]}.{t["table"]}': t for t in tables["tables"]}
    assert by_name["shop.events"]["kind"] == "log" and by_name["shop.events"]["rows"] == 30
    # What the log keeps on object storage: 30 rows of Arrow IPC, more than their values.
    assert by_name["shop.events"]["bytes"] > 30 * 8
    assert by_name["shop.users"]["kind"] == "primary_key"

    status, detail = get(port, "/api/v1/tables/shop/events")
    assert status == 200
    assert [b["bucket"] for b in detail["buckets"]] == [0, 1, 2]
    assert sum(b["high_watermark"] for b in detail["buckets"]) == 30
    assert all(b["leader"] and b["log_start"] == 0 for b in detail["buckets"])
    assert sum(b["bytes"] for b in detail["buckets"]) == by_name["shop.events"]["bytes"]
    assert all(b["bytes"] > 0 for b in detail["buckets"] if b["high_watermark"] > 0)
    assert [s["schema_id"] for s in detail["schemas"]] == [1]

    status, rows = get(port, "/api/v1/tables/shop/events/rows?limit=5")
    assert status == 200 and len(rows["rows"]) == 5 and rows["columns"] == ["id", "name"]
    assert {"_bucket", "_offset", "id", "name"} <= set(rows["rows"][0])
    status, rows = get(port, "/api/v1/tables/shop/events/rows?limit=1000&bucket=1")
    assert {r["_bucket"] for r in rows["rows"]} == {1}
    assert len(rows["rows"]) == detail["buckets"][1]["high_watermark"]
    status, changes = get(port, "/api/v1/tables/shop/users/rows")
    assert sorted(r["_change_type"] for r in changes["rows"]) == ["+I", "+I"]

    def snapshot():
        buckets = get(port, "/api/v1/tables/shop/users")[1]["buckets"]
        return next((b["kv_snapshot"] for b in buckets if b["kv_snapshot"]), None)

    taken = wait_until(snapshot, timeout=30, what="a recorded KV snapshot")
    assert taken["age_ms"] is not None and 0 <= taken["age_ms"] < 60_000, taken
    assert taken["bytes"] > 0, taken
    # A primary-key table's bytes count its newest KV snapshots beside its log.
    users = next(t for t in get(port, "/api/v1/tables")[1]["tables"] if t["table"] == "users")
    assert users["kv_snapshot_bytes"] > 0, users
    assert users["bytes"] == users["log_bytes"] + users["kv_snapshot_bytes"], users

    status, found = get(port, "/api/v1/tables/shop/users/lookup?key=2")
    assert status == 200 and found == {"found": True, "rows": [{"id": 2, "email": "b@x"}]}
    status, missing = get(port, "/api/v1/tables/shop/users/lookup?key=%5B9%5D")
    assert status == 200 and not missing["found"]

    # A tail answers with a row written while it waits, and every bucket's next offset.
    cursors = ",".join(f'{b["bucket"]}@{b["high_watermark"]}' for b in detail["buckets"])
    import threading

    answer = {}

    def tail():
        answer["got"] = get(port, f"/api/v1/tables/shop/events/tail?from={cursors}&wait_ms=20000")

    t = threading.Thread(target=tail)
    t.start()
    time.sleep(1.0)
    events.append(pa.table({"id": [1000], "name": ["late"]}))
    t.join(30)
    status, tailed = answer["got"]
    assert status == 200 and [r["name"] for r in tailed["rows"]] == ["late"]
    assert sum(tailed["next"].values()) == 31

    status, cost = get(port, "/api/v1/cost")
    assert status == 200 and {p["op"] for p in cost["prices"]} >= {"put", "get", "list"}
    cost = wait_until(lambda: get(port, "/api/v1/cost")[1]["now"], what="two cost samples")
    assert cost["requests_per_s"] > 0 and cost["usd_per_month"] > 0
    # The group-commit budget: a number where the node keeps one (S3), null elsewhere.
    assert "wal_put_rate_max" in cost and "wal_put_budget_used" in cost

    # Bad input: a precise JSON error, 4xx, never a page or a closed connection.
    for path, status_wanted, code in [
        ("/api/v1/nope", 404, "not_found"),
        ("/api/v1/tables/shop/nope", 404, "not_found"),
        ("/api/v1/tables/nodb/events/rows", 404, "not_found"),
        ("/api/v1/tables/shop/nope/tail?from=0@0", 404, "not_found"),
        ("/api/v1/tables/shop/events/rows?limit=0", 400, "invalid_argument"),
        ("/api/v1/tables/shop/events/rows?limit=many", 400, "invalid_argument"),
        ("/api/v1/tables/shop/events/rows?bucket=7", 400, "invalid_argument"),
        ("/api/v1/tables/shop/events/tail", 400, "invalid_argument"),
        ("/api/v1/tables/shop/events/tail?from=0@x", 400, "invalid_argument"),
        ("/api/v1/tables/shop/events/tail?from=0@0&wait_ms=999999", 400, "invalid_argument"),
        ("/api/v1/tables/shop/users/lookup", 400, "invalid_argument"),
        ("/api/v1/tables/shop/users/lookup?key=%7Bnot", 400, "invalid_argument"),
        ("/api/v1/tables/shop/users/lookup?key=%5B%22a%22%5D", 400, "invalid_argument"),
        ("/api/v1/tables/bad%20name/t", 400, "invalid_argument"),
    ]:
        status, body = get(port, path)
        assert (status, body["error"]["code"]) == (status_wanted, code), (path, body)
        assert body["error"]["message"]
    many = ",".join(f"{b}@0" for b in range(300))
    status, body = get(port, f"/api/v1/tables/shop/events/tail?from={many}")
    assert status == 400 and body["error"]["code"] == "limit_exceeded"
    # Nothing on the console writes.
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/tables", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 405
    # The page and its assets are served from the binary.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
        assert b'<div id="app">' in r.read()
    for asset in ["app.js", "vendor/preact.mjs", "vendor/uPlot.iife.min.js", "vendor/VENDOR.md"]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/console/{asset}", timeout=10) as r:
            assert r.status == 200 and len(r.read()) > 100


# ---- the browser ----------------------------------------------------------------------


def browser():
    """Headless Debian Chromium under Selenium (chromium and chromium-driver are
    installed by `cargo xtask test`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    assert os.path.exists(chromium) and os.path.exists(driver), (
        "Debian's chromium and chromium-driver are needed (cargo xtask test installs them)"
    )
    options = webdriver.ChromeOptions()
    for arg in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ]:
        options.add_argument(arg)
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver))


class Page:
    """A browser on one node's console; every visit is screenshotted and checked for
    console errors."""

    def __init__(self, driver, port):
        self.d = driver
        self.base = f"http://127.0.0.1:{port}"

    def open(self, hash_path, ready_css, shot):
        self.d.get(f"{self.base}/#/{hash_path}")
        self.wait_css(ready_css)
        self.shot(shot)

    def wait_css(self, css, timeout=30):
        from selenium.webdriver.common.by import By

        return wait_until(lambda: self.d.find_elements(By.CSS_SELECTOR, css), timeout, css)

    def text(self, css):
        from selenium.webdriver.common.by import By

        return " ".join(e.text for e in self.d.find_elements(By.CSS_SELECTOR, css))

    def attr(self, css, name):
        from selenium.webdriver.common.by import By

        return [e.get_attribute(name) for e in self.d.find_elements(By.CSS_SELECTOR, css)]

    def shot(self, name):
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.d.save_screenshot(str(SHOTS / f"{name}.png"))
        main = self.text("main")
        assert len(main) > 40, f"{name}: an empty page: {main!r}"
        assert "Loading the console" not in self.text("body"), name
        errors = [e for e in self.d.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"{name}: console errors: {errors}"


def test_every_page_in_a_real_browser_on_three_nodes(cluster):
    nodes, _ = cluster
    watcher = nodes[0]
    client = mink.connect(f"127.0.0.1:{watcher.flight_port}")
    wait_until(
        lambda: len(get(watcher.admin_port, "/api/v1/cluster")[1]["nodes"]) == 3,
        what="three nodes registered",
    )
    client.create_database("web")
    events = client.create_table(
        "web.clicks", pa.schema([("id", pa.int64()), ("page", pa.string())]), buckets=6,
        bucket_keys=["id"],
    )
    users = client.create_table(
        "web.users", pa.schema([("id", pa.int64()), ("name", pa.string())]),
        primary_key=["id"], buckets=2,
    )
    users.upsert(pa.table({"id": [7], "name": ["ada"]}))
    # Buckets spread over the three nodes.
    client.action("rebalance", {})
    wait_until(
        lambda: len({b["leader"] for b in get(watcher.admin_port, "/api/v1/tables/web/clicks")[1]["buckets"]}) == 3,
        what="the six buckets spread over three nodes",
    )
    events.append(pa.table({"id": list(range(60)), "page": ["/"] * 60}))

    driver = browser()
    try:
        page = Page(driver, watcher.admin_port)
        # Cluster: three serving nodes, one lease holder.
        page.open("cluster", "#nodes tr[data-state='serving']", "cluster")
        wait_until(lambda: page.attr("#nodes tr[data-node]", "data-state") == ["serving"] * 3,
                   what="three serving nodes on the page")
        assert "lease holder" in page.text("#nodes")

        # Tables: the table created above, findable by search.
        page.open("tables", "#tables tr[data-table='web.clicks']", "tables")
        search = page.wait_css("#table-search")[0]
        search.send_keys("user")
        wait_until(lambda: page.attr("#tables tr[data-table]", "data-table") == ["web.users"],
                   what="the search to keep web.users only")

        # Table detail: six buckets with leaders on three nodes; a write moves a
        # bucket's high watermark on screen.
        page.open("tables/web/clicks", "#buckets tr[data-bucket]", "table-detail")
        wait_until(lambda: len(set(page.attr("#buckets tr[data-bucket]", "data-leader"))) == 3,
                   what="leaders on three nodes")
        before = sum(int(h or 0) for h in page.attr("#buckets tr[data-bucket]", "data-hw"))
        assert before == 60
        events.append(pa.table({"id": list(range(100, 110)), "page": ["/new"] * 10}))
        wait_until(
            lambda: sum(int(h or 0) for h in page.attr("#buckets tr[data-bucket]", "data-hw")) == 70,
            what="the high watermarks to move on screen",
        )
        page.shot("table-detail-after-write")
        stored = page.text('[data-card="bytes"] .v')
        assert stored.endswith(("B", "KiB", "MiB")) and not stored.startswith("0 "), stored

        # Data: the newest rows, then a live tail that shows a row written after the
        # page opened.
        page.open("data/web/clicks", "#newest-rows tr[data-offset]", "data")
        page.wait_css("#tail-toggle")[0].click()
        wait_until(lambda: "following" in page.text("#tail-status"), what="the tail to start")
        time.sleep(1.0)
        events.append(pa.table({"id": [4242], "page": ["/written-after-the-page-opened"]}))
        wait_until(lambda: "/written-after-the-page-opened" in page.text("#tail-rows"),
                   what="the tailed row on the page")
        page.shot("data-tail")

        # Lookup on a primary-key table.
        page.open("data/web/users", "#lookup-key", "data-pk")
        page.wait_css("#lookup-key")[0].send_keys("7")
        page.wait_css("form.inline button[type='submit']")[0].click()
        wait_until(lambda: "ada" in page.text("#lookup-rows"), what="the looked-up row")
        page.shot("data-lookup")

        # Kafka: a group's lag, falling to 0 once it has consumed.
        topic = "clicks.v1"
        producer = Producer({"bootstrap.servers": watcher.bootstrap})
        for i in range(40):
            producer.produce(topic, key=str(i).encode(), value=b"x" * 20, partition=i % 2)
        assert producer.flush(30) == 0
        consumer = Consumer({
            "bootstrap.servers": watcher.bootstrap, "group.id": "console-test",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
        })
        consumer.subscribe([topic])
        got = None
        deadline = time.monotonic() + 60
        while got is None and time.monotonic() < deadline:
            got = consumer.poll(1.0)
            if got is not None and got.error():
                got = None
        assert got is not None
        consumer.commit(message=got, asynchronous=False)  # one message: lag stays
        page.open("kafka", "#topics tr[data-topic]", "kafka")
        wait_until(lambda: int((page.attr("div.group[data-group='console-test']", "data-lag") or ["0"])[0]) > 0,
                   what="a lag above 0 on the page")
        assert "Stable" in page.text("div.group[data-group='console-test']")
        consumed = 1
        while consumed < 40 and time.monotonic() < deadline:
            m = consumer.poll(1.0)
            if m is not None and not m.error():
                consumed += 1
                consumer.commit(message=m, asynchronous=False)
        wait_until(lambda: page.attr("div.group[data-group='console-test']", "data-lag") == ["0"],
                   what="the lag to fall to 0 on the page")
        page.shot("kafka-caught-up")
        consumer.close()

        # Cost: rates and charts from the node's own counters.
        page.open("cost", "#chart-requests canvas", "cost")
        assert "USD / month" in page.text("main")
        assert "WAL PUTs / s (budget)" in page.text("main")

        # A node killed: shown as not serving, then down, and its buckets move.
        victim, victim_id = nodes[2], "n2"
        page.open("cluster", "#nodes tr[data-node]", "cluster-before-kill")
        victim.kill()
        wait_until(lambda: page.attr(f"#nodes tr[data-node='{victim_id}']", "data-state") == ["down"],
                   timeout=60, what="the killed node shown as down")
        page.shot("cluster-node-down")
        page.open("tables/web/clicks", "#buckets tr[data-bucket]", "table-after-kill")
        wait_until(
            lambda: victim_id not in page.attr("#buckets tr[data-bucket]", "data-leader")
            and "" not in page.attr("#buckets tr[data-bucket]", "data-leader"),
            timeout=60, what="the killed node's buckets moved",
        )
        page.shot("table-after-kill-moved")
    finally:
        driver.quit()


def test_every_metric_the_grafana_dashboard_names_is_scraped(mink_node, tmp_path, s3_url):
    """deploy/grafana/mink.json queries only metrics a live node exports. The node runs
    on the S3 server: the HTTP answers (and throttling) are counted on S3 stores only."""
    import re

    dashboard = json.loads((ROOT / "deploy/grafana/mink.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {re.sub(r"_bucket$", "", m) for e in exprs for m in re.findall(r"\bmink_[a-z_]+", e)}
    assert len(names) >= 10, names
    node = NodeProcess(
        mink_node,
        tmp_path,
        {"MINK_DATA_DIR": str(tmp_path / "data"), "MINK_LAKE__CHECK_INTERVAL_MS": "100", **s3_url},
    )
    try:
        client = mink.connect(f"127.0.0.1:{node.flight_port}")
        client.create_database("g")
        t = client.create_table(
            "g.tiered",
            pa.schema([("id", pa.int64())]),
            buckets=1,
            properties={"lake": {"enabled": True, "freshness": "1s"}},
        )
        t.append(pa.table({"id": list(range(10))}))
        # A consumer group with a commit behind the end: the lag series.
        p = Producer({"bootstrap.servers": node.bootstrap})
        p.produce("lagging", value=b"x")
        p.produce("lagging", value=b"y")
        p.flush(30)
        c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "dash", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.subscribe(["lagging"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = c.poll(1)
            if m is not None and m.error() is None:
                c.commit(message=m, asynchronous=False)
                break
        c.close()

        def scraped():
            with urllib.request.urlopen(f"http://127.0.0.1:{node.admin_port}/metrics", timeout=10) as r:
                text = r.read().decode()
            present = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("mink_")}
            present |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in present}
            missing = names - present
            return None if missing else present

        try:
            wait_until(scraped, timeout=60, what="every dashboard metric in /metrics")
        except AssertionError:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.admin_port}/metrics", timeout=10) as r:
                text = r.read().decode()
            present = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("mink_")}
            raise AssertionError(f"not scraped: {sorted(names - present)}")
    finally:
        node.kill()
