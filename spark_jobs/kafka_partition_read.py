"""Reading one Kafka partition's offset range on an executor, as Arrow batches Spark takes as they are.

Kept apart from :mod:`kafka_source` (the planner: offsets, limits, leases, data loss before a batch):
this is the executor's hot path. Each Python worker keeps one pooled consumer across tasks and
batches (:func:`worker_pool`) and asks each poll for no more records than the range still needs.
Under failOnDataLoss (the default) a task makes no offset look-up before reading: a range starting
below the log start fails its first fetch (the consumer never auto-resets) and raises DataLossError.
"""

from __future__ import annotations

import bisect
import importlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from kafka_consumer_pool import drop_consumer, pooled_consumer
from kafka_offsets_plan import ReadRange
from kafka_source_options import SourceSettings
from pyspark.sql.datasource import InputPartition
from relay.errors import DataLossError, KafkaError

log = logging.getLogger(__name__)

_ARROW_CHUNK_ROWS = 8192  # rows per RecordBatch at least (a poll's worth more): bounded, few round trips
_POLL_MAX_RECORDS = 10_000  # records per poll at most (the pooled consumer's max_poll_records)


class KafkaInputPartition(InputPartition):
    """One Spark task: the half-open offset range [start, end) of one Kafka partition (small, picklable)."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KafkaInputPartition) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


class KafkaInputGroup(InputPartition):
    """One Spark task reading several ranges one after another (see :func:`group_ranges`)."""

    def __init__(self, ranges: tuple[ReadRange, ...]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KafkaInputGroup) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def read_partition(
    s: SourceSettings, schema: Any, topic: str, number: int, begin: int, end: int
) -> Iterator[Any]:
    """Yield the records of [begin, end) of partition ``number`` of ``topic`` as pyarrow
    RecordBatches in ``schema`` (Spark's Kafka schema as Arrow).

    Reads until the consumer's position reaches ``end`` rather than until a record with offset
    ``end - 1`` arrives: offsets have holes (transaction markers, compaction, aborted records).
    """
    import pyarrow as pa
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError as VendorKafkaError
    from kafka.errors import OffsetOutOfRangeError

    tp = TopicPartition(topic, number)
    take, drop = worker_pool()
    consumer = take(s, KafkaConsumer)
    healthy = False
    try:
        consumer.assign([tp])
        start = begin
        if not s.fail_on_data_loss:  # skip forward over deleted records (strict: see the poll below)
            first = int(consumer.beginning_offsets([tp])[tp])
            if start < first:
                log.warning(
                    "%s; failOnDataLoss=false: reading from %d",
                    DataLossError(tp.topic, tp.partition, start, first),
                    first,
                )
                start = first
        if start >= end:
            healthy = True
            return
        consumer.seek(tp, start)
        pending: list[tuple[Any, ...]] = []  # (offset, timestamp ms, type, key, value)
        tuples = getattr(consumer, "relay_tuples", False)
        deadline = time.monotonic() + s.poll_timeout_ms / 1000
        position = start
        while position < end:
            try:
                # Ask for no more than the range still needs: kafka-python decodes up to
                # max_records of the fetched data per poll, and records past ``end`` were
                # decoded for nothing (a 3,333-record task decoded 10,000).
                fetched = consumer.poll(
                    timeout_ms=min(1000, s.poll_timeout_ms),
                    max_records=min(end - position, _POLL_MAX_RECORDS),
                )
            except OffsetOutOfRangeError:
                # Strict reads find deleted records here, not by a look-up per task: the consumer
                # never auto-resets (auto_offset_reset='none'), so a fetch below the log start fails.
                earliest_now = int(consumer.beginning_offsets([tp])[tp])
                raise DataLossError(tp.topic, tp.partition, position, earliest_now) from None
            records = fetched.get(tp, ())
            if records and not tuples:  # kafka-python's ConsumerRecords: the same five fields
                records = [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value) for r in records]
            if records and records[-1][0] >= end:  # offsets have holes: a poll may pass ``end``
                records = records[: bisect.bisect_left(records, (end,))]
            pending.extend(records)
            if len(pending) >= _ARROW_CHUNK_ROWS:
                yield _to_record_batch(pa, schema, tp.topic, tp.partition, pending)
                pending = []
            new_position = int(consumer.position(tp))
            if new_position > position:
                position = new_position
                deadline = time.monotonic() + s.poll_timeout_ms / 1000
            elif time.monotonic() > deadline:
                raise KafkaError(
                    f"{tp.topic}[{tp.partition}]: no record at offset {position} within "
                    f"{s.poll_timeout_ms} ms (batch needs [{begin}, {end})); "
                    "raise pollTimeoutMs or check the broker"
                )
        if pending:
            yield _to_record_batch(pa, schema, tp.topic, tp.partition, pending)
        healthy = True
    except VendorKafkaError as exc:
        raise KafkaError(f"reading {tp.topic}[{tp.partition}] failed: {exc}") from exc
    finally:
        if not healthy:  # never reuse a consumer in an unknown state
            drop(s, consumer)


def warm_arrow() -> None:
    """Do once what a worker's first read does once: pyarrow's first conversion of a Python list
    imports pandas (0.8 s with bytecode, 1.8 s without, measured), so a standby's warm-up runs one."""
    import pyarrow as pa

    pa.array([0], pa.int64())


def worker_pool() -> tuple[Callable[..., Any], Callable[..., None]]:
    """``(pooled_consumer, drop_consumer)`` of the ``kafka_consumer_pool`` module imported by name in
    this process: its pool lives as long as the Python worker.

    ``kafka_source.register`` pickles the source's modules by value, so every task unpickles fresh
    copies of their globals: a pool reached through them is a new, empty dict in every task
    (measured: a new consumer per task -- connection, API versions, metadata -- and the previous one
    never closed). The worker imports the real module once, from the job's zip on its path, and
    keeps it in ``sys.modules``; ``driver_checks.warm_up_executors`` warms the same one. Where it
    cannot be imported, the by-value copies serve (a consumer per task, as before).
    """
    try:
        real = importlib.import_module("kafka_consumer_pool")
    except ImportError:
        return pooled_consumer, drop_consumer
    return real.pooled_consumer, real.drop_consumer


def _to_record_batch(pa: Any, schema: Any, topic: str, partition: int, records: list[tuple[Any, ...]]) -> Any:
    """Records -> one RecordBatch in exactly the Arrow schema Spark expects (it compares schemas);
    columns made by one transposition, the timestamps converted from ms by Arrow."""
    n = len(records)
    offsets, stamps, types, keys, values = zip(*records)
    micros = pa.array(stamps, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            micros,
            pa.array(types, pa.int32()),
        ],
        schema=schema,
    )
