"""Kafka load generator for `cargo xtask bench kafka`, with librdkafka (confluent-kafka):
a client we did not write. Prints one JSON object.

    kafka_load.py BOOTSTRAP TOPIC SECONDS
"""

import json
import statistics
import sys
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
PARTITIONS = 4
VALUE = b"x" * 1024


def produce_throughput():
    """Closed loop for `seconds`: acks=all, idempotent, 1 KiB records."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "queue.buffering.max.kbytes": 256 * 1024,
        }
    )
    acked = [0]
    errors = []

    def done(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            acked[0] += 1

    start = time.monotonic()
    deadline = start + seconds
    sent = 0
    while time.monotonic() < deadline:
        try:
            p.produce(topic, value=VALUE, key=str(sent).encode(), on_delivery=done)
            sent += 1
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.flush(120)
    elapsed = time.monotonic() - start
    assert not errors, errors[:3]
    return acked[0], acked[0] * len(VALUE) / elapsed / 1e6


def consume_throughput(count):
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 << 20,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = 0
    start = time.monotonic()
    while got < count and time.monotonic() - start < 120:
        for m in c.consume(10_000, 1.0):
            if m.error() is None:
                got += 1
    elapsed = time.monotonic() - start
    c.close()
    return got, got * len(VALUE) / elapsed / 1e6


def latency(samples=300):
    """Produce→consume: records stamped with the send time, read by a tailing consumer."""
    lat_topic = topic + "-lat"
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0})
    p.produce(lat_topic, value=b"warm")
    p.flush(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lat", "enable.auto.commit": False, "fetch.wait.max.ms": 500})
    c.assign([TopicPartition(lat_topic, q, 0) for q in range(PARTITIONS)])
    seen = []
    stop = threading.Event()

    def read():
        while not stop.is_set():
            m = c.poll(0.1)
            if m is None or m.error() is not None or m.value() == b"warm":
                continue
            seen.append((time.time_ns() - int(m.value())) / 1e6)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(1.0)
    for _ in range(samples):
        p.produce(lat_topic, value=str(time.time_ns()).encode())
        p.poll(0)
        time.sleep(0.01)
    p.flush(30)
    deadline = time.monotonic() + 30
    while len(seen) < samples and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join()
    c.close()
    seen.sort()
    return statistics.median(seen), seen[int(len(seen) * 0.99) - 1], len(seen)


produced, produce_mbps = produce_throughput()
consumed, consume_mbps = consume_throughput(produced)
p50, p99, n = latency()
print(
    json.dumps(
        {
            "produced": produced,
            "produce_mbps": produce_mbps,
            "consumed": consumed,
            "consume_mbps": consume_mbps,
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "latency_samples": n,
        }
    )
)
