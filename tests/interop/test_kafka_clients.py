"""Kafka clients that share no code with librdkafka (issue 26): kafka-python and
aiokafka, pure Python implementations of the protocol. Names as Kafka allows them,
group states as Kafka reports them, deletes of groups that never committed, a group
of polling consumers that settles, and leader epochs across a leader move on three
nodes."""

import asyncio
import json
import logging
import socket
import struct
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

import pyarrow.flight as flight

from node_proc import NodeProcess
from test_cluster import cluster, wait_until  # noqa: F401 - the three-node fixture
from test_flight import action

TIMEOUT_MS = 30_000


def start(mink_node, workdir):
    return NodeProcess(mink_node, workdir, {"MINK_DATA_DIR": str(workdir / "data")})


def states(admin, groups):
    return {g: d.get("group_state") for g, d in admin.describe_groups(groups).items()}


def consume(node, topic, group, count):
    c = KafkaConsumer(
        topic,
        bootstrap_servers=node.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=TIMEOUT_MS,
    )
    seen = []
    for m in c:
        seen.append(m)
        if len(seen) == count:
            break
    return c, seen


def test_kafka_python_dotted_names_group_states_and_deletes(mink_node, tmp_path):
    node = start(mink_node, tmp_path)
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=TIMEOUT_MS)
        admin.create_topics([NewTopic("orders.v1", num_partitions=2, replication_factor=1)])
        assert "orders.v1" in admin.list_topics()
        p = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all")
        for i in range(4):
            p.send("orders.v1", key=b"k%d" % i, value=b"v%d" % i).get(timeout=30)
        p.send("server.db.table", value=b"debezium").get(timeout=30)  # auto-created
        p.close()
        assert "server.db.table" in admin.list_topics()

        # A member that commits, then leaves: Empty, not Dead.
        c, seen = consume(node, "orders.v1", "committer", 4)
        assert sorted(m.value for m in seen) == [b"v0", b"v1", b"v2", b"v3"]
        c.commit()
        assert states(admin, ["committer"]) == {"committer": "Stable"}
        c.close()
        assert states(admin, ["committer", "never-seen"]) == {"committer": "Empty", "never-seen": "Dead"}

        # A member that never commits: its group is deleted without an error.
        c, _ = consume(node, "server.db.table", "no-commits", 1)
        c.close()
        assert states(admin, ["no-commits"]) == {"no-commits": "Empty"}
        deleted = dict(admin.delete_groups(["no-commits"]))
        assert getattr(deleted["no-commits"], "errno", 0) == 0, deleted
        assert states(admin, ["no-commits"]) == {"no-commits": "Dead"}
        admin.close()

        # After a restart the coordinator knows the group only by its committed
        # offsets: still Empty.
        node.stop()
        node = start(mink_node, tmp_path)
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=TIMEOUT_MS)
        deadline = time.monotonic() + 30
        while True:
            try:
                found = states(admin, ["committer"])
                break
            except Exception:  # noqa: BLE001 - the restarted node may not coordinate yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert found == {"committer": "Empty"}
        offsets = admin.list_group_offsets("committer")
        assert sum(o.offset for o in offsets["committer"].values()) == 4, offsets
        admin.close()
    finally:
        node.kill()


def test_aiokafka_produces_and_consumes_a_dotted_topic_in_a_group(mink_node, tmp_path):
    aiokafka = pytest.importorskip("aiokafka")
    node = start(mink_node, tmp_path)

    async def run():
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=node.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait("events.v2", key=b"k", value=b"%d" % i)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(
            "events.v2", bootstrap_servers=node.bootstrap, group_id="aio", auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            seen = []
            while len(seen) < 10:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
                for records in batch.values():
                    seen += [int(r.value) for r in records]
            await consumer.commit()
            return seen
        finally:
            await consumer.stop()

    try:
        assert asyncio.run(run()) == list(range(10))
    finally:
        node.kill()


def generation(consumer):
    """The group generation a kafka-python consumer is in (-1 before it joined)."""
    return consumer._coordinator._generation.generation_id  # noqa: SLF001 - what we observe


def test_kafka_python_consumers_polling_in_turn_settle_in_one_group(mink_node, tmp_path):
    """Two kafka-python consumers started together poll in turn (200 ms each). Each
    completes joins its poll no longer waits for, and joins again; a coordinator
    that rebalanced on every such rejoin made this group climb a generation a second
    with every commit refused. With the initial rebalance delay (the default 3 s
    here), both land in one first rebalance."""
    node = NodeProcess(
        mink_node,
        tmp_path,
        {"MINK_DATA_DIR": str(tmp_path / "data"), "MINK_KAFKA__INITIAL_REBALANCE_DELAY_MS": "3000"},
    )
    consumers = []
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=TIMEOUT_MS)
        admin.create_topics([NewTopic("four", num_partitions=4, replication_factor=1)])
        p = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all")
        for i in range(40):
            p.send("four", key=b"%d" % i, value=b"%d" % i, partition=i % 4)
        p.flush()
        p.close()
        consumers = [
            KafkaConsumer(
                "four",
                bootstrap_servers=node.bootstrap,
                group_id="polling",
                client_id=f"c{i}",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
            for i in range(2)
        ]
        seen = []

        def round_of_polls():
            ok = 0
            for c in consumers:
                for records in c.poll(timeout_ms=200).values():
                    seen.extend(int(r.value) for r in records)
                try:
                    c.commit()
                    ok += 1
                except Exception:  # noqa: BLE001 - refused while the group rebalances
                    pass
            return ok

        deadline = time.monotonic() + 60
        while not (round_of_polls() == 2 and all(len(c.assignment()) == 2 for c in consumers)):
            assert time.monotonic() < deadline, "the group never settled"
        settled_at = [generation(c) for c in consumers]
        assert settled_at[0] == settled_at[1] and settled_at[0] <= 3, settled_at
        # Two heartbeat intervals (3 s each) and more: every commit is taken and
        # nobody rebalances.
        end = time.monotonic() + 8
        while time.monotonic() < end:
            assert round_of_polls() == 2
        assert [generation(c) for c in consumers] == settled_at
        assert sorted(seen) == list(range(40))
        parts = sorted(tp.partition for c in consumers for tp in c.assignment())
        assert parts == [0, 1, 2, 3]
        admin.close()
    finally:
        for c in consumers:
            c.close()
        node.kill()


def offset_for_leader_epoch(node, topic, current_epoch, epoch):
    """(error code, leader epoch, end offset) of a raw OffsetForLeaderEpoch v3 for
    partition 0 of `topic`, sent to `node`."""
    name = topic.encode()
    body = struct.pack(">ii", -1, 1) + struct.pack(">h", len(name)) + name
    body += struct.pack(">iiii", 1, 0, current_epoch, epoch)
    client_id = b"raw"
    header = struct.pack(">hhih", 23, 3, 7, len(client_id)) + client_id
    frame = header + body
    with socket.create_connection(("127.0.0.1", node.kafka_port), timeout=30) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", s.recv(4))
        payload = b""
        while len(payload) < size:
            payload += s.recv(size - len(payload))
    # correlation id, throttle, 1 topic (name), 1 partition.
    at = 4 + 4 + 4
    (length,) = struct.unpack(">h", payload[at: at + 2])
    at += 2 + length + 4
    error, partition, leader_epoch, end = struct.unpack(">hiiq", payload[at: at + 18])
    assert partition == 0
    return error, leader_epoch, end


def test_leader_epochs_across_a_leader_move_with_kafka_python(cluster):
    """A kafka-python consumer reads a partition, its leader moves to another node,
    and it goes on (usually after validating its position with OffsetForLeaderEpoch);
    the node's answers to OffsetForLeaderEpoch are Kafka's for the old epoch, the current one,
    and a stale or unknown current_leader_epoch."""
    nodes, clients = cluster
    boot = ",".join(n.bootstrap for n in nodes)
    admin = KafkaAdminClient(bootstrap_servers=boot, request_timeout_ms=TIMEOUT_MS)
    admin.create_topics([NewTopic("epochs", num_partitions=1, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=boot, acks="all", retries=20)
    for i in range(10):
        producer.send("epochs", value=b"%d" % i).get(timeout=30)
    validations = []

    class Seen(logging.Handler):
        def emit(self, record):
            if "OffsetForLeaderEpoch" in record.getMessage():
                validations.append(record.getMessage())

    fetcher_log = logging.getLogger("kafka.consumer.fetcher")
    fetcher_log.setLevel(logging.DEBUG)
    seen_handler = Seen()
    fetcher_log.addHandler(seen_handler)
    from kafka import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest", enable_auto_commit=False)
    tp = TopicPartition("epochs", 0)
    consumer.assign([tp])
    try:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [(r.offset, r.leader_epoch) for r in records]
        assert [o for o, _ in got] == list(range(10))
        old_epoch = got[-1][1]
        assert old_epoch >= 0

        meta = action(clients[0], "metadata", {"path": "kafka.epochs"})
        [bucket] = meta["buckets"]
        other = next(f"n{i}" for i in range(3) if f"n{i}" != bucket["leader"])
        assert action(clients[0], "rebalance", {"moves": [{"bucket": bucket["bucket"], "to": other}]}) == {"moved": 1}

        def moved():
            m = action(clients[0], "metadata", {"path": "kafka.epochs"})["buckets"][0]
            return m if m["leader"] == other and m["epoch"] > old_epoch else None

        new = wait_until(moved, timeout=30)
        assert new is not None, "the bucket moved"
        for i in range(10, 20):
            producer.send("epochs", value=b"%d" % i).get(timeout=30)
        deadline = time.monotonic() + 60
        while len(got) < 20 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [(r.offset, r.leader_epoch) for r in records]
        assert [o for o, _ in got] == list(range(20)), got
        # Each batch carries the epoch it was written under.
        assert {e for o, e in got if o < 10} == {old_epoch}
        assert {e for o, e in got if o >= 10} == {new["epoch"]}
        # Whether kafka-python validates its position with OffsetForLeaderEpoch here is
        # the client's choice and its timing: it did in most runs, but one fresh-clone
        # run got all 20 records from the new leader without it. So the test does not
        # require it; the node's answers to it are checked directly below.
        print("kafka-python validations:", validations)

        leader = nodes[int(other[1:])]
        current = new["epoch"]
        assert offset_for_leader_epoch(leader, "epochs", current, old_epoch) == (0, old_epoch, 10)
        assert offset_for_leader_epoch(leader, "epochs", current, current) == (0, current, 20)
        assert offset_for_leader_epoch(leader, "epochs", -1, current + 1) == (0, -1, -1)
        fenced, unknown = 74, 75
        assert offset_for_leader_epoch(leader, "epochs", current - 1, current)[0] == fenced
        assert offset_for_leader_epoch(leader, "epochs", current + 1, current)[0] == unknown
    finally:
        fetcher_log.removeHandler(seen_handler)
        consumer.close()
        producer.close()


def test_kafka_python_static_members_restart_without_a_rebalance(mink_node, tmp_path):
    """Static members (group.instance.id): a restarted one takes its old place and
    assignment under a new member id, the other member sees no rebalance, and the group
    has no ghost member."""
    node = start(mink_node, tmp_path)
    consumers = {}
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=TIMEOUT_MS)
        admin.create_topics([NewTopic("static", num_partitions=2, replication_factor=1)])

        def member(instance):
            return KafkaConsumer(
                "static",
                bootstrap_servers=node.bootstrap,
                group_id="statics",
                group_instance_id=instance,
                client_id=instance,
                session_timeout_ms=30_000,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )

        def settle(timeout=60):
            deadline = time.monotonic() + timeout
            while True:
                for c in consumers.values():
                    c.poll(timeout_ms=200)
                if all(len(c.assignment()) == 1 for c in consumers.values()):
                    gens = {generation(c) for c in consumers.values()}
                    if len(gens) == 1:
                        return gens.pop()
                assert time.monotonic() < deadline, "the group never settled"

        consumers["a"] = member("a")
        consumers["b"] = member("b")
        before = settle()
        b_parts = consumers["b"].assignment()
        old_b = consumers["b"]._coordinator._generation.member_id  # noqa: SLF001
        # B's process goes away without leaving (static members never send LeaveGroup)
        # and comes back under the same instance id.
        consumers.pop("b").close()
        consumers["b"] = member("b")
        after = settle()
        assert after == before, "a static member's restart is no rebalance"
        assert consumers["b"].assignment() == b_parts
        assert consumers["b"]._coordinator._generation.member_id != old_b  # noqa: SLF001
        group = admin.describe_groups(["statics"])["statics"]
        members = group.get("members") or []
        assert len(members) == 2, group
        assert sorted(m.get("group_instance_id") for m in members) == ["a", "b"], members
        admin.close()
    finally:
        for c in consumers.values():
            c.close()
        node.kill()


def test_kafka_python_deletes_records_and_adds_partitions(mink_node, tmp_path):
    """DeleteRecords moves the log start (fetching below it is OFFSET_OUT_OF_RANGE),
    CreatePartitions grows a topic that producers and consumers then use, and what
    cannot be done is refused with Kafka's error."""
    from kafka import TopicPartition
    from kafka.errors import InvalidPartitionsError

    node = start(mink_node, tmp_path)
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=TIMEOUT_MS)
        admin.create_topics([NewTopic("trimmed", num_partitions=1, replication_factor=1)])
        p = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all")
        for i in range(10):
            p.send("trimmed", value=b"%d" % i, partition=0).get(timeout=30)
        tp = TopicPartition("trimmed", 0)
        deleted = admin.delete_records({tp: 6})
        assert deleted[tp]["low_watermark"] == 6, deleted
        c = KafkaConsumer(bootstrap_servers=node.bootstrap, auto_offset_reset="none", enable_auto_commit=False)
        c.assign([tp])
        assert c.beginning_offsets([tp]) == {tp: 6}
        c.seek(tp, 2)
        with pytest.raises(Exception) as below:
            for _ in range(20):
                c.poll(timeout_ms=500)
        assert "OffsetOutOfRange" in type(below.value).__name__ or "out of range" in str(below.value).lower(), below.value
        c.seek(tp, 6)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                got += [int(r.value) for r in records]
        assert got == [6, 7, 8, 9]
        c.close()

        # Two more partitions, used at once.
        admin.create_partitions({"trimmed": 3})
        deadline = time.monotonic() + 30
        while len(admin.describe_topics(["trimmed"])[0]["partitions"]) != 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        p.close()
        p = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all")
        assert p.send("trimmed", value=b"new", partition=2).get(timeout=30).offset == 0
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"trimmed": 2})
        p.close()
        admin.close()
    finally:
        node.kill()


def test_kafka_python_offsets_expire_only_after_their_group_empties(mink_node, tmp_path):
    """KIP-211 on a node: with a short retention and expiry round, the offsets of a
    group whose last member left expire, while those of a group that still has a
    member are kept past the same retention, whatever its commits."""
    node = NodeProcess(
        mink_node,
        tmp_path,
        {
            "MINK_DATA_DIR": str(tmp_path / "data"),
            "MINK_KAFKA__GROUP_OFFSETS_TTL_MS": "1500",
            "MINK_META__OFFSETS_EXPIRE_INTERVAL_MS": "200",
        },
    )
    live = None
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=TIMEOUT_MS)
        admin.create_topics([NewTopic("retained", num_partitions=1, replication_factor=1)])
        p = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all")
        for i in range(5):
            p.send("retained", value=b"%d" % i).get(timeout=30)
        p.close()

        def member(group):
            return KafkaConsumer(
                "retained",
                bootstrap_servers=node.bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=6000,
                heartbeat_interval_ms=500,
            )

        def read_and_commit(c):
            got = 0
            deadline = time.monotonic() + 30
            while got < 5 and time.monotonic() < deadline:
                got += sum(len(r) for r in c.poll(timeout_ms=500).values())
            assert got == 5
            c.commit()

        gone = member("gone")
        read_and_commit(gone)
        gone.close()  # LeaveGroup: the group is Empty, its retention starts
        live = member("live")
        read_and_commit(live)

        def offsets(group):
            got = admin.list_group_offsets(group).get(group) or {}
            return {tp.partition: o.offset for tp, o in got.items() if o.offset >= 0}

        assert offsets("live") == {0: 5}
        deadline = time.monotonic() + 30
        while offsets("gone"):
            assert time.monotonic() < deadline, "the empty group's offsets did not expire"
            live.poll(timeout_ms=200)  # the live member stays in its group
        # Past twice the retention since the live group committed: still there.
        until = time.monotonic() + 3.5
        while time.monotonic() < until:
            live.poll(timeout_ms=200)
        assert offsets("live") == {0: 5}
        admin.close()
    finally:
        if live:
            live.close()
        node.kill()


def test_a_compacted_topic_on_three_nodes_with_kafka_python_and_aiokafka(cluster):
    """A compacted topic whose partitions are led by three nodes: kafka-python upserts
    and deletes keys (its default partitioner is Kafka's, so every key goes where the
    topic keeps it), aiokafka reads every change with tombstones as records without a
    value, and a lookup through any node answers each key's latest value."""
    from aiokafka import AIOKafkaConsumer, TopicPartition as AioTopicPartition

    nodes, clients = cluster
    boot = ",".join(n.bootstrap for n in nodes)
    admin = KafkaAdminClient(bootstrap_servers=boot, request_timeout_ms=TIMEOUT_MS)
    admin.create_topics(
        [NewTopic("accounts", num_partitions=6, replication_factor=1, topic_configs={"cleanup.policy": "compact"})]
    )
    admin.close()
    leaders = {b["leader"] for b in action(clients[0], "metadata", {"path": "kafka.accounts"})["buckets"]}
    assert len(leaders) > 1, leaders
    producer = KafkaProducer(bootstrap_servers=boot, acks="all", retries=20)
    keys = [b"acct-%d" % i for i in range(40)]
    for k in keys:
        producer.send("accounts", key=k, value=b"open").get(timeout=30)
    for k in keys[:10]:
        producer.send("accounts", key=k, value=b"closed").get(timeout=30)
    for k in keys[30:]:
        producer.send("accounts", key=k, value=None).get(timeout=30)
    producer.close()
    want = {**{k: b"open" for k in keys}, **{k: b"closed" for k in keys[:10]}, **{k: None for k in keys[30:]}}

    async def read_all():
        consumer = AIOKafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition("accounts", p) for p in range(6)])
            latest, count = {}, 0
            deadline = time.monotonic() + 30
            while count < 60 and time.monotonic() < deadline:
                for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                    for r in records:
                        latest[r.key] = r.value
                        count += 1
            return latest, count
        finally:
            await consumer.stop()

    latest, count = asyncio.run(read_all())
    assert count == 60 and latest == want, (count, latest)
    for client in clients:
        body = {"path": "kafka.accounts", "keys": [[k.decode()] for k in keys]}
        [answer] = list(client.do_action(flight.Action("lookup", json.dumps(body).encode())))
        import pyarrow as pa

        found = pa.ipc.open_stream(answer.body.to_pybytes()).read_all()
        assert dict(zip(found.column("key").to_pylist(), found.column("value").to_pylist())) == {
            k: v for k, v in want.items() if v is not None
        }
