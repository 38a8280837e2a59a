"""A Kafka consumer group (confluent-kafka, librdkafka) for the chaos harness
(mink-node/tests/it/chaos.rs).

Usage:
  python chaos_kafka_consumer.py KAFKA_ADDRS_FILE TOPIC GROUP
  python chaos_kafka_consumer.py --committed KAFKA_ADDRS_FILE TOPIC GROUP

The first form runs two members of GROUP on TOPIC (one thread each), bootstrapped from
the Kafka addresses listed in KAFKA_ADDRS_FILE, with automatic commits off. Each member
prints one JSON line per record it consumes, {"partition": P, "offset": O, "value": V},
and commits what it consumed about once a second, printing
{"committed": [[P, O], ...]} when the coordinator confirmed the commit. Every 15 s one
member leaves and a new one joins (a rebalance), besides the ones the faults cause; a
member whose brokers are all gone (the nodes restart on new ports) is replaced too.
Runs until killed.

The second form prints the group's committed offsets once, {"final": [[P, O], ...]},
and exits.
"""

import json
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

from chaos_common import live_addresses

OUT = threading.Lock()


def emit(obj):
    with OUT:
        print(json.dumps(obj), flush=True)


def consumer(bootstrap, group):
    return Consumer(
        {
            "bootstrap.servers": ",".join(bootstrap),
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "fetch.wait.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
            "reconnect.backoff.max.ms": 1000,
        }
    )


def commit(c):
    try:
        done = c.commit(asynchronous=False)
    except KafkaException:
        return
    if done:
        offsets = [[tp.partition, tp.offset] for tp in done if tp.error is None and tp.offset >= 0]
        if offsets:
            emit({"committed": offsets})


def member(addrs_file, topic, group, stop, lifetime):
    while not stop.is_set():
        bootstrap = live_addresses(addrs_file)
        if not bootstrap:
            time.sleep(0.2)
            continue
        c = consumer(bootstrap, group)
        c.subscribe([topic])
        started = time.monotonic()
        last_commit = started
        while not stop.is_set():
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                emit({"partition": msg.partition(), "offset": msg.offset(), "value": msg.value().decode(errors="replace")})
            now = time.monotonic()
            if now - last_commit > 1:
                last_commit = now
                commit(c)
            if lifetime is not None and now - started > lifetime:
                break
            if now - started > 5 and set(live_addresses(addrs_file)).isdisjoint(bootstrap):
                break
        commit(c)
        try:
            c.close()
        except KafkaException:
            pass


def final_offsets(addrs_file, topic, group):
    deadline = time.monotonic() + 60
    while True:
        try:
            c = consumer(live_addresses(addrs_file), group)
            meta = c.list_topics(topic, timeout=10)
            partitions = sorted(meta.topics[topic].partitions)
            got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
            c.close()
            emit({"final": [[tp.partition, tp.offset] for tp in got if tp.offset >= 0]})
            return
        except (KafkaException, KeyError) as e:
            if time.monotonic() > deadline:
                emit({"final_error": str(e)[:200]})
                return
            time.sleep(1)


def main():
    if sys.argv[1] == "--committed":
        final_offsets(*sys.argv[2:5])
        return
    addrs_file, topic, group = sys.argv[1:4]
    stop = threading.Event()
    steady = threading.Thread(target=member, args=(addrs_file, topic, group, stop, None), daemon=True)
    steady.start()
    # The churning member: leaves after 15 s, and a new one joins.
    member(addrs_file, topic, group, stop, 15)


if __name__ == "__main__":
    main()
