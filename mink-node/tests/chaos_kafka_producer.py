"""An idempotent Kafka producer (confluent-kafka, librdkafka) for the chaos harness
(mink-node/tests/it/chaos.rs).

Usage: python chaos_kafka_producer.py KAFKA_ADDRS_FILE TOPIC

Produces records whose value is a decimal id (0, 1, 2, ...) to TOPIC with
`enable.idempotence` and `acks=all`, bootstrapped from the Kafka addresses listed in
KAFKA_ADDRS_FILE, and prints one JSON line per delivery report:
{"id": N, "partition": P, "offset": O} when acknowledged, {"failed": N, "error": "..."}
otherwise. librdkafka retries a batch itself (same producer id and sequence, which the
leader deduplicates) and never sends a record again once it reported it failed, so an
acknowledged record must be in the topic exactly once, at the reported offset, and a
failed one at most once. When every broker the producer was started with is gone (the
nodes restart on new ports) or the producer hit a fatal error, it is flushed and
replaced by a new one. Runs until killed.
"""

import json
import sys
import time

from confluent_kafka import Producer

from chaos_common import live_addresses


def main():
    addrs_file, topic = sys.argv[1], sys.argv[2]
    n = 0
    while True:
        bootstrap = live_addresses(addrs_file)
        if not bootstrap:
            time.sleep(0.2)
            continue
        fatal = []

        def report(err, msg):
            rid = int(msg.value())
            if err is None:
                print(json.dumps({"id": rid, "partition": msg.partition(), "offset": msg.offset()}), flush=True)
            else:
                print(json.dumps({"failed": rid, "error": str(err)[:200]}), flush=True)
                if err.fatal():
                    fatal.append(err)

        producer = Producer(
            {
                "bootstrap.servers": ",".join(bootstrap),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 20000,
                "topic.metadata.refresh.interval.ms": 1000,
                "reconnect.backoff.max.ms": 1000,
                # Idempotence state changes (drains, epoch bumps) into the log.
                "debug": "eos",
            }
        )
        started = time.monotonic()
        while not fatal:
            try:
                producer.produce(topic, value=str(n).encode(), on_delivery=report)
                n += 1
            except BufferError:
                producer.poll(0.1)
                continue
            producer.poll(0)
            time.sleep(0.002)
            if time.monotonic() - started > 5 and set(live_addresses(addrs_file)).isdisjoint(bootstrap):
                break
        producer.flush(30)


if __name__ == "__main__":
    main()
