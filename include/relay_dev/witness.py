"""The outside witness of Kafka output: what a downstream consumer of another client sees.

Relay's Kafka sink writes with kafka-python; this reads with confluent-kafka (librdkafka),
``isolation.level=read_committed``, every partition from its beginning to its last stable offset:
an aborted or still-open transaction's records are invisible, what is visible is what a downstream
consumer gets. Developer tooling (tests, chaos): confluent-kafka is never a runtime dependency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition
from relay.sinks.kafka_transactional import SOURCE_HEADER, WRITER_HEADER


@dataclass(frozen=True)
class OutputRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp: tuple[int, int] | None = None  # confluent-kafka's (type, ms): 1 create, 2 log append

    @property
    def source(self) -> tuple[str, int, int] | None:
        """The input record this one came from (its source position header), None without one."""
        raw = self.headers.get(SOURCE_HEADER)
        if raw is None:
            return None
        topic, partition, offset = raw.decode().rsplit(":", 2)
        return topic, int(partition), int(offset)

    @property
    def writer(self) -> str | None:
        raw = self.headers.get(WRITER_HEADER)
        return None if raw is None else raw.decode()


def read_committed(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list[OutputRecord]:
    """Every record of ``topic`` a read_committed consumer sees, partition by partition."""
    return read_topic(bootstrap, topic, timeout_s, "read_committed")


def read_topic(bootstrap: str, topic: str, timeout_s: float, isolation: str) -> list[OutputRecord]:
    """Every record of ``topic`` a consumer at ``isolation`` sees, partition by partition, from each
    partition's beginning to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"relay-witness-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30)
        parts = sorted(meta.topics[topic].partitions)
        if not parts:
            raise ValueError(f"topic {topic} has no partitions")
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        done: set[int] = set()
        out: list[OutputRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took over {timeout_s:g}s (ended: {sorted(done)})")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition())
                    continue
                if not msg.topic() and not msg.error().fatal():
                    # a client-level event (the group coordinator's lookup, which an assign()-only
                    # reader never needs): librdkafka retries it; a record it hid would show as
                    # missing, never as read, so the count stays honest
                    continue
                raise RuntimeError(f"reading {topic}: {msg.error()}")
            done.discard(msg.partition())
            headers = dict(msg.headers() or [])
            out.append(
                OutputRecord(msg.partition(), msg.offset(), msg.key(), msg.value(), headers, msg.timestamp())
            )
        return out
    finally:
        consumer.close()
