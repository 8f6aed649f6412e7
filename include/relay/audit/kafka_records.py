"""Re-read a partition's committed record offsets for the deep audit (kafka-python, read_committed).

read_committed because the audit asks which records a pipeline had to apply: an aborted
transaction's records and the transaction markers are offsets without a record for it.
``auto_offset_reset='none'`` because a silent jump over deleted records would hide exactly what the
audit looks for: if retention deletes the range while it is read, the audit fails and says so.
Reads are bounded: at most ``end - start`` offsets, a stall limit instead of an overall deadline
(large ranges take as long as they take), progress every few seconds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self

from kafka import KafkaConsumer, TopicPartition
from kafka import errors as kerrors

from relay.errors import KafkaError

POLL_MS = 500
MAX_POLL_RECORDS = 10_000
ANNOUNCE_OFFSETS = 100_000  # ranges at least this large are announced before they are read


class CommittedRecords:
    """Offsets of the committed records of one topic, partition by partition."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        stall_s: float = 30.0,
        progress: Callable[[str], None] | None = None,
        progress_every_s: float = 5.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.stall_s = stall_s
        self.progress = progress
        self.progress_every_s = progress_every_s
        self._consumer: KafkaConsumer | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):  # closing must never mask the caller's error
                self._consumer.close()
            self._consumer = None

    def _client(self) -> KafkaConsumer:
        if self._consumer is None:
            try:
                self._consumer = KafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    group_id=None,
                    enable_auto_commit=False,
                    isolation_level="read_committed",
                    auto_offset_reset="none",
                    max_poll_records=MAX_POLL_RECORDS,
                    client_id="relay-audit",
                    bootstrap_timeout_ms=int(self.stall_s * 1000),
                )
            except Exception as exc:
                raise KafkaError(
                    f"Kafka at {self.bootstrap}: cannot connect for the deep audit: {exc}"
                ) from exc
        return self._consumer

    def offsets(self, partition: int, start: int, end: int) -> Iterator[int]:
        """Yield the offset of every committed record in ``[start, end)``, ascending."""
        return (record.offset for record in self.records(partition, start, end))

    def records(self, partition: int, start: int, end: int) -> Iterator[Any]:
        """Yield every committed record (kafka-python's ConsumerRecord) in ``[start, end)``, ascending."""
        if end <= start:
            return
        where = f"{self.topic}[{partition}]"
        consumer = self._client()
        tp = TopicPartition(self.topic, partition)
        try:
            consumer.assign([tp])
            consumer.seek(tp, start)
        except Exception as exc:
            raise KafkaError(f"Kafka at {self.bootstrap}: cannot seek {where} to {start}: {exc}") from exc
        if self.progress and end - start >= ANNOUNCE_OFFSETS:
            self.progress(f"deep audit {where}: reading {end - start:,} offsets [{start}, {end})")
        position, moved_at, said_at = start, time.monotonic(), time.monotonic()
        while position < end:
            try:
                batch = consumer.poll(timeout_ms=POLL_MS).get(tp, [])
                for record in batch:
                    if record.offset >= end:
                        return
                    yield record
                now_at = consumer.position(tp, timeout_ms=int(self.stall_s * 1000))
            except kerrors.OffsetOutOfRangeError as exc:
                raise KafkaError(
                    f"Kafka at {self.bootstrap}: offsets of {where} from {position} were deleted while "
                    "the deep audit read them (retention): run the audit again"
                ) from exc
            except kerrors.KafkaError as exc:
                raise KafkaError(
                    f"Kafka at {self.bootstrap}: deep audit read of {where} failed: {exc}"
                ) from exc
            now = time.monotonic()
            if now_at is not None and now_at > position:
                position, moved_at = now_at, now
            elif now - moved_at > self.stall_s:
                raise KafkaError(
                    f"Kafka at {self.bootstrap}: reading {where} made no progress at offset {position} "
                    f"(needed up to {end}) for {self.stall_s:.0f}s: an open transaction holds the last "
                    "stable offset, or the broker does not answer"
                )
            if self.progress and now - said_at >= self.progress_every_s:
                done = min(position, end) - start
                self.progress(f"deep audit {where}: {done:,} of {end - start:,} offsets read")
                said_at = now
