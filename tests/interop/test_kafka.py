"""A node over the Kafka protocol, driven by confluent-kafka (librdkafka, a client we did
not write), and by raw sockets for framing and version negotiation."""

import json
import socket
import struct
import threading
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest
import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from node_proc import NodeProcess, retry, wait_for

TIMEOUT = 30


@pytest.fixture()
def node(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path)
    yield proc
    proc.kill()


def producer(node, **extra):
    return Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5, **extra})


def produce_all(p, topic, records, partition=None):
    """Produces (key, value, headers, timestamp) records; returns their delivery reports."""
    reports = []

    def done(err, msg):
        reports.append((err, msg))

    for key, value, headers, ts in records:
        kwargs = dict(key=key, value=value, headers=headers, on_delivery=done)
        if ts is not None:
            kwargs["timestamp"] = ts
        if partition is not None:
            kwargs["partition"] = partition
        p.produce(topic, **kwargs)
    assert p.flush(TIMEOUT) == 0, "undelivered messages"
    errors = [err for err, _ in reports if err is not None]
    assert errors == [], errors
    return [msg for _, msg in reports]


def consume(node, topic, partitions, count, **extra):
    """Reads `count` records from offset 0 of each partition, by assignment."""
    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "unused", "enable.auto.commit": False, **extra})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in partitions])
        got = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m)
        assert len(got) == count, f"read {len(got)} of {count}"
        return got
    finally:
        c.close()


def admin(node):
    return AdminClient({"bootstrap.servers": node.bootstrap})


def create_topic(node, name, partitions=1, config=None):
    a = admin(node)  # the futures need their client alive
    futures = a.create_topics([NewTopic(name, num_partitions=partitions, config=config or {})])
    futures[name].result(TIMEOUT)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_keeps_keys_headers_and_timestamps(node, compression):
    create_topic(node, "events", partitions=3)
    p = producer(node, **{"compression.type": compression})
    records = []
    for i in range(60):
        headers = [("n", str(i).encode()), ("empty", b"")] if i % 2 == 0 else None
        key = None if i % 7 == 0 else f"key-{i}".encode()
        records.append((key, f"value-{i}".encode() * 5, headers, 1_700_000_000_000 + i))
    delivered = produce_all(p, "events", records)
    assert {m.partition() for m in delivered} <= {0, 1, 2}
    got = consume(node, "events", [0, 1, 2], len(records))
    by_value = {m.value(): m for m in got}
    for key, value, headers, ts in records:
        m = by_value[value]
        assert m.key() == key
        assert m.timestamp() == (1, ts)  # CreateTime
        assert (m.headers() or None) == headers
    # Offsets per partition are contiguous from 0, as delivered.
    for part in {m.partition() for m in got}:
        offsets = sorted(m.offset() for m in got if m.partition() == part)
        assert offsets == list(range(len(offsets)))


def test_an_idempotent_producer_writes_each_record_once_in_order(node):
    p = producer(node, **{"enable.idempotence": True, "acks": "all", "max.in.flight.requests.per.connection": 5,
                          "batch.num.messages": 10})
    records = [(b"k", f"{i}".encode(), None, None) for i in range(500)]
    delivered = produce_all(p, "ordered", records, partition=0)
    assert [m.offset() for m in delivered] == list(range(500))
    got = consume(node, "ordered", [0], 500)
    assert [int(m.value()) for m in got] == list(range(500))
    lo, hi = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "unused"}).get_watermark_offsets(
        TopicPartition("ordered", 0), timeout=TIMEOUT
    )
    assert (lo, hi) == (0, 500)


def test_a_client_speaking_the_lowest_versions_works(node):
    # No ApiVersions: librdkafka assumes a 0.11.0 broker (Produce 3, Fetch 4, Metadata 2,
    # ListOffsets 1), the lowest versions of the spec's ranges.
    old = {"api.version.request": False, "broker.version.fallback": "0.11.0"}
    delivered = produce_all(producer(node, **old), "legacy", [(b"k", b"v", [("h", b"1")], 1_700_000_000_000)], partition=0)
    assert delivered[0].offset() == 0
    got = consume(node, "legacy", [0], 1, **old)
    assert (got[0].key(), got[0].value(), got[0].headers(), got[0].timestamp()) == (b"k", b"v", [("h", b"1")], (1, 1_700_000_000_000))


def test_list_offsets_earliest_latest_and_by_time(node):
    # Record timestamps out of order, in separate batches: a lookup by time finds the
    # first record stamped at or after it (Kafka's semantics), not by arrival time.
    base = int(time.time() * 1000) - 600_000
    batches = [[5_000, 3_000, 9_000], [1_000, 7_000], [4_000], [9_000, 2_000]]
    p = producer(node)
    stamps = []
    for batch in batches:
        produce_all(p, "timed", [(None, b"a", None, base + t) for t in batch], partition=0)
        stamps += [base + t for t in batch]
    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "unused"})
    try:
        assert c.get_watermark_offsets(TopicPartition("timed", 0), timeout=TIMEOUT) == (0, len(stamps))
        for t in [0, 1_000, 2_000, 3_001, 5_000, 5_001, 7_500, 9_000, 9_001]:
            want = next((i for i, s in enumerate(stamps) if s >= base + t), -1)
            got = c.offsets_for_times([TopicPartition("timed", 0, base + t)], timeout=TIMEOUT)
            assert got[0].offset == want, (t, got[0].offset, want)
        # The bucket's leader epoch (ListOffsets v4+), never -1.
        first = c.offsets_for_times([TopicPartition("timed", 0, 1_000)], timeout=TIMEOUT)
        assert first[0].offset == 0
        assert first[0].leader_epoch is not None and first[0].leader_epoch >= 1, first[0].leader_epoch
    finally:
        c.close()
    # A record stamped more than kafka.timestamp_after_max_ms (1 h) ahead is refused.
    reports = []
    p.produce("timed", value=b"late", partition=0, timestamp=int(time.time() * 1000) + 7_200_000,
              on_delivery=lambda err, msg: reports.append(err))
    p.flush(TIMEOUT)
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() == KafkaError.INVALID_TIMESTAMP, reports[0]


def test_fetch_below_the_log_start_or_past_the_end_is_out_of_range(node):
    produce_all(producer(node), "short", [(None, b"x", None, None)], partition=0)
    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "unused", "auto.offset.reset": "error"})
    try:
        c.assign([TopicPartition("short", 0, 100)])
        deadline = time.monotonic() + TIMEOUT
        error = None
        while error is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is not None:
                error = m.error()
        assert error is not None
        assert "out of range" in str(error).lower() or error.code() == KafkaError._AUTO_OFFSET_RESET, error
    finally:
        c.close()


def test_unknown_topics_without_auto_create_and_invalid_names(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path, {"MINK_KAFKA__AUTO_CREATE_TOPICS": "false"})
    try:
        p = producer(proc, **{"message.timeout.ms": 3000})
        reports = []
        p.produce("missing", value=b"x", on_delivery=lambda err, msg: reports.append(err))
        p.flush(TIMEOUT)
        assert len(reports) == 1 and reports[0] is not None
        assert reports[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._MSG_TIMED_OUT), reports[0]
        md = admin(proc).list_topics("missing", timeout=TIMEOUT)
        assert md.topics["missing"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART

        # Kafka's own rule: a name outside it is INVALID_TOPIC_EXCEPTION.
        a = admin(proc)
        for bad in ["has space", "a/b", "x" * 250, ".."]:
            futures = a.create_topics([NewTopic(bad, num_partitions=1)])
            with pytest.raises(KafkaException) as err:
                futures[bad].result(TIMEOUT)
            assert err.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, bad
    finally:
        proc.kill()


def test_every_kafka_topic_name_is_a_table_under_that_name(node, tmp_path):
    """Dotted (Debezium's server.db.table), leading '-' and 249-character names: created
    by CreateTopics and by a produce, listed and described under exactly their name,
    produced, fetched, read through Flight as kafka.<name>, deleted."""
    names = ["orders.v1", "server.db.table", "-lead", "_under", "x" * 249]
    a = admin(node)
    for f in a.create_topics([NewTopic(n, num_partitions=2) for n in names[:3]]).values():
        f.result(TIMEOUT)
    p = producer(node)
    for n in names:  # the last two are created by the produce
        p.produce(n, key=b"k", value=n[:20].encode())
    assert p.flush(TIMEOUT) == 0
    md = a.list_topics(timeout=TIMEOUT)
    for n in names:
        assert n in md.topics and md.topics[n].error is None, n
    entries = list(a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "server.db.table")]).values())[0].result(TIMEOUT)
    assert "retention.ms" in entries
    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "names", "auto.offset.reset": "earliest"})
    c.subscribe(names)
    seen = set()
    deadline = time.monotonic() + 60
    while len(seen) < len(names) and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and m.error() is None:
            seen.add(m.topic())
    c.close()
    assert seen == set(names)
    client = flight.connect(node.location)
    for n in names:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(f"kafka.{n}"))
        assert info.total_records == 1, n
    for f in a.delete_topics(names[:2]).values():
        f.result(TIMEOUT)
    remaining = a.list_topics(timeout=TIMEOUT).topics
    assert "orders.v1" not in remaining and "-lead" in remaining


def test_a_batch_over_max_message_bytes_is_message_too_large(node):
    """DescribeConfigs reports the limit the node enforces, and a batch over it is
    MESSAGE_TOO_LARGE (which producers answer by splitting), not a policy violation."""
    create_topic(node, "big")
    a = admin(node)  # the futures need their client alive
    entries = list(a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "big")]).values())[0].result(TIMEOUT)
    limit = int(entries["max.message.bytes"].value)
    assert limit == 4 << 20
    p = producer(node, **{"message.max.bytes": 3 * limit, "batch.size": 3 * limit, "compression.type": "none"})
    reports = []
    p.produce("big", value=b"x" * (limit + 1), on_delivery=lambda err, msg: reports.append(err))
    p.flush(TIMEOUT)
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, reports[0]
    # Just under the limit is written.
    reports.clear()
    p.produce("big", value=b"y" * (limit - 4096), on_delivery=lambda err, msg: reports.append(err))
    p.flush(TIMEOUT)
    assert reports == [None]


def test_incremental_alter_configs_sets_and_deletes_topic_configs_and_refuses_by_name(node):
    """IncrementalAlterConfigs (kafka-configs --alter, Kafka UI, Strimzi) changes a
    topic's configs under the rules of CreateTopics: retention.ms moves the table's
    log_ttl, max.message.bytes applies to the next produce, DELETE goes back to the
    default, validate_only changes nothing, and what cannot be honoured is
    INVALID_CONFIG naming the key, changing nothing of its resource."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    create_topic(node, "altered.v1")
    a = admin(node)

    def alter(*entries, validate_only=False):
        resource = ConfigResource(ConfigResource.Type.TOPIC, "altered.v1", incremental_configs=list(entries))
        [f] = a.incremental_alter_configs([resource], validate_only=validate_only).values()
        return f.result(TIMEOUT)

    def described():
        [f] = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "altered.v1")]).values()
        return {k: v.value for k, v in f.result(TIMEOUT).items()}

    def entry(name, value=None, op=AlterConfigOpType.SET):
        return ConfigEntry(name, value, incremental_operation=op)

    # validate_only: checked, not applied.
    alter(entry("retention.ms", "3600000"), validate_only=True)
    assert described()["retention.ms"] != "3600000"
    alter(entry("retention.ms", "3600000"), entry("max.message.bytes", "2048"), entry("segment.bytes", "1073741824"))
    got = described()
    assert (got["retention.ms"], got["max.message.bytes"], got["segment.bytes"]) == ("3600000", "2048", "1073741824")
    client = flight.connect(node.location)
    [table] = [r for r in client.do_action(flight.Action("get_table", json.dumps({"path": "kafka.altered.v1"}).encode()))]
    assert json.loads(table.body.to_pybytes())["descriptor"]["properties"]["log_ttl"] == "1h"
    # The new limit applies to the next produce.
    p = producer(node, **{"message.max.bytes": 1 << 20, "batch.size": 1 << 20})
    reports = []
    p.produce("altered.v1", value=b"x" * 4096, on_delivery=lambda err, msg: reports.append(err))
    p.flush(TIMEOUT)
    assert reports[0] is not None and reports[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, reports

    # DELETE: back to the default.
    alter(entry("max.message.bytes", op=AlterConfigOpType.DELETE), entry("segment.bytes", op=AlterConfigOpType.DELETE))
    got = described()
    assert got["max.message.bytes"] == str(4 << 20) and "segment.bytes" not in got
    reports.clear()
    p.produce("altered.v1", value=b"x" * 4096, on_delivery=lambda err, msg: reports.append(err))
    p.flush(TIMEOUT)
    assert reports == [None]

    # Refused by name; nothing of the resource is applied.
    before = described()
    for bad in [
        entry("cleanup.policy", "compact"),
        entry("retention.ms", "0"),
        entry("message.timestamp.type", "LogAppendTime"),
        entry("no.such.config", "1"),
        entry("segment.bytes", "1", op=AlterConfigOpType.APPEND),
    ]:
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            alter(entry("segment.ms", "1000"), bad)
        err = refused.value.args[0]
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert bad.name in err.str(), err
    assert described() == before
    # An unknown topic, and a broker's configs.
    with pytest.raises(confluent_kafka.KafkaException) as unknown:
        [f] = a.incremental_alter_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, "no-such-topic", incremental_configs=[entry("retention.ms", "1000")])]
        ).values()
        f.result(TIMEOUT)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, unknown.value
    broker_id = next(iter(a.list_topics(timeout=TIMEOUT).brokers))
    with pytest.raises(confluent_kafka.KafkaException) as broker:
        [f] = a.incremental_alter_configs(
            [ConfigResource(ConfigResource.Type.BROKER, str(broker_id), incremental_configs=[entry("log.retention.ms", "1000")])]
        ).values()
        f.result(TIMEOUT)
    assert broker.value.args[0].code() == KafkaError.POLICY_VIOLATION, broker.value


def test_topic_configs_frameworks_send_are_kept_applied_or_refused_by_name(node):
    """What Kafka Connect, Flink and Debezium send with CreateTopics is accepted and
    shown by DescribeConfigs; max.message.bytes and message.timestamp.type apply; a
    value Mink cannot honour is INVALID_CONFIG naming its key."""
    framework = {
        "min.insync.replicas": "2",
        "retention.bytes": "-1",
        "segment.bytes": "1073741824",
        "compression.type": "producer",
        "message.timestamp.type": "LogAppendTime",
        "max.message.bytes": "2048",
        "unclean.leader.election.enable": "false",
    }
    create_topic(node, "connect.configs", config=framework)
    a = admin(node)
    entries = list(a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "connect.configs")]).values())[0]
    entries = entries.result(TIMEOUT)
    for name, value in framework.items():
        assert entries[name].value == value, name
    assert entries["cleanup.policy"].value == "delete"

    # LogAppendTime: records carry their commit time, whatever the producer said.
    before_ms = int(time.time() * 1000)
    p = producer(node, **{"message.max.bytes": 1 << 20, "batch.size": 1 << 20})
    reports = []
    p.produce("connect.configs", value=b"small", timestamp=1_000, on_delivery=lambda err, msg: reports.append((err, msg)))
    p.flush(TIMEOUT)
    # Over the topic's 2048 bytes, within the listener's 4 MiB: MESSAGE_TOO_LARGE.
    p.produce("connect.configs", value=b"x" * 4096, on_delivery=lambda err, msg: reports.append((err, msg)))
    p.flush(TIMEOUT)
    errors = [err for err, _ in reports]
    assert errors[0] is None and errors[1].code() == KafkaError.MSG_SIZE_TOO_LARGE, errors
    kind, produced_at = reports[0][1].timestamp()
    assert kind == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME and produced_at >= before_ms
    [m] = consume(node, "connect.configs", [0], 1)
    assert m.timestamp() == (confluent_kafka.TIMESTAMP_LOG_APPEND_TIME, produced_at)

    for name, value in [
        ("cleanup.policy", "compact,delete"),
        ("retention.bytes", "1000000"),
        ("compression.type", "zstd"),
        ("max.message.bytes", str(64 << 20)),
        ("follower.replication.throttled.replicas", "*"),
    ]:
        futures = a.create_topics([NewTopic("refused.configs", num_partitions=1, config={name: value})])
        with pytest.raises(KafkaException) as err:
            futures["refused.configs"].result(TIMEOUT)
        assert err.value.args[0].code() == KafkaError.INVALID_CONFIG, (name, err.value)
        assert name in err.value.args[0].str(), (name, err.value)
    assert "refused.configs" not in a.list_topics(timeout=TIMEOUT).topics


def test_admin_creates_describes_and_deletes_topics(node):
    a = admin(node)
    create_topic(node, "admin1", partitions=4, config={"retention.ms": "3600000"})
    md = a.list_topics(timeout=TIMEOUT)
    assert len(md.topics["admin1"].partitions) == 4
    part = md.topics["admin1"].partitions[0]
    assert part.replicas == [part.leader] and part.isrs == [part.leader]
    assert md.controller_id == part.leader and md.cluster_id.startswith("mink-")

    configs = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "admin1")])
    entries = list(configs.values())[0].result(TIMEOUT)
    assert entries["retention.ms"].value == "3600000"

    futures = a.create_topics([NewTopic("admin1", num_partitions=1)])
    with pytest.raises(KafkaException) as err:
        futures["admin1"].result(TIMEOUT)
    assert err.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    futures = a.create_topics([NewTopic("dry", num_partitions=2)], validate_only=True)
    futures["dry"].result(TIMEOUT)
    assert "dry" not in a.list_topics(timeout=TIMEOUT).topics

    futures = a.create_topics([NewTopic("badconf", num_partitions=1, config={"compression.type": "gzip"})])
    with pytest.raises(KafkaException) as err:
        futures["badconf"].result(TIMEOUT)
    assert err.value.args[0].code() == KafkaError.INVALID_CONFIG

    a.delete_topics(["admin1"])["admin1"].result(TIMEOUT)
    assert "admin1" not in a.list_topics(timeout=TIMEOUT).topics
    with pytest.raises(KafkaException) as err:
        a.delete_topics(["admin1"])["admin1"].result(TIMEOUT)
    assert err.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


# -- Raw protocol: framing, negotiation, refusals ---------------------------------------


def request(api_key, version, correlation_id, body=b"", flexible=False):
    """A request frame: header v1 (or v2 with an empty tag buffer) and `body`."""
    client_id = b"raw"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    if flexible:
        header += b"\x00"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def read_response(sock):
    """One response frame's payload, or None when the connection closed."""
    head = recv_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return recv_exact(sock, size)


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def connect(node):
    s = socket.create_connection(("127.0.0.1", node.kafka_port), timeout=TIMEOUT)
    return s


def api_versions_v0(payload):
    """(correlation id, error code, {api_key: (min, max)}) of a v0 ApiVersions response."""
    correlation_id, error = struct.unpack(">ih", payload[:6])
    (count,) = struct.unpack(">i", payload[6:10])
    apis = {}
    for i in range(count):
        key, lo, hi = struct.unpack(">hhh", payload[10 + 6 * i: 16 + 6 * i])
        apis[key] = (lo, hi)
    return correlation_id, error, apis


def fetch_v7(correlation_id, session_id, session_epoch, topic=None):
    """A Fetch v7 request: `topic` partition 0 from offset 0, or no partitions."""
    body = struct.pack(">iiiibii", -1, 0, 1, 1 << 20, 0, session_id, session_epoch)
    if topic is None:
        body += struct.pack(">i", 0)
    else:
        name = topic.encode()
        body += struct.pack(">ih", 1, len(name)) + name + struct.pack(">iiqqi", 1, 0, 0, -1, 1 << 20)
    body += struct.pack(">i", 0)  # forgotten topics
    return request(1, 7, correlation_id, body)


def test_fetch_sessions_are_declined_and_an_incremental_fetch_starts_over(node):
    produce_all(producer(node), "sessions", [(None, b"x", None, None)], partition=0)
    s = connect(node)
    try:
        # A full fetch asking for a new session (id 0, epoch 0): served, session 0.
        s.sendall(fetch_v7(1, 0, 0, "sessions"))
        payload = read_response(s)
        correlation_id, _throttle, error, session = struct.unpack(">iihi", payload[:14])
        assert (correlation_id, error, session) == (1, 0, 0)
        assert b"x" in payload  # the record
        # An incremental fetch of a session no one created: FETCH_SESSION_ID_NOT_FOUND (70).
        s.sendall(fetch_v7(2, 12345, 3))
        correlation_id, _throttle, error, session = struct.unpack(">iihi", read_response(s)[:14])
        assert (correlation_id, error, session) == (2, 70, 0)
        # The connection stays usable.
        s.sendall(fetch_v7(3, 0, -1, "sessions"))
        correlation_id, _throttle, error, _ = struct.unpack(">iihi", read_response(s)[:14])
        assert (correlation_id, error) == (3, 0)
    finally:
        s.close()


def test_api_versions_lists_the_spec_ranges_and_falls_back_for_newer_clients(node):
    s = connect(node)
    try:
        s.sendall(request(18, 0, 7))
        correlation_id, error, apis = api_versions_v0(read_response(s))
        assert (correlation_id, error) == (7, 0)
        assert apis == {
            # OffsetForLeaderEpoch (23) beyond the spec's table: clients validate their
            # positions with it after a leader change (issue 26).
            23: (2, 4),
            # DeleteRecords (21), CreatePartitions (37) and IncrementalAlterConfigs
            # (44), the admin calls people run.
            21: (0, 2), 37: (0, 3), 44: (0, 1),
            18: (0, 3), 3: (1, 12), 60: (0, 1), 0: (3, 9), 1: (4, 12), 2: (1, 7), 22: (0, 4),
            19: (2, 7), 20: (1, 6), 32: (0, 4),
            8: (2, 8), 9: (1, 8), 10: (0, 4), 11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5),
            15: (0, 5), 16: (0, 4), 42: (0, 2),
        }
        # KIP-511: a version we do not serve gets UNSUPPORTED_VERSION (35) in a v0 body
        # that lists our ranges, on a response header v0; the connection stays open.
        s.sendall(request(18, 9, 8, b"\x00\x00\x00", flexible=True))
        correlation_id, error, apis = api_versions_v0(read_response(s))
        assert (correlation_id, error) == (8, 35)
        assert apis[18] == (0, 3)
        s.sendall(request(18, 0, 9))
        assert api_versions_v0(read_response(s))[:2] == (9, 0)
    finally:
        s.close()


def test_describe_configs_v0_is_answered_in_its_own_format(node):
    """DescribeConfigs v0 (older admin tools): is_default where v1 has the source."""
    create_topic(node, "old.admin", config={"retention.ms": "60000"})
    s = connect(node)
    try:
        name = b"old.admin"
        body = struct.pack(">ibh", 1, 2, len(name)) + name + struct.pack(">i", -1)
        s.sendall(request(32, 0, 5, body))
        payload = read_response(s)
        correlation_id, throttle, count = struct.unpack(">iii", payload[:12])
        assert (correlation_id, count) == (5, 1)
        at = 12
        error, message_len = struct.unpack(">hh", payload[at: at + 4])
        assert error == 0 and message_len in (-1, 0)
        at += 4 + max(message_len, 0)
        kind, length = struct.unpack(">bh", payload[at: at + 3])
        at += 3
        assert (kind, payload[at: at + length]) == (2, name)
        at += length
        (configs,) = struct.unpack(">i", payload[at: at + 4])
        at += 4
        seen = {}
        for _ in range(configs):
            (n,) = struct.unpack(">h", payload[at: at + 2])
            key = payload[at + 2: at + 2 + n].decode()
            at += 2 + n
            (n,) = struct.unpack(">h", payload[at: at + 2])
            value = payload[at + 2: at + 2 + n].decode() if n >= 0 else None
            at += 2 + max(n, 0)
            read_only, is_default, sensitive = payload[at: at + 3]
            at += 3
            seen[key] = (value, is_default)
        assert at == len(payload)
        assert seen["retention.ms"] == ("60000", 0)
        assert seen["cleanup.policy"] == ("delete", 1)
        # The connection serves on.
        s.sendall(request(18, 0, 6))
        assert api_versions_v0(read_response(s))[:2] == (6, 0)
    finally:
        s.close()


def test_refused_apis_answer_their_error_and_keep_the_connection(node):
    s = connect(node)
    try:
        # SaslHandshake v1, mechanism PLAIN: UNSUPPORTED_SASL_MECHANISM (33), no mechanisms.
        s.sendall(request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN"))
        payload = read_response(s)
        assert struct.unpack(">ihi", payload[:10]) == (1, 33, 0)
        # EndTxn v1 (transactions are not built): TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53).
        s.sendall(request(26, 1, 2, struct.pack(">h", 2) + b"tx" + struct.pack(">qh", 1, 0) + b"\x01"))
        payload = read_response(s)
        correlation_id, _throttle, error = struct.unpack(">iih", payload[:10])
        assert (correlation_id, error) == (2, 53)
        # AddPartitionsToTxn v1: one error per partition asked, 53.
        body = struct.pack(">h", 2) + b"tx" + struct.pack(">qh", 1, 0) + struct.pack(">i", 1)
        body += struct.pack(">h", 1) + b"t" + struct.pack(">iii", 2, 0, 1)
        s.sendall(request(24, 1, 5, body))
        payload = read_response(s)
        correlation_id, _throttle, topics, name_len = struct.unpack(">iiih", payload[:14])
        assert (correlation_id, topics, name_len) == (5, 1, 1)
        partitions, p0, e0, p1, e1 = struct.unpack(">iihih", payload[15:31])
        assert (partitions, p0, e0, p1, e1) == (2, 0, 53, 1, 53)
        # DescribeAcls v1: SECURITY_DISABLED (54).
        s.sendall(request(29, 1, 3, b"\x01" + b"\xff\xff" + b"\xff\xff" + b"\xff\xff" + b"\x01" + b"\x01" + b"\x01"))
        payload = read_response(s)
        correlation_id, _throttle, error = struct.unpack(">iih", payload[:10])
        assert (correlation_id, error) == (3, 54)
        # Still served.
        s.sendall(request(18, 0, 4))
        assert api_versions_v0(read_response(s))[:2] == (4, 0)
    finally:
        s.close()


def test_transactional_ids_are_refused(node):
    # librdkafka refuses transactions on its own (FindCoordinator is not advertised)...
    p = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "tx-1"})
    with pytest.raises(KafkaException) as err:
        p.init_transactions(TIMEOUT)
    assert err.value.args[0].fatal()
    # ...so the broker's answer is checked directly: InitProducerId v1 with a
    # transactional id is TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53).
    s = connect(node)
    try:
        s.sendall(request(22, 1, 5, struct.pack(">h", 4) + b"tx-1" + struct.pack(">i", 60_000)))
        payload = read_response(s)
        correlation_id, _throttle, error, producer_id = struct.unpack(">iihq", payload[:18])
        assert (correlation_id, error, producer_id) == (5, 53, -1)
        # Without one: a producer id (a writer id), epoch 0.
        s.sendall(request(22, 1, 6, struct.pack(">h", -1) + struct.pack(">i", 60_000)))
        payload = read_response(s)
        correlation_id, _throttle, error, producer_id, epoch = struct.unpack(">iihqh", payload[:20])
        assert (correlation_id, error, epoch) == (6, 0, 0) and producer_id >= 0
    finally:
        s.close()


def test_a_partition_named_twice_in_a_fetch_is_read_and_answered_once(node):
    create_topic(node, "twice")
    produce_all(producer(node), "twice", [(None, b"x" * 1000, None, None)] * 20, partition=0)
    s = connect(node)
    try:
        # Fetch v4: replica -1, max_wait 0, min_bytes 1, max_bytes 1 MiB, read_uncommitted,
        # one topic naming partition 0 three times, each asking 2 GiB - 1.
        part = struct.pack(">iqi", 0, 0, 0x7FFFFFFF)
        body = struct.pack(">iiiib", -1, 0, 1, 1 << 20, 0)
        body += struct.pack(">i", 1) + struct.pack(">h", 5) + b"twice" + struct.pack(">i", 3) + part * 3
        s.sendall(request(1, 4, 9, body))
        payload = read_response(s)
        correlation_id, _throttle, topics = struct.unpack(">iii", payload[:12])
        assert (correlation_id, topics) == (9, 1)
        (name_len,) = struct.unpack(">h", payload[12:14])
        assert payload[14:14 + name_len] == b"twice"
        (partitions,) = struct.unpack(">i", payload[14 + name_len:18 + name_len])
        assert partitions == 1, "one answer for a partition named three times"
        at = 18 + name_len
        index, error, high_watermark = struct.unpack(">ihq", payload[at:at + 14])
        assert (index, error, high_watermark) == (0, 0, 20)
    finally:
        s.close()


def fetch_v4(sock, correlation_id, topic, partitions, max_wait_ms, min_bytes):
    """A raw Fetch v4 of `partitions` (from offset 0); returns ({partition: (error, high
    watermark, record bytes)}, seconds the answer took)."""
    parts = b"".join(struct.pack(">iqi", p, 0, 1 << 20) for p in partitions)
    body = struct.pack(">iiiib", -1, max_wait_ms, min_bytes, 8 << 20, 0)
    body += struct.pack(">i", 1) + struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">i", len(partitions)) + parts
    start = time.monotonic()
    sock.sendall(request(1, 4, correlation_id, body))
    payload = read_response(sock)
    took = time.monotonic() - start
    at = 8  # correlation id, throttle time
    (topics,) = struct.unpack(">i", payload[at:at + 4])
    assert topics == 1
    (name_len,) = struct.unpack(">h", payload[at + 4:at + 6])
    at += 6 + name_len
    (count,) = struct.unpack(">i", payload[at:at + 4])
    at += 4
    out = {}
    for _ in range(count):
        index, error, high_watermark, _lso, aborted = struct.unpack(">ihqqi", payload[at:at + 26])
        at += 26 + max(aborted, 0) * 16
        (size,) = struct.unpack(">i", payload[at:at + 4])
        at += 4 + max(size, 0)
        out[index] = (error, high_watermark, max(size, 0))
    return out, took


def test_fetch_waits_for_min_bytes_across_partitions_and_not_with_min_bytes_zero(node):
    """The answer waits until the total over its partitions reaches min_bytes or max_wait
    passes (checked as a lower bound: never earlier), re-reading a partition that
    trickles; min_bytes 0 answers at once (a loose upper bound far below max_wait)."""
    create_topic(node, "waits", partitions=2)
    p = producer(node)
    produce_all(p, "waits", [(None, b"x" * 100, None, None)], partition=0)
    s = connect(node)
    try:
        # 100 bytes in partition 0, nothing in 1, min_bytes 1 MiB: waits out max_wait.
        got, took = fetch_v4(s, 1, "waits", [0, 1], 1500, 1 << 20)
        assert took >= 1.4, took
        assert got[0][0] == 0 and got[0][1] == 1 and got[0][2] > 100 and got[1][2] == 0
        # One partition alone: the same (it used to answer at once).
        got, took = fetch_v4(s, 2, "waits", [0], 1500, 1 << 20)
        assert took >= 1.4 and got[0][2] > 100, took
        # min_bytes 0 on an empty partition with a 20 s max_wait: at once.
        got, took = fetch_v4(s, 3, "waits", [1], 20_000, 0)
        assert took < 10 and got[1] == (0, 0, 0), (took, got)
        # A partition that trickles: each arrival re-arms its wait, until the total
        # reaches min_bytes (3 records of ~1 KB), well before max_wait.
        def trickle():
            for _ in range(3):
                time.sleep(0.3)
                produce_all(producer(node), "waits", [(None, b"y" * 1000, None, None)], partition=1)

        t = threading.Thread(target=trickle)
        t.start()
        got, took = fetch_v4(s, 4, "waits", [1], 20_000, 2900)
        t.join()
        assert got[1][2] >= 2900 and took < 15, (took, got)
    finally:
        s.close()


def test_garbage_and_oversized_frames_close_only_their_connection(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path, {"MINK_KAFKA__MAX_REQUEST_BYTES": "65536"})
    try:
        create_topic(proc, "steady")
        stop = threading.Event()
        delivered = []
        failures = []

        def keep_producing():
            p = producer(proc, **{"enable.idempotence": True})
            i = 0
            while not stop.is_set():
                p.produce("steady", value=str(i).encode(),
                          on_delivery=lambda err, msg: (failures if err else delivered).append(err or msg.offset()))
                p.poll(0)
                i += 1
                time.sleep(0.002)
            assert p.flush(TIMEOUT) == 0

        t = threading.Thread(target=keep_producing)
        t.start()
        try:
            wait_for(lambda: len(delivered) > 20, TIMEOUT, "the producer delivering")

            # An unknown API key: the connection closes, with a log line naming it.
            s = connect(proc)
            s.sendall(request(9999, 0, 1))
            assert read_response(s) is None
            s.close()
            # Garbage in a well-framed request: closed.
            s = connect(proc)
            s.sendall(struct.pack(">i", 12) + b"\x00\x03\x00\x0c\xde\xad\xbe\xef\xff\xff\xff\xff")
            assert read_response(s) is None
            s.close()
            # An array that claims 2^31-1 elements in a 10-byte body: kafka-protocol
            # sizes the array from that claim before decoding one element (upstream
            # kafka-protocol-rs#161). The node survives it (mimalloc reserves address
            # space without committing it) and closes only this connection.
            s = connect(proc)
            s.sendall(request(3, 1, 2, struct.pack(">i", 0x7FFFFFFF) + b"\x00\x01x"))
            assert read_response(s) is None
            s.close()
            # Oversized: refused from its length alone, the body is never sent.
            s = connect(proc)
            s.sendall(struct.pack(">i", 10_000_000))
            assert read_response(s) is None
            s.close()
            # Truncated: the client goes away mid-frame.
            s = connect(proc)
            s.sendall(struct.pack(">i", 100) + b"\x00\x12")
            s.shutdown(socket.SHUT_WR)
            assert read_response(s) is None
            s.close()

            before = len(delivered)
            wait_for(lambda: len(delivered) > before + 20, TIMEOUT, "the producer delivering after the bad frames")
        finally:
            stop.set()
            t.join(TIMEOUT)
        assert failures == []
        assert sorted(delivered) == list(range(len(delivered))), "no gap, no duplicate"
        log = "".join(proc.lines)
        assert "unknown API key 9999" in log
        assert "a frame of 10000000 bytes is larger than kafka.max_request_bytes (65536)" in log
        assert "the connection closed 2 bytes into a frame of 100 bytes" in log
        assert "a malformed request" in log
    finally:
        proc.kill()


# -- Kafka and Flight see the same tables ------------------------------------------------


def flight_action(client, name, body=None):
    results = list(client.do_action(flight.Action(name, json.dumps(body or {}).encode())))
    return json.loads(results[0].body.to_pybytes())


def test_a_kafka_topic_is_a_table_and_a_flight_table_is_a_topic(node):
    produce_all(producer(node), "clicks", [(b"u1", b"page-1", [("src", b"web")], 1_700_000_000_123)], partition=0)
    client = flight.connect(node.location)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("kafka.clicks"))
        rows = []
        for endpoint in info.endpoints:
            rows.extend(client.do_get(endpoint.ticket).read_all().to_pylist())
        assert len(rows) == 1
        row = rows[0]
        assert (row["key"], row["value"]) == (b"u1", b"page-1")
        assert row["timestamp"].timestamp() * 1000 == 1_700_000_000_123
        # Kafka's record-header encoding: count 1, "src", "web" (zigzag varints).
        assert row["headers"] == b"\x02\x06src\x06web"

        # A table with the four columns, written through Flight, consumed by Kafka.
        descriptor = {
            "schema": {"columns": [
                {"name": "key", "type": "BYTES"},
                {"name": "value", "type": "BYTES"},
                {"name": "headers", "type": "BYTES"},
                {"name": "timestamp", "type": "TIMESTAMP_LTZ(3)", "nullable": False},
            ]},
            "bucket_count": 1,
        }
        flight_action(client, "create_table", {"path": "kafka.from_flight", "descriptor": descriptor})
        schema = pa.schema([
            pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("headers", pa.binary()),
            pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        ])
        batch = pa.record_batch([
            pa.array([b"a", None], pa.binary()), pa.array([b"1", b"2"], pa.binary()),
            pa.array([None, b"\x02\x02h\x02v"], pa.binary()),
            pa.array([1_700_000_000_000, 1_700_000_000_001], pa.timestamp("ms", tz="UTC")),
        ], schema=schema)
        cmd = flight.FlightDescriptor.for_command(json.dumps({"AppendTable": {"path": "kafka.from_flight", "schema_id": 1}}))

        def put():
            writer, reader = client.do_put(cmd, schema)
            writer.write_with_metadata(batch, pa.py_buffer(b"{}"))
            writer.done_writing()
            reader.read()
            writer.close()

        retry(put)
        got = consume(node, "from_flight", [0], 2)
        assert [(m.key(), m.value(), m.headers(), m.timestamp()) for m in got] == [
            (b"a", b"1", None, (1, 1_700_000_000_000)),
            (None, b"2", [("h", b"v")], (1, 1_700_000_000_001)),
        ]

        # Headers a consumer could not read are refused on the Flight write, naming the
        # row; nothing of that write lands, and the partition keeps serving.
        bad = pa.record_batch([
            pa.array([b"k", b"k"], pa.binary()), pa.array([b"3", b"4"], pa.binary()),
            pa.array([b"\x02\x02h\x02v", b"\x80\x80\x80\x80\x80\x00"], pa.binary()),
            pa.array([1_700_000_000_002, 1_700_000_000_003], pa.timestamp("ms", tz="UTC")),
        ], schema=schema)
        with pytest.raises(pa.ArrowInvalid, match="row 1: a header count or length is a varint longer than 5 bytes"):
            writer, reader = client.do_put(cmd, schema)
            try:
                writer.write_with_metadata(bad, pa.py_buffer(b"{}"))
                writer.done_writing()
                reader.read()
            finally:
                writer.close()
        c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "watermarks"})
        try:
            assert c.get_watermark_offsets(TopicPartition("from_flight", 0), timeout=TIMEOUT) == (0, 2)
        finally:
            c.close()

        # Any other table of the database is not a topic.
        other = {"schema": {"columns": [{"name": "id", "type": "BIGINT"}]}}
        flight_action(client, "create_table", {"path": "kafka.not_a_topic", "descriptor": other})
        md = admin(node).list_topics(timeout=TIMEOUT)
        assert "not_a_topic" not in md.topics and "from_flight" in md.topics
    finally:
        client.close()


# -- Consumer groups ----------------------------------------------------------------------


def group_consumer(node, group):
    return Consumer({
        "bootstrap.servers": node.bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
    })


def test_a_group_splits_partitions_hands_over_and_its_offsets_survive_a_restart(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path)
    try:
        create_topic(proc, "grouped", partitions=4)
        p = producer(proc)
        for part in range(4):
            produce_all(p, "grouped", [(None, f"{part}-{i}".encode(), None, None) for i in range(10)], partition=part)

        a, b = group_consumer(proc, "g1"), group_consumer(proc, "g1")
        a.subscribe(["grouped"])
        b.subscribe(["grouped"])
        seen = set()

        def poll(*consumers):
            for c in consumers:
                m = c.poll(0.1)
                if m is not None:
                    assert m.error() is None, m.error()
                    seen.add(m.value())

        def split():
            poll(a, b)
            pa_, pb = {t.partition for t in a.assignment()}, {t.partition for t in b.assignment()}
            return pa_ and pb and not (pa_ & pb) and (pa_ | pb) == {0, 1, 2, 3}

        wait_for(split, 60, "two members splitting four partitions")
        a_admin = admin(proc)
        described = a_admin.describe_consumer_groups(["g1"])["g1"].result(TIMEOUT)
        assert len(described.members) == 2 and str(described.state).endswith("STABLE")
        # B leaves: A takes every partition over.
        b.close()
        wait_for(lambda: (poll(a), len(a.assignment()) == 4)[1], 60, "the remaining member taking over")
        wait_for(lambda: (poll(a), len(seen) == 40)[1], 60, "every record consumed")
        a.commit(asynchronous=False)
        committed = a.committed([TopicPartition("grouped", part) for part in range(4)], timeout=TIMEOUT)
        assert [t.offset for t in committed] == [10, 10, 10, 10]
        a.close()
    finally:
        proc.stop()
    # The lease holder restarts: committed offsets survive in the metadata log.
    again = NodeProcess(mink_node, tmp_path)
    try:
        c = group_consumer(again, "g1")
        committed = c.committed([TopicPartition("grouped", part) for part in range(4)], timeout=TIMEOUT)
        assert [t.offset for t in committed] == [10, 10, 10, 10]
        a = admin(again)
        listed = a.list_consumer_groups().result(TIMEOUT)
        assert "g1" in [g.group_id for g in listed.valid]
        # An Empty group can be deleted, and its offsets with it.
        a.delete_consumer_groups(["g1"])["g1"].result(TIMEOUT)
        committed = c.committed([TopicPartition("grouped", 0)], timeout=TIMEOUT)
        assert committed[0].offset < 0
        c.close()
    finally:
        again.kill()


def test_records_deleted_inside_a_batch_then_a_crash_leave_the_partition_open(mink_node, tmp_path):
    """DeleteRecords at an offset inside a producer's batch, then SIGKILL inside the
    writer-checkpoint interval: the restarted node opens the partition (its log start
    inside the batch), serves fetches from it and takes more records after it."""
    env = {"MINK_LOG__CHECKPOINT_INTERVAL_MS": "600000"}  # the crash comes before any checkpoint
    proc = NodeProcess(mink_node, tmp_path, env)
    try:
        create_topic(proc, "cut")
        p = producer(proc, **{"linger.ms": 50})
        delivered = produce_all(p, "cut", [(None, b"%d" % i, None, None) for i in range(10)], partition=0)
        assert sorted(m.offset() for m in delivered) == list(range(10))
        a = admin(proc)
        [future] = a.delete_records([TopicPartition("cut", 0, 5)]).values()
        assert future.result(TIMEOUT).low_watermark == 5
    finally:
        proc.kill()
    again = NodeProcess(mink_node, tmp_path, env)
    try:
        low, high = wait_for(
            lambda: _watermarks(again, "cut"), 60, "the partition answering after the restart"
        )
        assert (low, high) == (5, 10)
        # consume() asks for offset 0, below the start: the reset goes to the earliest.
        got = consume(again, "cut", [0], 5, **{"auto.offset.reset": "earliest"})
        assert [(m.offset(), m.value()) for m in got] == [(i, b"%d" % i) for i in range(5, 10)]
        more = produce_all(producer(again), "cut", [(None, b"10", None, None)], partition=0)
        assert [m.offset() for m in more] == [10]
    finally:
        again.kill()


def _watermarks(node, topic):
    """The partition's (low, high) watermarks, or None while it cannot answer."""
    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "unused"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=2)
    except KafkaException:
        return None
    finally:
        c.close()


# -- Three nodes -------------------------------------------------------------------------


@pytest.fixture()
def three(mink_node, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    nodes = []
    try:
        for i in range(3):
            nodes.append(NodeProcess(mink_node, tmp_path, {
                "MINK_NODE_ID": f"n{i}",
                "MINK_DATA_DIR": str(tmp_path / f"n{i}"),
                "MINK_OBJECT_STORE__URL": f"file://{shared}",
            }))
        yield nodes
    finally:
        for n in nodes:
            n.kill()


def leaders(node, topic):
    md = admin(node).list_topics(topic, timeout=TIMEOUT)
    return {p.id: p.leader for p in md.topics[topic].partitions.values()}


def test_three_brokers_lead_partitions_and_a_group_reads_them_all(three):
    bootstrap = ",".join(n.bootstrap for n in three)
    create_topic(three[0], "spread", partitions=6)
    wait_for(lambda: all(l >= 0 for l in leaders(three[1], "spread").values()), TIMEOUT, "leaders for every partition")
    md = admin(three[2]).list_topics(timeout=TIMEOUT)
    assert len(md.brokers) == 3
    assert md.controller_id in md.brokers
    assert len(set(leaders(three[0], "spread").values())) > 1, "partitions are led by several brokers"

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    produce_all(p, "spread", [(str(i).encode(), str(i).encode(), None, None) for i in range(300)])
    c = Consumer({"bootstrap.servers": three[1].bootstrap, "group.id": "g3", "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 300})
    try:
        c.subscribe(["spread"])
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 300 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen.append(int(m.value()))
        assert sorted(seen) == list(range(300))
    finally:
        c.close()


def test_an_idempotent_producer_keeps_going_through_a_leader_restart(three, mink_node, tmp_path):
    bootstrap = ",".join(n.bootstrap for n in three)
    create_topic(three[0], "moving", partitions=1)
    wait_for(lambda: leaders(three[0], "moving")[0] >= 0, TIMEOUT, "a leader")
    leader_id = leaders(three[0], "moving")[0]
    brokers = admin(three[0]).list_topics(timeout=TIMEOUT).brokers
    leader_port = brokers[leader_id].port
    victim = next(i for i, n in enumerate(three) if n.kafka_port == leader_port)

    stop = threading.Event()
    delivered, failures = [], []

    def keep_producing():
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2,
                      "message.timeout.ms": 60000})
        i = 0
        while not stop.is_set():
            p.produce("moving", value=str(i).encode(), partition=0,
                      on_delivery=lambda err, msg: (failures if err else delivered).append(err or int(msg.value())))
            p.poll(0)
            i += 1
            time.sleep(0.003)
        p.flush(60)

    t = threading.Thread(target=keep_producing)
    t.start()
    try:
        wait_for(lambda: len(delivered) > 50, TIMEOUT, "deliveries before the restart")
        three[victim].stop()
        before = len(delivered)
        wait_for(lambda: len(delivered) > before + 50, 60, "deliveries at the new leader")
        three[victim] = NodeProcess(mink_node, tmp_path, {
            "MINK_NODE_ID": f"n{victim}",
            "MINK_DATA_DIR": str(tmp_path / f"n{victim}"),
            "MINK_OBJECT_STORE__URL": f"file://{tmp_path / 'shared'}",
        })
        before = len(delivered)
        wait_for(lambda: len(delivered) > before + 50, 60, "deliveries after the old leader came back")
    finally:
        stop.set()
        t.join(90)
    assert failures == []
    count = len(delivered)
    got = consume(three[(victim + 1) % 3], "moving", [0], count)
    values = [int(m.value()) for m in got]
    assert values == sorted(values) and len(set(values)) == len(values), "in order, no duplicate"
    assert values == list(range(count))


def test_pipelined_requests_are_answered_in_request_order(node):
    pipeline_fetch_then_api_versions(node)


def test_one_request_in_flight_at_a_time_still_answers_a_pipeline(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path, {"MINK_KAFKA__MAX_IN_FLIGHT": "1"})
    try:
        pipeline_fetch_then_api_versions(proc)
    finally:
        proc.kill()


def pipeline_fetch_then_api_versions(node):
    create_topic(node, "quiet")
    wait_for(lambda: leaders(node, "quiet")[0] >= 0, TIMEOUT, "a leader")
    # Fetch v4 from the empty partition, waiting up to 300 ms for a byte; then two
    # ApiVersions in the same write. The Fetch is answered first although the others
    # are ready at once.
    topic = b"quiet"
    fetch = struct.pack(">iiiib", -1, 300, 1, 1 << 20, 0) + struct.pack(">i", 1)
    fetch += struct.pack(">h", len(topic)) + topic + struct.pack(">i", 1) + struct.pack(">iqi", 0, 0, 1 << 20)
    s = connect(node)
    try:
        s.sendall(request(1, 4, 1, fetch) + request(18, 0, 2) + request(18, 1, 3))
        order = [struct.unpack(">i", read_response(s)[:4])[0] for _ in range(3)]
        assert order == [1, 2, 3]
    finally:
        s.close()


def test_an_idle_connection_is_closed(mink_node, tmp_path):
    proc = NodeProcess(mink_node, tmp_path, {"MINK_KAFKA__CONNECTION_IDLE_MS": "300"})
    try:
        s = connect(proc)
        s.sendall(request(18, 0, 1))
        assert api_versions_v0(read_response(s))[:2] == (1, 0)
        # Nothing more is sent: the node closes the connection.
        assert read_response(s) is None
        s.close()
        wait_for(lambda: any("closing a connection idle for" in line for line in proc.lines), TIMEOUT, "the log line")
    finally:
        proc.kill()


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: record batches v2 carry it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def zigzag(n):
    z = (n << 1) ^ (n >> 63)
    out = b""
    while z >= 0x80:
        out += bytes([(z & 0x7F) | 0x80])
        z >>= 7
    return out + bytes([z])


def record_batch(producer_id, epoch, base_sequence, values):
    """A record batch v2 of `values` from an idempotent producer, with its CRC."""
    records = b""
    for i, value in enumerate(values):
        body = b"\x00" + zigzag(0) + zigzag(i) + zigzag(-1) + zigzag(len(value)) + value + zigzag(0)
        records += zigzag(len(body)) + body
    now = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", 0, len(values) - 1, now, now, producer_id, epoch, base_sequence, len(values))
    after_crc += records
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", 0, length, -1, 2, crc32c(after_crc)) + after_crc


def produce_raw(sock, correlation_id, topic, batch):
    """Produce v3 of one batch to partition 0; returns (error code, base offset)."""
    body = struct.pack(">hhi", -1, -1, 10_000)
    body += struct.pack(">ih", 1, len(topic)) + topic.encode()
    body += struct.pack(">ii", 1, 0) + struct.pack(">i", len(batch)) + batch
    sock.sendall(request(0, 3, correlation_id, body))
    payload = read_response(sock)
    (got,) = struct.unpack(">i", payload[:4])
    assert got == correlation_id
    (topics, name_len) = struct.unpack(">ih", payload[4:10])
    at = 10 + name_len
    (partitions, index, error, base_offset) = struct.unpack(">iihq", payload[at:at + 18])
    assert (topics, partitions, index) == (1, 1, 0)
    return error, base_offset


def test_producer_epochs_start_at_zero_and_fence_older_ones(node):
    """On the wire, as a producer that bumps its epoch itself sends it: each epoch of a
    producer id starts at sequence 0; once the newer epoch wrote, the older one (a
    retry included) is INVALID_PRODUCER_EPOCH (47); a producer the partition does not
    know that starts past 0 is UNKNOWN_PRODUCER_ID (59); a producer id that was never
    issued (beyond 2^48 - 1) is UNKNOWN_PRODUCER_ID too."""
    create_topic(node, "epochs")
    s = connect(node)
    try:
        # A producer id from InitProducerId.
        s.sendall(request(22, 1, 1, struct.pack(">h", -1) + struct.pack(">i", 60_000)))
        payload = read_response(s)
        _cid, _throttle, error, pid, epoch = struct.unpack(">iihqh", payload[:20])
        assert (error, epoch) == (0, 0)
        assert produce_raw(s, 2, "epochs", record_batch(pid, 0, 3, [b"x"]))[0] == 59
        assert produce_raw(s, 3, "epochs", record_batch(pid, 0, 0, [b"a", b"b"])) == (0, 0)
        assert produce_raw(s, 4, "epochs", record_batch(pid, 0, 2, [b"c"])) == (0, 2)
        # A retry is answered with its original offset.
        assert produce_raw(s, 5, "epochs", record_batch(pid, 0, 2, [b"c"])) == (0, 2)
        # The bump: sequence 0 again, under epoch 1.
        assert produce_raw(s, 6, "epochs", record_batch(pid, 1, 0, [b"d"])) == (0, 3)
        assert produce_raw(s, 7, "epochs", record_batch(pid, 0, 3, [b"late"]))[0] == 47
        assert produce_raw(s, 8, "epochs", record_batch(pid, 0, 2, [b"c"]))[0] == 47
        assert produce_raw(s, 9, "epochs", record_batch(pid, 1, 1, [b"e"])) == (0, 4)
        assert produce_raw(s, 10, "epochs", record_batch(1 << 50, 0, 0, [b"x"]))[0] == 59
    finally:
        s.close()
    got = consume(node, "epochs", [0], 5)
    assert [m.value() for m in got] == [b"a", b"b", b"c", b"d", b"e"]


def test_a_compacted_topic_keeps_the_latest_value_per_key_for_lookups_and_consumers(node):
    """cleanup.policy=compact makes the topic a primary-key table keyed by the record
    key: producers (librdkafka with Kafka's murmur2 partitioner, and kafka-python,
    which uses it by default) upsert keys and delete them with tombstones; consumers
    fetch every change as a record (a tombstone has no value); the latest value per key
    is one Flight lookup away. A record without a key, or with a key of another
    partition, is INVALID_RECORD; so is DeleteRecords (POLICY_VIOLATION), as in Kafka."""
    from kafka import KafkaProducer

    topic = "users.compacted"
    create_topic(node, topic, partitions=3, config={"cleanup.policy": "compact"})
    a = admin(node)
    [f] = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert f.result(TIMEOUT)["cleanup.policy"].value == "compact"

    p = producer(node, **{"partitioner": "murmur2_random", "enable.idempotence": True})
    keys = [f"user-{i}".encode() for i in range(30)]
    produce_all(p, topic, [(k, b"v1", None, None) for k in keys])
    produce_all(p, topic, [(k, b"v2", None, None) for k in keys[:10]])
    produce_all(p, topic, [(k, None, None, None) for k in keys[10:15]])  # tombstones
    # kafka-python's default partitioner is Kafka's: no configuration needed.
    kp = KafkaProducer(bootstrap_servers=node.bootstrap)
    for k in keys[20:25]:
        kp.send(topic, key=k, value=b"v3").get(timeout=TIMEOUT)
    kp.close()

    # Every change, as records, per partition in order; the last per key wins.
    records = consume(node, topic, [0, 1, 2], 30 + 10 + 5 + 5)
    latest = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        latest[m.key()] = m.value()
    assert latest == {
        **{k: b"v2" for k in keys[:10]},
        **{k: None for k in keys[10:15]},
        **{k: b"v1" for k in keys[15:20]},
        **{k: b"v3" for k in keys[20:25]},
        **{k: b"v1" for k in keys[25:]},
    }

    # The current value per key, in place: deleted keys have no row.
    client = flight.connect(node.location)
    body = {"path": f"kafka.{topic}", "keys": [[k.decode()] for k in keys]}
    [answer] = list(client.do_action(flight.Action("lookup", json.dumps(body).encode())))
    found = pa.ipc.open_stream(answer.body.to_pybytes()).read_all()
    current = dict(zip(found.column("key").to_pylist(), found.column("value").to_pylist()))
    assert current == {k: v for k, v in latest.items() if v is not None}

    # Refused as Kafka refuses them.
    for kwargs in [dict(value=b"no key", partition=0), dict(key=keys[0], value=b"x", partition=None)]:
        if kwargs["partition"] is None:
            # The partition its key does not belong to.
            right = [m.partition() for m in records if m.key() == keys[0]][0]
            kwargs["partition"] = (right + 1) % 3
        reports = []
        q = producer(node)
        q.produce(topic, on_delivery=lambda err, msg: reports.append(err), **kwargs)
        q.flush(TIMEOUT)
        assert len(reports) == 1 and reports[0] is not None, reports
        assert reports[0].code() == KafkaError.INVALID_RECORD, reports[0]
    futures = a.delete_records([TopicPartition(topic, 0, 1)])
    with pytest.raises(KafkaException) as refused:
        list(futures.values())[0].result(TIMEOUT)
    assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION, refused.value
    # It cannot grow: every key would move to another partition.
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, NewPartitions

    with pytest.raises(KafkaException) as grows:
        list(a.create_partitions([NewPartitions(topic, 4)]).values())[0].result(TIMEOUT)
    assert grows.value.args[0].code() == KafkaError.INVALID_PARTITIONS, grows.value
    # The policy stays as created.

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException) as stays:
        list(a.incremental_alter_configs([resource]).values())[0].result(TIMEOUT)
    assert stays.value.args[0].code() == KafkaError.INVALID_CONFIG, stays.value
