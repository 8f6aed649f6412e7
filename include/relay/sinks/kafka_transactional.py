"""A Kafka topic written transactionally: the second executor-side sink.

Each Spark task groups its rows by source partition ``(topic, partition)`` and writes each group in
ONE Kafka transaction of a producer whose ``transactional.id`` is ``relay:<pipeline>:<instance>:
<topic>:<partition>`` (kafka_markers). Per group:

1. Producer: this process's pooled producer of the id, or a new one after ``init_transactions``,
   which fences every older producer of the id (a zombie task, an older attempt) and aborts its open
   transaction.
2. Marker: for a new producer, read the id's newest committed marker (read_committed, up to the
   high watermark). A pooled producer uses the marker it committed last: if anyone else took the id
   over since, step 5 fails and nothing is visible.
3. Fence: refuse (FencedWriteError) when the marker holds a newer epoch or the instance is fenced.
4. Skip rows outside ``ctx.ranges`` and rows below the marker's ``end`` (a replay: a committed
   transaction wrote them). Nothing left: no transaction.
5. ``begin``, send the rows, flush, send the new marker (``end`` = the range's end), commit. The
   rows and the marker become visible together to read_committed consumers, or not at all.

A failed transaction is aborted and its producer closed; the id's marker is then read afresh: a
newer epoch or a fence raises FencedWriteError, anything else is retried once with a new producer,
then raised as SinkError / SinkUnavailableError (Spark retries the task; step 4 keeps it exact).

``fence_epoch`` cannot wait for tasks the way a row lock does; ``init_transactions`` does the fencing
instead: it writes the epoch into the instance record (under its own transactional id), then, for
every range id of the instance found in the marker topic, initialises the id (fencing the producer
of any task still in a write) and commits the same marker with the new epoch. A task that takes the
id after that reads the new epoch and refuses. The one gap: an older task's very first transaction
for a source partition that commits while ``fence_epoch`` runs is not fenced; it cannot duplicate
(each id's transactions are serial), and the new attempt skips its rows by their marker.

``take_over`` (kafka_fencing): before writing a range a dead instance held, the driver fences that
instance for good (its taken source partitions' ids too, marker or not: no gap there) and raises its
own markers of those partitions to the dead instance's final ends, so rows that instance committed
past its ledger cursor are skipped like a replay instead of written again under another id.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka import TopicPartition
from kafka import errors as kerrors
from kafka.admin import NewTopic
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from relay.crashpoints import crash_point
from relay.errors import ConfigError
from relay.pipeline.datasets import DatasetRef, kafka_topic
from relay.sinks import kafka_clients as kc
from relay.sinks import kafka_fencing as kf
from relay.sinks import kafka_markers as km
from relay.sinks.base import SOURCE_COLUMNS, SinkError, TaskContext, TaskResult

DEFAULT_MARKER_TOPIC = "__relay_sink_markers"
DEFAULT_MARKER_PARTITIONS = 4
DEFAULT_MARKER_WAIT_S = 20.0
"""How long a marker read waits behind an open transaction (and a flush for the broker). A task
killed inside its transaction leaves it open until a retry of that task takes its id over, and the
broker may never time it out (the embedded one does not): on a one-core executor the retry waits for
the blocked reader, so this bound is the stall (it was 120 s; a transaction of Relay's lasts well
under a second)."""
DEFAULT_FENCE_WAIT_S = 300.0
CRASH_BEFORE_COMMIT = "kafka_sink.before_commit"  # tests: die with rows and marker sent, uncommitted
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_Row = tuple[int, bytes | None, bytes | None]  # (source offset, key, value)


_RETAKE = (kerrors.KafkaError, TimeoutError, OSError)
"""What a producer whose transactional id another one took meets (the write is retaken once)."""


class KafkaTransactionalSink:
    """Writes ``value_column`` (and ``key_column``) of each row to ``topic``, exactly once for
    read_committed consumers. Values must be bytes, str (UTF-8) or None (a tombstone); serialise
    anything else in the transform (e.g. ``to_json``). ``client_config``: extra kafka-python
    settings (security, timeouts, compression); secrets in it are masked in every message."""

    needs_whole_source_partitions = True
    """A marker says a source range is written: the driver regroups a batch whose plan shuffles so
    that each source partition's rows are in one task (``relay.pipeline.tasks``)."""

    def __init__(
        self,
        bootstrap: str | list[str] | tuple[str, ...],
        topic: str,
        key_column: str | None = None,
        value_column: str = "value",
        *,
        marker_topic: str = DEFAULT_MARKER_TOPIC,
        marker_partitions: int = DEFAULT_MARKER_PARTITIONS,
        client_config: Mapping[str, Any] | None = None,
        marker_wait_s: float = DEFAULT_MARKER_WAIT_S,
        fence_wait_s: float = DEFAULT_FENCE_WAIT_S,
    ) -> None:
        self.topic = _check_topic(topic, "topic")
        self.marker_topic = _check_topic(marker_topic, "marker_topic")
        if self.marker_topic == self.topic:
            raise ConfigError(f"marker_topic must differ from the output topic {topic!r}")
        self.key_column = None if key_column is None else _check_column(key_column, "key_column")
        self.value_column = _check_column(value_column, "value_column")
        if (
            isinstance(marker_partitions, bool)
            or not isinstance(marker_partitions, int)
            or marker_partitions < 1
        ):
            raise ConfigError(f"marker_partitions must be a positive integer, got {marker_partitions!r}")
        for name, value in (("marker_wait_s", marker_wait_s), ("fence_wait_s", fence_wait_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        self.marker_partitions = marker_partitions
        self.marker_wait_s = float(marker_wait_s)
        self.fence_wait_s = float(fence_wait_s)
        self.settings = kc.ClientSettings.parse(bootstrap, client_config)

    def __repr__(self) -> str:
        return (
            f"KafkaTransactionalSink(bootstrap={self.settings.servers!r}, topic={self.topic!r}, "
            f"key_column={self.key_column!r}, value_column={self.value_column!r}, "
            f"marker_topic={self.marker_topic!r}, client_config={self.settings.shown()!r})"
        )

    __str__ = __repr__

    def dataset(self) -> DatasetRef:
        """The output topic, in the cluster of the sink's first bootstrap server (lineage, assets)."""
        return kafka_topic(self.settings.servers, self.topic)

    # ---- driver side -------------------------------------------------------------------------

    def prepare(self, pipeline: str) -> None:
        """Check the output topic exists (ConfigError); create the compacted marker topic if missing."""
        km.instance_key(pipeline, 0)
        with kc.kafka_errors(self.settings, f"preparing the sink for topic {self.topic!r}"):
            with kc.admin(self.settings) as client:
                names = set(client.list_topics())
                if self.topic not in names:
                    raise ConfigError(
                        f"output topic {self.topic!r} does not exist at {self.settings.servers}: create it "
                        "first (its partitions and replication are yours to choose)"
                    )
                if self.marker_topic not in names:
                    self._create(
                        client, self.marker_topic, self.marker_partitions, {"cleanup.policy": "compact"}
                    )
        self._marker_count()

    def create_topic(
        self, partitions: int, configs: Mapping[str, str] | None = None, replication: int = -1
    ) -> bool:
        """Create the output topic when missing (tests, examples, a scratch cluster); True if created.
        ``replication`` -1: the cluster's default replication factor."""
        with (
            kc.kafka_errors(self.settings, f"creating topic {self.topic!r}"),
            kc.admin(self.settings) as client,
        ):
            if self.topic in set(client.list_topics()):
                return False
            self._create(client, self.topic, partitions, dict(configs or {}), replication)
            return True

    @staticmethod
    def _create(
        client: Any, name: str, partitions: int, configs: dict[str, str], replication: int = -1
    ) -> None:
        try:
            client.create_topics([NewTopic(name, partitions, replication, topic_configs=configs)])
        except kerrors.TopicAlreadyExistsError:
            pass  # created meanwhile by another driver: fine

    def fence_epoch(self, pipeline: str, instance_id: int, epoch: int) -> None:
        """Make ``epoch`` the newest epoch of the instance that can commit (see the module docstring).
        A lower epoch than the sink's, or a fenced instance, raises FencedWriteError; the same epoch
        again is a no-op."""
        _check_ids(pipeline, instance_id, epoch)
        kf.fence(self, pipeline, instance_id, epoch)

    def fence_instance(self, pipeline: str, instance_id: int) -> None:
        """No task of the instance can commit any more, whatever its epoch (permanent; idempotent)."""
        _check_ids(pipeline, instance_id, 0)
        kf.fence(self, pipeline, instance_id, None)

    def take_over(
        self,
        pipeline: str,
        instance_id: int,
        epoch: int,
        predecessors: Mapping[tuple[str, int], tuple[int, ...]],
    ) -> dict[tuple[str, int], int]:
        """Before writing ranges dead instances held: fence them for good, then raise this instance's
        markers of those source partitions to their final ends, so the rows they committed past their
        ledger cursors are not written again (kafka_fencing). Returns the ends taken over."""
        _check_ids(pipeline, instance_id, epoch)
        return kf.take_over(self, pipeline, instance_id, epoch, predecessors)

    def _marker_count(self) -> int:
        with kc.kafka_errors(self.settings, f"reading the marker topic {self.marker_topic!r}"):
            with kc.readers(self.settings) as (_, uncommitted):
                parts = uncommitted.partitions_for_topic(self.marker_topic)
        if not parts:
            raise ConfigError(
                f"marker topic {self.marker_topic!r} does not exist at {self.settings.servers}: "
                "prepare() creates it"
            )
        return len(parts)

    def _marker_tp(self, pipeline: str, instance_id: int) -> TopicPartition:
        return TopicPartition(
            self.marker_topic, km.marker_partition(pipeline, instance_id, self._marker_count())
        )

    # ---- executor side -----------------------------------------------------------------------

    def write_task(self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]]) -> TaskResult:
        """Write one task's rows: one transaction per source partition (see the module docstring)."""
        result = TaskResult()
        groups = self._collect(ctx, rows, result)
        if not groups:
            return result
        tp = self._marker_tp(ctx.pipeline, ctx.instance_id)
        transactions = 0
        for (topic, partition), group in sorted(groups.items()):
            written, unchanged = self._write_group(ctx, topic, partition, group, tp)
            result.rows_written += written
            result.rows_unchanged += unchanged
            transactions += 1 if written else 0
        result.extra.update(transactions=transactions)
        return result

    def _collect(
        self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]], result: TaskResult
    ) -> dict[tuple[str, int], list[_Row]]:
        """In-range rows grouped by source partition, key and value as bytes (checked before any send)."""
        groups: dict[tuple[str, int], list[_Row]] = {}
        ranges, key_col, value_col = ctx.ranges, self.key_column, self.value_column
        for row in rows:
            result.rows_in += 1
            try:
                topic, partition, offset = row["topic"], row["partition"], row["offset"]
            except KeyError as exc:
                raise SinkError(
                    f"a row has no source column {exc.args[0]!r} (rows carry {SOURCE_COLUMNS})"
                ) from None
            r = ranges.get((topic, partition))
            if r is None or not r[0] <= offset < r[1]:
                result.rows_skipped += 1
                continue
            try:
                key = None if key_col is None else _bytes(row[key_col], key_col)
                value = _bytes(row[value_col], value_col)
            except KeyError as exc:
                raise SinkError(
                    f"the row at {topic}[{partition}]@{offset} has no column {exc.args[0]!r}"
                ) from None
            except TypeError as exc:
                raise SinkError(f"the row at {topic}[{partition}]@{offset}: {exc}") from None
            groups.setdefault((topic, partition), []).append((offset, key, value))
        return groups

    def _write_group(
        self, ctx: TaskContext, topic: str, partition: int, group: list[_Row], tp: TopicPartition
    ) -> tuple[int, int]:
        """Steps 1-5 for one source partition; returns (rows written, rows already written)."""
        key = km.range_key(ctx.pipeline, ctx.instance_id, topic, partition)
        ikey = km.instance_key(ctx.pipeline, ctx.instance_id)
        offsets = [row[0] for row in group]
        where = f"writing batch {ctx.batch_id} of instance {ctx.instance_id} to topic {self.topic!r}"

        def once() -> tuple[int, int]:
            entry = kc.checkout_producer(self.settings, key)  # Step 1.
            try:
                if entry is None:
                    with kc.kafka_errors(self.settings, where):
                        entry = kc.PooledProducer(kc.new_producer(self.settings, key))
                        found = self._read_markers(tp, [key, ikey], key)  # Step 2.
                    entry.marker, entry.instance = found.get(key), found.get(ikey)
                km.check_fence(entry.marker, entry.instance, ctx, key)  # Step 3.
                plan = km.plan_group(ctx, topic, partition, offsets, entry.marker, self.topic)  # Step 4.
                if plan.marker is not None:
                    self._send(
                        entry.producer, group, plan, key, tp, source_headers(ctx, topic, partition)
                    )  # Step 5.
                    entry.marker = plan.marker
            except _RETAKE:
                if entry is not None:
                    kc.close_quietly(entry.producer)  # never reuse it; its open transaction is dropped
                self._refuse_if_fenced(ctx, key, ikey, tp, where)
                raise
            except BaseException:
                if entry is not None:
                    kc.close_quietly(entry.producer)
                raise
            kc.checkin_producer(self.settings, key, entry)
            return len(plan.send), plan.unchanged

        # Another producer took the id (a retried copy of this task): retake it once, then fail.
        retrying = Retrying(retry=retry_if_exception_type(_RETAKE), stop=stop_after_attempt(2), reraise=True)
        try:
            return retrying(once)
        except _RETAKE as exc:
            raise kc.wrap(exc, self.settings, where) from None

    def _send(
        self,
        producer: Any,
        group: list[_Row],
        plan: km.GroupPlan,
        key: str,
        tp: TopicPartition,
        headers: Callable[[int], list[tuple[str, bytes]]],
    ) -> None:
        producer.begin_transaction()
        part = kc.key_partitioner(producer, self.topic)
        futures = [
            producer.send(
                self.topic, value=row[2], key=row[1], headers=headers(row[0]), partition=part(row[1])
            )
            for row in (group[i] for i in plan.send)
        ]
        producer.flush(timeout=self.marker_wait_s)  # rows first: the marker's open window stays short
        failed = next((f for f in futures if f.failed()), None)
        if failed is not None:
            raise failed.exception
        producer.send(self.marker_topic, value=plan.marker.encode(), key=key.encode(), partition=tp.partition)
        producer.flush(timeout=self.marker_wait_s)
        crash_point(CRASH_BEFORE_COMMIT)
        producer.commit_transaction()

    def _read_markers(self, tp: TopicPartition, keys: list[str], want: str) -> dict[str, km.Marker | None]:
        deadline = time.monotonic() + self.marker_wait_s
        with kc.readers(self.settings) as pair:
            return km.latest(pair, tp, keys, want, deadline)

    def _refuse_if_fenced(
        self, ctx: TaskContext, key: str, ikey: str, tp: TopicPartition, where: str
    ) -> None:
        """After a failed transaction: FencedWriteError when a newer epoch or a fence took the id."""
        with kc.kafka_errors(self.settings, where):
            found = self._read_markers(tp, [key, ikey], key)
        marker, instance = found.get(key), found.get(ikey)
        if marker is not None or instance is not None:
            km.check_fence(marker, instance, ctx, key)


SOURCE_HEADER = "relay.source"
WRITER_HEADER = "relay.writer"


def source_headers(ctx: TaskContext, topic: str, partition: int) -> Callable[[int], list[tuple[str, bytes]]]:
    """The headers of each output record: its source position (``topic:partition:offset``) and its
    writer (``instance:epoch:batch``), so a consumer or the audit can tell every input record's
    output and who wrote it (topic names cannot hold ':')."""
    writer = (WRITER_HEADER, f"{ctx.instance_id}:{ctx.epoch}:{ctx.batch_id}".encode())
    prefix = f"{topic}:{partition}:"

    def headers(offset: int) -> list[tuple[str, bytes]]:
        return [(SOURCE_HEADER, f"{prefix}{offset}".encode()), writer]

    return headers


def _bytes(value: Any, column: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(
        f"column {column!r} holds a {type(value).__name__}; the Kafka sink takes bytes, str or None "
        "(serialise it in the transform, e.g. with to_json or cast to string)"
    )


def _check_topic(name: Any, what: str) -> str:
    if not isinstance(name, str) or not _TOPIC.match(name) or name in (".", ".."):
        raise ConfigError(f"{what} must be a Kafka topic name (letters, digits, '.', '_', '-'), got {name!r}")
    return name


def _check_column(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name or name in SOURCE_COLUMNS:
        raise ConfigError(
            f"{what} must name a column of the transform's output (not {SOURCE_COLUMNS}), got {name!r}"
        )
    return name


def _check_ids(pipeline: str, instance_id: int, epoch: int) -> None:
    km.instance_key(pipeline, 0)
    for name, value in (("instance_id", instance_id), ("epoch", epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
