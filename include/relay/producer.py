"""The seeds' KafkaApp: a counter producer for the reference pipeline.

Key and value are the counter as text, so the default partitioner spreads records over partitions
and every record says which number it carries; the audit checks each number was applied exactly once.
The counter continues from the highest one already in the topic, so repeated runs never reuse one.
Poison records (key ``-1``) are records the job cannot parse, to exercise dead-letter handling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from relay.errors import KafkaError
from relay.kafka_offsets import KafkaOffsets

POISON_KEY = b"-1"
TAIL_RECORDS = 50  # last records read per partition to find the highest counter (skips poison)


def highest_counter(bootstrap: str, topic: str, timeout_s: float = 10) -> int | None:
    """The largest counter among the last records of every partition; None when the topic is empty."""
    with KafkaOffsets(bootstrap, timeout_s) as offsets:
        earliest, latest = offsets.earliest(topic), offsets.latest(topic)
    todo = {
        p: (max(earliest[p], latest[p] - TAIL_RECORDS), latest[p]) for p in latest if latest[p] > earliest[p]
    }
    if not todo:
        return None
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
        )
    except Exception as exc:
        raise KafkaError(f"Kafka at {bootstrap}: cannot read the tail of topic {topic!r}: {exc}") from exc
    best: int | None = None
    try:
        tps = [TopicPartition(topic, p) for p in todo]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, todo[tp.partition][0])
        pending = set(todo)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                for record in records:
                    best = _max_counter(best, record.key)
                    if record.offset >= todo[tp.partition][1] - 1:
                        pending.discard(tp.partition)
            for p in list(pending):  # transaction markers or deleted tails: position reached the end
                if consumer.position(TopicPartition(topic, p)) >= todo[p][1]:
                    pending.discard(p)
        if pending:
            raise KafkaError(
                f"Kafka at {bootstrap}: could not read the last records of {topic!r} partitions "
                f"{sorted(pending)} within {timeout_s}s"
            )
    finally:
        consumer.close()
    return best


def _max_counter(best: int | None, key: bytes | None) -> int | None:
    try:
        value = int(key or b"")
    except ValueError:
        return best
    if value < 0:
        return best
    return value if best is None else max(best, value)


def produce(
    bootstrap: str,
    topic: str,
    count: int | None,
    rate: float | None,
    poison: int = 0,
    partitions: int = 3,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Send ``count`` counter records (None: until interrupted) at ``rate``/s (None: full speed).

    Returns ``{sent, first, last, poison, seconds}``; ``first``/``last`` are the counters sent.
    """
    if count is not None and count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    with KafkaOffsets(bootstrap) as offsets:
        offsets.ensure_topic(topic, partitions)
    previous = highest_counter(bootstrap, topic)
    first = 0 if previous is None else previous + 1
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    except Exception as exc:
        raise KafkaError(
            f"Kafka at {bootstrap}: cannot create a producer for topic {topic!r}: {exc}"
        ) from exc
    started = time.monotonic()
    sent = 0
    failures: list[BaseException] = []
    last_report = started
    try:
        try:
            while count is None or sent < count:
                n = first + sent
                text = str(n).encode()
                producer.send(topic, key=text, value=text).add_errback(failures.append)
                sent += 1
                now = time.monotonic()
                if rate is not None:
                    ahead = started + sent / rate - now
                    if ahead > 0:
                        time.sleep(ahead)
                if progress is not None and now - last_report >= 1:
                    last_report = now
                    progress({"sent": sent, "last": n, "rate": round(sent / max(now - started, 1e-9), 1)})
        except KeyboardInterrupt:
            pass  # count=None runs until interrupted: report what was sent
        for i in range(poison):
            producer.send(topic, key=POISON_KEY, value=f"poison-{i}".encode()).add_errback(failures.append)
        producer.flush()
        if failures:
            raise failures[0]
    except Exception as exc:
        raise KafkaError(
            f"Kafka at {bootstrap}: producing to topic {topic!r} failed "
            f"({len(failures)} of {sent} not acknowledged): {exc}"
        ) from exc
    finally:
        producer.close()
    seconds = round(time.monotonic() - started, 3)
    return {
        "sent": sent,
        "first": first if sent else None,
        "last": first + sent - 1 if sent else None,
        "poison": poison,
        "seconds": seconds,
    }
