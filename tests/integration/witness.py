"""Outside witnesses: read what a sink holds with a client Relay does not write with.

Relay's Kafka sink writes with kafka-python; the witness reads the output with confluent-kafka
(librdkafka), ``isolation.level=read_committed``, every partition from its beginning to its last
stable offset. An aborted or still-open transaction's records must be invisible; what is visible is
what a downstream consumer gets. Tables are read with plain SQL.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

SOURCE_HEADER = "relay.source"  # b"<topic>:<partition>:<offset>" on every record the Kafka sink writes
WRITER_HEADER = "relay.writer"  # b"<instance>:<epoch>:<batch>"


@dataclass(frozen=True)
class OutputRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]

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
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"relay-witness-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30)
        parts = sorted(meta.topics[topic].partitions)
        assert parts, f"topic {topic} has no partitions"
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        done: set[int] = set()
        out: list[OutputRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(done) < len(parts):
            assert time.monotonic() < deadline, f"timed out reading {topic} (at the end of {sorted(done)})"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition())
                    continue
                raise AssertionError(f"reading {topic}: {msg.error()}")
            done.discard(msg.partition())
            headers = dict(msg.headers() or [])
            out.append(OutputRecord(msg.partition(), msg.offset(), msg.key(), msg.value(), headers))
        return out
    finally:
        consumer.close()


def exactly_once(records: Iterable[OutputRecord], expected: Iterable[tuple[str, int, int]]) -> None:
    """Every expected input position has exactly one output record, and nothing else was written:
    the check a downstream consumer would make, with the offsets named when it fails."""
    seen = Counter(r.source for r in records)
    want = set(expected)
    twice = sorted(s for s, c in seen.items() if c > 1 and s is not None)
    missing = sorted(want - set(seen))
    extra = sorted((s for s in seen if s not in want), key=str)
    assert (twice, missing, extra) == ([], [], []), (
        f"duplicates {twice[:10]} ({len(twice)}), missing {missing[:10]} ({len(missing)}), "
        f"unexpected {extra[:10]} ({len(extra)})"
    )


def input_positions(
    bootstrap: str, topic: str, keep: Callable[[bytes | None, bytes | None], bool], timeout_s: float = 120.0
) -> set[tuple[str, int, int]]:
    """The input positions whose record ``keep`` accepts (what the transform should write)."""
    records = read_committed(bootstrap, topic, timeout_s)
    return {(topic, r.partition, r.offset) for r in records if keep(r.key, r.value)}
