"""The seeds' KafkaApp: a counter producer for the counter pipeline (``examples/counter``).

Key and value are the counter as text, so the default partitioner spreads records over partitions
and every record says which number it carries. Records carry a ``relay-counter`` header: the next
run continues after the highest *marked* counter in the topic, so a stranger's record (a 50-digit
key, say) cannot move every later run to absurd counters. Poison records (key ``-1``) are records
the job cannot parse, to exercise dead-letter handling.

A broker restart does not end a run. The producer is idempotent with unlimited retries inside a
bounded delivery timeout, which covers a clean restart. A broker that dies hard can lose records it
had acknowledged; the producer then gets ``OutOfOrderSequenceNumberError`` for what follows. After
any failed delivery the run reads back what it wrote and sends again exactly the records the topic
does not hold, so every counter ends up in Kafka once. (Records the broker loses without any error
reaching the producer cannot be seen by it.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from relay.errors import ConfigError, KafkaError
from relay.kafka.counter_key import parse_counter_bytes
from relay.kafka.offsets import KafkaOffsets
from relay.polling import poll

POISON_KEY = b"-1"
COUNTER_HEADER = "relay-counter"  # marks the records this producer wrote (value: b"1")
TAIL_RECORDS = 50  # last records read per partition to find the highest counter (skips poison)
RESEND_ROUNDS = 5  # read back and send again at most this often before giving up
Progress = Callable[[dict[str, Any]], None]


def _marked(record: Any) -> bool:
    return any(k == COUNTER_HEADER for k, _ in record.headers or ())


def _counter(record: Any) -> int | None:
    """The counter of a record shaped like ours (canonical key, value == key); None otherwise."""
    if record.key is None or record.value != record.key:
        return None
    try:
        return parse_counter_bytes(record.key)
    except ValueError:
        return None


def _read(
    bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]], timeout_s: float, what: str
) -> Iterator[Any]:
    """The records of ``topic`` in ``[lo, hi)`` per partition (fewer where retention removed some)."""
    todo = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not todo:
        return
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
        )
    except Exception as exc:
        raise KafkaError(f"Kafka at {bootstrap}: cannot read {what} of topic {topic!r}: {exc}") from exc
    try:
        tps = {p: TopicPartition(topic, p) for p in todo}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            consumer.seek(tp, todo[p][0])
        pending = set(todo)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                for record in records:
                    if record.offset < todo[tp.partition][1]:
                        yield record
            for p in list(pending):  # transaction markers or deleted tails: position reached the end
                if consumer.position(tps[p]) >= todo[p][1]:
                    pending.discard(p)
        if pending:
            raise KafkaError(
                f"Kafka at {bootstrap}: could not read {what} of {topic!r} partitions "
                f"{sorted(pending)} within {timeout_s:g}s"
            )
    finally:
        consumer.close()


def highest_counter(bootstrap: str, topic: str, timeout_s: float = 10) -> int | None:
    """The largest counter among the last records of every partition; None when there is none.

    Only records marked with ``COUNTER_HEADER`` count when there are any; records of older runs
    (no header) are trusted only when no marked record is found. Either way a counter must be
    canonical, within 2^63-1 and equal to the record's value.
    """
    with KafkaOffsets(bootstrap, timeout_s) as offsets:
        earliest, latest = offsets.earliest(topic), offsets.latest(topic)
    tails = {p: (max(earliest[p], latest[p] - TAIL_RECORDS), latest[p]) for p in latest}
    marked: int | None = None
    legacy: int | None = None
    for record in _read(bootstrap, topic, tails, timeout_s, "the last records"):
        n = _counter(record)
        if n is None:
            continue
        if _marked(record):
            marked = n if marked is None else max(marked, n)
        else:
            legacy = n if legacy is None else max(legacy, n)
    return marked if marked is not None else legacy


@dataclass
class _Run:
    """One run's bookkeeping; the delivery callbacks run on the producer's sender thread."""

    first: int
    sent: int = 0
    poison: int = 0
    failed: int = 0  # failures since the last read-back
    failed_total: int = 0
    first_error: str | None = None
    lowest: dict[int, int] = field(default_factory=dict)  # partition -> lowest offset acknowledged

    def acked(self, metadata: Any) -> None:
        if metadata.offset < self.lowest.get(metadata.partition, metadata.offset + 1):
            self.lowest[metadata.partition] = metadata.offset

    def lost(self, exc: BaseException) -> None:
        self.failed += 1
        self.failed_total += 1
        self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"[:300]


class _Sender:
    """A KafkaProducer that is recreated when it breaks, and sends until a deadline, not once."""

    def __init__(self, bootstrap: str, topic: str, run: _Run, delivery_timeout_s: float) -> None:
        self.bootstrap, self.topic, self.run = bootstrap, topic, run
        self.delivery_timeout_s = delivery_timeout_s
        try:  # the first one outside the retry loop: a bad address or setting fails the run at once
            self.producer: KafkaProducer | None = self._new()
        except Exception as exc:
            raise KafkaError(
                f"Kafka at {bootstrap}: cannot create a producer for topic {topic!r}: {exc}"
            ) from exc

    def _new(self) -> KafkaProducer:
        return KafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,  # a retried batch is never written twice
            retries=2**31 - 1,  # bounded by the delivery timeout, not by a count
            retry_backoff_ms=200,
            reconnect_backoff_ms=100,
            reconnect_backoff_max_ms=2000,  # back within ~2 s of a restart (default backs off to 30 s)
            # kafka-python requires delivery > linger + request timeout
            request_timeout_ms=min(15_000, int(self.delivery_timeout_s * 1000) // 2),
            delivery_timeout_ms=int(self.delivery_timeout_s * 1000),
            max_block_ms=10_000,
            linger_ms=5,
        )

    def send(self, key: bytes, value: bytes) -> None:
        """Queue one record; a broken or blocked producer is replaced until the delivery timeout."""
        errors: list[Exception] = []

        def queue() -> bool:
            try:
                if self.producer is None:
                    self.producer = self._new()
                future = self.producer.send(
                    self.topic, key=key, value=value, headers=[(COUNTER_HEADER, b"1")]
                )
            except Exception as exc:  # noqa: BLE001 - kafka-python raises many types; all mean "not queued"
                self.run.lost(exc)
                self.close(timeout_s=1)
                errors.append(exc)
                raise
            future.add_callback(self.run.acked)
            future.add_errback(self.run.lost)
            return True

        poll(  # every 0.5 s a fresh producer: the broker may be restarting
            queue,
            self.delivery_timeout_s,
            0.5,
            transient=(Exception,),
            on_timeout=lambda: KafkaError(
                f"Kafka at {self.bootstrap}: could not send to {self.topic!r} for "
                f"{self.delivery_timeout_s:g}s: {errors[-1] if errors else 'no answer'}"
            ),
        )

    def flush(self) -> None:
        if self.producer is not None:
            try:
                self.producer.flush(timeout=self.delivery_timeout_s + 30)
            except Exception as exc:  # noqa: BLE001 - what was not delivered is found by the read-back
                self.run.lost(exc)
                self.close(timeout_s=1)

    def close(self, timeout_s: float | None = None) -> None:
        if self.producer is not None:
            producer, self.producer = self.producer, None
            _close(producer, timeout_s)


def _close(producer: KafkaProducer, timeout_s: float | None) -> None:
    """Close, also when records are pending on a dead broker (they fail; the read-back finds them).

    kafka-python 3.0.12's ``close()`` flushes first and raises when that times out, leaving its
    sender thread running, and its ``__del__`` raises again later: stop the sender, then close.
    """
    try:
        producer.close(timeout=timeout_s)
        return
    except Exception:  # noqa: BLE001 - the pending records are failed below
        pass
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()  # aborts the pending batches: their futures fail
        sender.join(5)
    try:
        producer.close(timeout=0)
    except Exception:  # noqa: BLE001 - nothing is left to deliver; a broken client must not hide the error
        pass


def _missing(
    bootstrap: str, topic: str, run: _Run, start: dict[int, int], timeout_s: float
) -> tuple[list[int], list[int]]:
    """Counters and poison indexes of this run the topic does not hold (read back from where the run
    started writing, or lower where a broker that lost records gave our records lower offsets)."""
    with KafkaOffsets(bootstrap) as offsets:
        earliest, latest = offsets.earliest(topic), offsets.latest(topic)
    ranges = {
        p: (max(earliest[p], min(start.get(p, 0), run.lowest.get(p, latest[p]))), latest[p]) for p in latest
    }
    seen = bytearray(run.sent)
    poison_seen = bytearray(run.poison)
    for record in _read(bootstrap, topic, ranges, timeout_s, "this run's records"):
        if not _marked(record):
            continue
        n = _counter(record)
        if n is not None and run.first <= n < run.first + run.sent:
            seen[n - run.first] = 1
        elif record.key == POISON_KEY and record.value and record.value.startswith(b"poison-"):
            i = record.value[len(b"poison-") :]
            if i.isdigit() and int(i) < run.poison:
                poison_seen[int(i)] = 1
    return (
        [run.first + i for i, hit in enumerate(seen) if not hit],
        [i for i, hit in enumerate(poison_seen) if not hit],
    )


def produce(
    bootstrap: str,
    topic: str,
    count: int | None,
    rate: float | None,
    poison: int = 0,
    partitions: int = 3,
    progress: Progress | None = None,
    delivery_timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Send ``count`` counter records (None: until interrupted) at ``rate``/s (None: full speed).

    Returns ``{sent, first, last, poison, seconds, failed_deliveries, resent}``; ``first``/``last``
    are the counters sent. KafkaError when records are still missing after RESEND_ROUNDS read-backs.
    """
    if count is not None and count < 0:
        raise ConfigError(f"count must be >= 0, got {count}")
    if rate is not None and not rate > 0:
        raise ConfigError(f"rate must be > 0, got {rate}")
    if poison < 0:
        raise ConfigError(f"poison must be >= 0, got {poison}")
    if not delivery_timeout_s >= 1:
        raise ConfigError(f"delivery timeout must be >= 1 s, got {delivery_timeout_s}")
    with KafkaOffsets(bootstrap) as offsets:
        offsets.ensure_topic(topic, partitions)
        start = offsets.latest(topic)
    previous = highest_counter(bootstrap, topic)
    run = _Run(first=0 if previous is None else previous + 1)
    sender = _Sender(bootstrap, topic, run, delivery_timeout_s)
    started = last_report = time.monotonic()
    resent = 0
    try:
        try:
            while count is None or run.sent < count:
                text = str(run.first + run.sent).encode()
                sender.send(text, text)
                run.sent += 1
                now = time.monotonic()
                if rate is not None:
                    ahead = started + run.sent / rate - now
                    if ahead > 0:
                        time.sleep(ahead)
                if progress is not None and now - last_report >= 1:
                    last_report = now
                    speed = round(run.sent / max(now - started, 1e-9), 1)
                    progress({"sent": run.sent, "last": run.first + run.sent - 1, "rate": speed})
        except KeyboardInterrupt:
            pass  # count=None runs until interrupted: report what was sent
        for i in range(poison):
            sender.send(POISON_KEY, f"poison-{i}".encode())
            run.poison += 1
        sender.flush()
        rounds = 0
        while run.failed:  # some delivery failed: read back, send again exactly what is missing
            run.failed = 0
            read_s = delivery_timeout_s + run.sent / 5000  # even at only 5k records/s, the read ends
            counters, poisons = _missing(bootstrap, topic, run, start, read_s)
            missing = len(counters) + len(poisons)
            if progress is not None:
                progress({"failed_deliveries": run.failed_total, "missing": missing})
            if not missing:
                break
            if rounds == RESEND_ROUNDS:
                raise KafkaError(
                    f"Kafka at {bootstrap}: {missing} record(s) of this run are still not in topic "
                    f"{topic!r} after {RESEND_ROUNDS} resends; first error: {run.first_error}"
                )
            rounds += 1
            for n in counters:
                sender.send(str(n).encode(), str(n).encode())
            for i in poisons:
                sender.send(POISON_KEY, f"poison-{i}".encode())
            resent += missing
            sender.flush()
    finally:
        sender.close()
    return {
        "sent": run.sent,
        "first": run.first if run.sent else None,
        "last": run.first + run.sent - 1 if run.sent else None,
        "poison": run.poison,
        "seconds": round(time.monotonic() - started, 3),
        "failed_deliveries": run.failed_total,
        "resent": resent,
    }
