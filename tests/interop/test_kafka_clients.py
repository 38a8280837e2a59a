"""Kafka clients that share no code with librdkafka (issue 26): kafka-python and
aiokafka, pure Python implementations of the protocol, against one node. Names as
Kafka allows them, group states as Kafka reports them, deletes of groups that never
committed."""

import asyncio
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from node_proc import NodeProcess

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
