"""A Spark Structured Streaming source for Kafka written with Spark's Python Data Source API.

Why it exists: the pyspark wheel ships no ``spark-sql-kafka`` jar and Maven Central is out of reach
where Relay was built, so it reads Kafka through kafka-python. The source mimics Spark's own Kafka
source where users can see it -- schema, option names, the offset JSON stored in the checkpoint
(``{"topic": {"0": next_offset}}``), ``maxOffsetsPerTrigger`` splitting and ``failOnDataLoss`` -- so a
job can switch to the JVM connector where its jar exists without touching checkpoints or sinks.
Register it with :func:`register` and read with ``spark.readStream.format("relaykafka")``.

Where the code runs: ``initialOffset``/``latestOffset``/``partitions``/``commit`` run in one long-lived
Python process the driver JVM starts (the "planner"); ``read`` runs in executor Python workers from a
pickled copy of the reader. The planner keeps one lazily created consumer for metadata and offsets;
``read`` (:mod:`kafka_partition_read`) uses its Python worker's pooled consumer, kept across tasks and
batches. No group, no auto commit: Spark's checkpoint, and Relay's ledger, own the positions.

What the next batch reads is decided in :mod:`kafka_offsets_plan` (pure functions: bounded batches,
data loss, new partitions, lease caps); the options are validated in :mod:`kafka_source_options`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import batch_sizing
import kafka_consumer_pool
import kafka_fast_records
import kafka_offsets_plan
import kafka_partition_read
import kafka_source_options
from batch_sizing import BatchSizer, memory_cap_rows
from kafka_offsets_plan import (
    EARLIEST,
    LATEST,
    SOURCE_NAME,
    OffsetJson,
    PartitionOffsets,
    ReadRange,
    batch_row_limit,
    from_offset_json,
    group_ranges,
    parse_starting_offsets,
    plan_batch_end,
    to_offset_json,
)
from kafka_partition_read import KafkaInputGroup, KafkaInputPartition, read_partition
from kafka_source_options import SourceSettings, ledger_url_from_env, session_limits
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from relay.errors import ConfigError, KafkaError, LedgerUnavailableError
from relay.ledger.outage import Outage, ride_out

log = logging.getLogger(__name__)

#: Spark's own Kafka source schema (KafkaRecordToRowConverter.kafkaSchema), all fields nullable.
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)

METADATA_REFRESH_S = 10.0  # how often the planner looks for new partitions (a full metadata refresh)
REPORT_REUSE_S = 1.0  # reportLatestOffset reuses latestOffset's broker ends read this recently


class KafkaDataSource(DataSource):
    """``spark.readStream.format("relaykafka")``: Kafka through kafka-python, Spark's Kafka schema."""

    @classmethod
    def name(cls) -> str:
        """'kafka' is taken by Spark's (absent) JVM connector, hence a name of our own."""
        return SOURCE_NAME

    def schema(self) -> StructType:
        """Spark's Kafka source schema, so sinks written for the JVM connector work unchanged."""
        return KAFKA_SCHEMA

    task_slots: int | None = None  # the session's, set by register(): relay.maxTasksPerBatch's default
    batch_cap: int | None = None  # from the executors' memory, set by register(): relay.batchCapRows's

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        """Validate options here so a bad option fails when the query starts, not in a task."""
        return KafkaStreamReader(SourceSettings.from_options(self.options, self.task_slots, self.batch_cap))


def _shadowed(guard: Any, shadow_read: bool) -> Any:
    if guard is None or not shadow_read:
        return guard
    from relay.protocol.guard import shadowed  # lazily: a source without Relay's ledger needs none of it

    return shadowed(guard, shadow_read)


def _idle(guard: Any) -> bool:
    """No new batch: the query can stop between batches, and a standby stays warm reading nothing."""
    return guard is not None and (guard.stop_requested or guard.hold)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from Kafka offsets and reads them; see the module docstring."""

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self._consumer: Any = None  # created lazily in the planner: never in __init__, never pickled
        self._available_now_end: PartitionOffsets | None = None
        self._metadata_at = float("-inf")  # monotonic time of the last full metadata refresh
        self._latest_seen: tuple[float, PartitionOffsets] | None = None  # for reportLatestOffset
        self._outage = Outage("the source's planning")  # Kafka or the ledger briefly away
        self._may_hold = True  # until a guard says otherwise: a standby's source holds
        fixed = settings.max_offsets_per_trigger is not None
        self._sizer = None if fixed else BatchSizer(settings.batch_cap_rows or memory_cap_rows())

    def __getstate__(self) -> dict[str, Any]:
        """The reader is pickled to executors for read(); a live consumer must not travel along."""
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    # -- planner side -------------------------------------------------------------------------------

    def _planner_consumer(self) -> Any:
        """The one long-lived consumer of the planner process: metadata and offset look-ups only."""
        if self._consumer is None:
            from kafka import KafkaConsumer
            from kafka.errors import KafkaError as VendorKafkaError

            try:
                self._consumer = KafkaConsumer(**self.settings.consumer_config("relay-kafka-source-planner"))
            except VendorKafkaError as exc:
                raise KafkaError(f"cannot reach Kafka at {self.settings.bootstrap_servers}: {exc}") from exc
        return self._consumer

    def _topic_partitions(self) -> list[Any]:
        """Current partitions of the subscribed topics; refreshes metadata so new partitions show up."""
        from kafka import TopicPartition
        from kafka.errors import KafkaError as VendorKafkaError

        consumer = self._planner_consumer()
        try:
            # A full metadata refresh costs ~100 ms on every call (kafka-python waits for its refresh
            # loop), which every batch would pay; new partitions are looked for every
            # METADATA_REFRESH_S instead, and at once when a topic is not in the cache yet.
            now = time.monotonic()
            cached = [consumer.partitions_for_topic(topic) for topic in self.settings.topics]
            if now - self._metadata_at >= METADATA_REFRESH_S or not all(cached):
                consumer.topics()  # forces a refresh; partitions_for_topic alone serves the cache
                self._metadata_at = now
            tps = [
                TopicPartition(topic, p)
                for topic in self.settings.topics
                for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
        except VendorKafkaError as exc:
            raise KafkaError(f"cannot read Kafka metadata for {list(self.settings.topics)}: {exc}") from exc
        return tps

    def _offsets(self, tps: list[Any]) -> tuple[PartitionOffsets, PartitionOffsets]:
        """(earliest, latest) offsets of ``tps``."""
        from kafka.errors import KafkaError as VendorKafkaError

        if not tps:
            return {}, {}
        consumer = self._planner_consumer()
        try:
            earliest = consumer.beginning_offsets(tps)
            latest = consumer.end_offsets(tps)
        except VendorKafkaError as exc:
            raise KafkaError(f"cannot read offsets of {len(tps)} Kafka partition(s): {exc}") from exc
        return (
            {(tp.topic, tp.partition): int(o) for tp, o in earliest.items()},
            {(tp.topic, tp.partition): int(o) for tp, o in latest.items()},
        )

    def initialOffset(self) -> OffsetJson:
        """Resolve startingOffsets against the broker; partitions the JSON omits start at earliest."""
        earliest, latest = self._offsets(self._topic_partitions())
        spec = parse_starting_offsets(self.settings.starting_offsets, self.settings.topics)
        if spec == "earliest":
            return to_offset_json(earliest)
        if spec == "latest":
            return to_offset_json(latest)
        if not isinstance(spec, dict):  # pragma: no cover - parse_starting_offsets returns one of three
            raise ConfigError(f"{SOURCE_NAME} source: bad startingOffsets {self.settings.starting_offsets!r}")
        missing = sorted(set(spec) - set(earliest))
        if missing:
            raise ConfigError(
                f"{SOURCE_NAME} source: startingOffsets names partitions Kafka does not have: {missing}"
            )
        resolved: PartitionOffsets = {}
        for tp, first in earliest.items():
            wanted = spec.get(tp, EARLIEST)
            resolved[tp] = first if wanted == EARLIEST else latest[tp] if wanted == LATEST else wanted
        return to_offset_json(resolved)

    def getDefaultReadLimit(self) -> ReadLimit:
        """maxOffsetsPerTrigger, which Spark hands back to latestOffset (which enforces it itself too:
        under Trigger.Once Spark passes ReadAllAvailable, see ``batch_row_limit``); adaptive batches
        are bounded in latestOffset alone."""
        if self.settings.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.settings.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: freeze today's end offsets; latestOffset never plans past them."""
        _, self._available_now_end = self._offsets(self._topic_partitions())

    def latestOffset(self, start: OffsetJson, limit: ReadLimit) -> OffsetJson:
        """End offsets of the next batch (:func:`kafka_offsets_plan.plan_batch_end`).

        Every batch spans at most maxOffsetsPerTrigger offsets (or the adaptive size) whatever
        ``limit`` Spark passes. Data loss is checked here, on the driver, so a restart on a position
        retention deleted fails before any batch runs. With Relay's ledger the plan is made under
        the instance's row lock and its ends are recorded before Spark writes ``offsets/N`` (see
        :meth:`_plan`); Kafka's offsets are looked up first, outside that transaction.
        """
        try:
            earliest, latest = self._offsets(self._topic_partitions())
        except KafkaError as exc:  # no batch this trigger; the query fails past the outage's bound
            if self._outage.failed(exc) or _idle(self._read_guard()):
                return start
            raise
        self._latest_seen = (time.monotonic(), latest)
        if self._available_now_end is not None:
            latest = {tp: min(end, self._available_now_end.get(tp, end)) for tp, end in latest.items()}
        begin = from_offset_json(start)
        if latest == begin:  # nothing to plan: no ledger transaction (a short trigger polls often)
            self._outage.ok()  # Kafka answered; the ledger is tried again with the next plan
            return start
        sized = self._sizer.limit(time.monotonic()) if self._sizer is not None else None
        max_rows = batch_row_limit(limit, self.settings.max_offsets_per_trigger or sized)

        def plan(guard: Any) -> PartitionOffsets | None:
            guard = _shadowed(guard, self.settings.shadow_read)
            if _idle(guard):
                return None
            return plan_batch_end(
                begin,
                earliest,
                latest,
                fail_on_data_loss=self.settings.fail_on_data_loss,
                caps=guard.caps if guard is not None else None,
                max_rows=max_rows,
                floors=guard.floors if guard is not None else None,
                warm_until=guard.warm_until if guard is not None else None,
            )

        try:
            until = self._plan(plan)
        except LedgerUnavailableError as exc:
            if self._outage.failed(exc):
                return start
            raise
        self._outage.ok()
        if self._sizer is not None:
            self._size_seen(begin, until)
        if until is None:
            return start
        # Under failOnDataLoss=false the batch's start stays below earliest in Spark's offsets;
        # read() skips forward to earliest itself. Returning `start` itself when nothing moved keeps
        # Spark from planning an empty batch.
        end = to_offset_json(until)
        return start if end == start else end

    def _size_seen(self, begin: PartitionOffsets, until: PartitionOffsets | None) -> None:
        """Tell the sizer what was planned; log each full batch's size and why (the driver's log)."""
        before = self._sizer.rows
        rows = sum(max(0, end - begin.get(tp, end)) for tp, end in (until or {}).items())
        self._sizer.planned(time.monotonic(), rows)
        if rows >= before:  # a full batch: its size was the limit (limit() chose it, and why)
            log.info("batch of %s offsets (limit %s: %s)", f"{rows:,}", f"{before:,}", self._sizer.reason)

    def _plan(self, plan: Callable[[Any], PartitionOffsets | None]) -> PartitionOffsets | None:
        """Run ``plan`` under Relay's ledger guard, or alone when no ledger is configured.

        Under the row lock, with the ends recorded in the same transaction: the upgrade's handoff
        locks the same row and takes H at or above the recorded ends, so a batch of blue never ends
        past H; a plan after the handoff sees blue's lease closed at H and is capped."""
        url = self._ledger_url()
        if url is None:
            return plan(None)
        from relay.protocol.guard import plan_under_guard

        if self._may_hold:  # a waiting standby's hold, seen without the row lock (10 plans a second)
            if self._read_guard().hold:
                return None
            self._may_hold = False  # leases now: an instance never holds again
        # Step 1. Plan inside the leases, and record the planned end, under the instance's row lock.
        return plan_under_guard(url, self.settings.instance_id, plan)

    def _read_guard(self) -> Any:
        """Relay's ledger guard (stop flag, caps, floors) without the lock, or None when not configured."""
        url = self._ledger_url()
        if url is None:
            return None
        from relay.protocol.guard import read_source_guard

        return _shadowed(read_source_guard(url, self.settings.instance_id), self.settings.shadow_read)

    def _ledger_url(self) -> str | None:
        """Relay's ledger for this instance's guard, or None when the source runs without one."""
        if self.settings.ledger_url_env is None or self.settings.instance_id is None:
            return None
        return ledger_url_from_env(self.settings.ledger_url_env)

    def reportLatestOffset(self) -> OffsetJson | None:
        """Broker end offsets of every partition, for the query's progress (lag) only.

        Spark calls it right after :meth:`latestOffset` in the same trigger: the end offsets that
        call just read are reused once (two ListOffsets round trips and a metadata check less per
        batch); any other call looks them up.
        """
        seen, self._latest_seen = self._latest_seen, None
        if seen is not None and time.monotonic() - seen[0] < REPORT_REUSE_S:
            latest = seen[1]
        else:
            try:
                _, latest = self._offsets(self._topic_partitions())
            except KafkaError:  # Kafka briefly away: no lag figure this trigger (latestOffset decides)
                return None
        return to_offset_json(latest) if latest else None

    def partitions(self, start: OffsetJson, end: OffsetJson) -> list[InputPartition]:
        """One task per Kafka partition with something to read, or, beyond ``max_tasks`` (the
        session's task slots), partitions sharing tasks (:func:`group_ranges`); a new partition is
        absent from ``start`` and sits at its first offset in ``end``, so it yields no task yet."""
        begin = from_offset_json(start)
        guard = ride_out(self._read_guard, "the source's task planning")
        floors = guard.floors if guard is not None else {}
        ranges: list[ReadRange] = []
        for (topic, partition), stop in sorted(from_offset_json(end).items()):
            if (topic, partition) not in begin:
                continue
            first = max(begin[(topic, partition)], floors.get(topic, {}).get(partition, 0))
            if first < stop:  # below its lease floor nothing is the instance's: never read it
                ranges.append((topic, partition, first, stop))
        return [
            KafkaInputPartition(*group[0]) if len(group) == 1 else KafkaInputGroup(group)
            for group in group_ranges(ranges, self.settings.max_tasks)
        ]

    def commit(self, end: OffsetJson) -> None:
        """Nothing to do: positions live in Spark's checkpoint (and Relay's ledger), not in Kafka."""

    # -- executor side ------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Yield the records of [start, end) of each Kafka partition of the task, one partition
        after another, as pyarrow RecordBatches (:func:`kafka_partition_read.read_partition`)."""
        if isinstance(partition, KafkaInputPartition):
            ranges: tuple[ReadRange, ...] = (partition.value,)
        elif isinstance(partition, KafkaInputGroup):
            ranges = partition.ranges
        else:
            raise TypeError(f"expected a KafkaInputPartition, got {type(partition).__name__}")
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")
        for topic, number, first, stop in ranges:
            yield from read_partition(self.settings, schema, topic, number, first, stop)


def register(spark: Any) -> None:
    """Register the source with a SparkSession.

    Pickling this module by value is what makes the source work in cluster mode: the driver's
    planner process could not import it even when shipped as a py-file (observed with pyspark 4.2).
    """
    from pyspark import cloudpickle

    helpers = (
        kafka_offsets_plan,
        kafka_source_options,
        kafka_fast_records,
        kafka_consumer_pool,
        kafka_partition_read,
        batch_sizing,
    )
    for module in (*helpers, sys.modules[__name__]):
        cloudpickle.register_pickle_by_value(module)  # its helper modules too: same reason
    # pickled with the class when registered
    KafkaDataSource.task_slots, KafkaDataSource.batch_cap = session_limits(spark)
    kafka_source_options.spare_data_source_lookup(spark)
    spark.dataSource.register(KafkaDataSource)
