"""Kafka load generator for `cargo xtask bench kafka`, with librdkafka (confluent-kafka):
a client we did not write. Prints one JSON object.

    kafka_load.py produce BOOTSTRAP TOPIC SECONDS   produce MB/s and this client's CPU
    kafka_load.py read BOOTSTRAP TOPIC COUNT        consume MB/s, produce→consume latency
"""

import json
import statistics
import sys
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

mode, bootstrap, topic, arg = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
PARTITIONS = 4
VALUE = b"x" * 1024


def produce_throughput():
    """Closed loop for `seconds`: acks=all, idempotent, 1 KiB records.

    The client is made cheap so that it measures the broker, not Python: records are
    queued with `produce_batch` from prebuilt lists (keys cycle through 4,000), and
    librdkafka reports failed deliveries only; what was acknowledged is what was queued
    less the failures, once `flush` returned with nothing left in the queue.

    Each list of 1,000 records goes to one partition, the partitions in turn, as the
    Flight baseline sends each batch of 1,000 rows to one bucket. Letting librdkafka
    partition record by record (by key) cost this process a quarter more CPU per GB
    (3.7-3.8 against 2.8-3.0 CPU seconds, three alternating runs each): a partition
    lookup under a lock per record, in the one thread that also queues them.
    """
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "queue.buffering.max.kbytes": 256 * 1024,
            "delivery.report.only.error": True,
        }
    )
    errors = []

    def failed(err, msg):
        errors.append(str(err))

    chunks = [
        [{"value": VALUE, "key": str(c * 1_000 + i).encode()} for i in range(1_000)]
        for c in range(4)
    ]
    start = time.monotonic()
    deadline = start + float(arg)
    queued = 0
    while time.monotonic() < deadline:
        chunk = chunks[(queued // 1_000) % len(chunks)]
        try:
            n = p.produce_batch(topic, chunk, partition=(queued // 1_000) % PARTITIONS, on_delivery=failed)
        except BufferError:
            n = 0
        queued += n
        if n < len(chunk):
            # The queue is full (a partial batch is not retried: its rest is dropped,
            # and only what was queued counts).
            p.poll(0.01)
        p.poll(0)
    left = p.flush(120)
    elapsed = time.monotonic() - start
    assert not errors, errors[:3]
    assert left == 0, f"{left} records undelivered"
    return queued, queued * len(VALUE) / elapsed / 1e6


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


if mode == "produce":
    cpu = time.process_time()  # every thread of this process: Python and librdkafka's
    produced, produce_mbps = produce_throughput()
    out = {"produced": produced, "produce_mbps": produce_mbps, "client_cpu_s": time.process_time() - cpu}
else:
    consumed, consume_mbps = consume_throughput(int(arg))
    p50, p99, n = latency()
    out = {
        "consumed": consumed,
        "consume_mbps": consume_mbps,
        "latency_p50_ms": p50,
        "latency_p99_ms": p99,
        "latency_samples": n,
    }
print(json.dumps(out))
