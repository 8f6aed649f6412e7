"""Markers of the Kafka transactional sink: what each transactional id has committed, and its fence.

A marker is a small JSON record in the marker topic (compacted), keyed by a transactional id:

* a **range marker** (key ``relay:<pipeline>:<instance>:<topic>:<partition>``, the id of the
  producer that writes that source partition's rows): ``written`` lists the half-open intervals of
  the source partition's offsets that committed transactions of the instance wrote, sorted and
  disjoint; ``epoch`` is the newest epoch allowed to write; ``fenced`` closes the id for good. It is
  written in the SAME transaction as the rows.
* an **instance record** (key ``relay:<pipeline>:<instance>``): the instance's epoch and fence, kept
  by ``fence_epoch``/``fence_instance`` for ids that have no marker yet.

A task merges its batch range ``[first, end)`` into ``written`` only because it holds EVERY row of
that source partition in the batch: the driver regroups a batch whose plan is not narrow (a
shuffle, a join, a union) by source partition before this sink (``relay.pipeline.tasks``). A skip
is therefore allowed only for offsets inside an interval a committed write provably holds; an
undrained range below another instance's taken-over interval stays unwritten (issue #29).

Every marker of an instance lives in one partition of the marker topic (a stable hash of pipeline
and instance), so the driver finds all of an instance's ids by reading one partition. Pure functions
here; the reads take their consumers from kafka_clients.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
import zlib
from array import array
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from relay.errors import ConfigError
from relay.sinks.base import FencedWriteError, SinkError, TaskContext

MARKER_VERSION = 2
_POLL_MS = 200
_FIRST_WINDOW = 512  # records read back from the end before widening (doubling) the window


def instance_key(pipeline: str, instance_id: int) -> str:
    """The instance record's key and the transactional id of its fencing producer."""
    if not isinstance(pipeline, str) or not pipeline or ":" in pipeline:
        raise ConfigError(f"pipeline must be a non-empty name without ':', got {pipeline!r}")
    return f"relay:{pipeline}:{instance_id}"


def range_key(pipeline: str, instance_id: int, topic: str, partition: int) -> str:
    """The transactional id (and marker key) of one instance writing one source partition.

    ':' cannot occur in a pipeline or topic name, so distinct (pipeline, instance, topic, partition)
    never share an id; the broker fences an older producer of the same id."""
    return f"{instance_key(pipeline, instance_id)}:{topic}:{partition}"


def marker_partition(pipeline: str, instance_id: int, partitions: int) -> int:
    """The marker topic partition holding every marker of the instance (crc32: stable everywhere).
    Never add partitions to the marker topic: this mapping would change."""
    return zlib.crc32(f"{pipeline}:{instance_id}".encode()) % partitions


@dataclass(frozen=True)
class Marker:
    """One committed marker (see the module docstring); ``topic is None`` for an instance record."""

    pipeline: str
    instance_id: int
    epoch: int
    fenced: bool = False
    topic: str | None = None
    partition: int | None = None
    written: tuple[tuple[int, int], ...] = ()
    """Sorted, disjoint ``[first, end)`` intervals of source offsets committed transactions wrote."""
    range_epoch: int | None = None
    """Epoch of the task whose transaction wrote last (``epoch`` may be newer: a fence)."""
    batch: int | None = None
    rows: int = 0
    digest: str = ""
    output: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "written", merged(self.written))

    @property
    def end(self) -> int:
        """The end of the highest written interval (0: nothing written): for logs and reports."""
        return self.written[-1][1] if self.written else 0

    def covers(self, offset: int) -> bool:
        """True when a committed transaction of this id wrote the row at ``offset``."""
        return covered(self.written, offset)

    def encode(self) -> bytes:
        return json.dumps({"v": MARKER_VERSION, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | None, where: str) -> Marker | None:
        """None for a tombstone; SinkError for a record this version can't read (never guessed)."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            if data.pop("v") != MARKER_VERSION:
                raise ValueError("unknown marker version")
            data["written"] = tuple((int(a), int(b)) for a, b in data.get("written", ()))
            return cls(**data)
        except (ValueError, TypeError, KeyError) as exc:
            raise SinkError(f"unreadable marker {where}: {exc}") from None

    def fence(self, epoch: int | None) -> Marker:
        """The same progress under a new fence: ``epoch`` or, for None, fenced for good."""
        if epoch is None:
            return replace(self, fenced=True)
        return replace(self, epoch=max(self.epoch, epoch))


def offsets_digest(offsets: Iterable[int]) -> str:
    """Identity of the set of source offsets a task held for a range (order-independent): tells a
    retried task (same rows) from a second task holding other rows of the same partition."""
    packed = array("q", sorted(offsets)).tobytes()
    return hashlib.blake2b(packed, digest_size=8).hexdigest()


def merged(intervals: Iterable[Iterable[int]]) -> tuple[tuple[int, int], ...]:
    """``intervals`` sorted, empty ones dropped, overlapping or adjacent ones joined."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def covered(intervals: tuple[tuple[int, int], ...], offset: int, end: int | None = None) -> bool:
    """True when ``offset`` (or all of ``[offset, end)``) lies in one of the sorted, disjoint,
    non-adjacent ``intervals`` (as ``merged`` makes them)."""
    i = bisect.bisect_right(intervals, (offset, float("inf"))) - 1
    last = offset + 1 if end is None else end
    return i >= 0 and intervals[i][0] <= offset and last <= intervals[i][1]


def check_fence(marker: Marker | None, instance: Marker | None, ctx: TaskContext, key: str) -> None:
    """Refuse (FencedWriteError) a task whose epoch is older than its id's, or a fenced instance.

    A range marker of an older epoch is fine (the new attempt writes over it; fence_epoch may have
    missed an id whose first transaction raced its scan). Without one, the instance record must
    hold exactly the task's epoch, as the PostgreSQL sink's fence row does."""
    who = f"instance {ctx.instance_id} of pipeline {ctx.pipeline!r}"
    task = f"task of epoch {ctx.epoch} (batch {ctx.batch_id}) refused for {key!r}, nothing written"
    ref = marker if marker is not None else instance
    if ref is None:
        raise FencedWriteError(f"{who} has no marker in the sink (fence_epoch never ran): {task}")
    if ref.fenced:
        raise FencedWriteError(f"{who} is fenced in the sink: {task}")
    if ref.epoch > ctx.epoch or (marker is None and ref.epoch != ctx.epoch):
        raise FencedWriteError(f"{who} is at epoch {ref.epoch} in the sink: {task}")


@dataclass(frozen=True)
class GroupPlan:
    """What one source partition's rows of a task become: rows to send and the marker to commit."""

    send: list[int]
    """Indexes of the rows to send (in-range, outside every written interval)."""
    unchanged: int
    """In-range rows inside a written interval: a committed transaction wrote them (a replay)."""
    marker: Marker | None
    """The new marker, None when nothing is sent (no transaction at all)."""


def plan_group(
    ctx: TaskContext, topic: str, partition: int, offsets: list[int], marker: Marker | None, output: str
) -> GroupPlan:
    """Decide a group's write from its in-range offsets and the id's committed marker.

    The task holds every in-range row of the source partition of this batch (the driver regroups a
    plan that is not narrow), so after its commit ``[first, end)`` is written whole and merges into
    the marker. Two tasks of the same attempt and batch holding different rows of one partition (a
    split the driver failed to regroup, or a transform that is not deterministic) are refused."""
    first, end = ctx.ranges[(topic, partition)]
    digest = offsets_digest(offsets)
    written = marker.written if marker is not None else ()
    if (
        marker is not None
        and marker.range_epoch == ctx.epoch
        and marker.batch == ctx.batch_id
        and covered(written, first, end)
        and (marker.rows, marker.digest) != (len(offsets), digest)
    ):
        raise SinkError(
            f"rows of source partition {topic}[{partition}] in batch {ctx.batch_id} reached more than "
            f"one task (a committed task held {marker.rows} of them, this one {len(offsets)}), or the "
            "transform is not deterministic: the Kafka sink needs each source partition's rows of a "
            "batch in ONE task (Relay regroups a batch whose plan shuffles; report this as a bug)"
        )
    send = [i for i, off in enumerate(offsets) if not covered(written, off)]
    if not send:
        return GroupPlan([], len(offsets), None)
    new = Marker(
        pipeline=ctx.pipeline,
        instance_id=ctx.instance_id,
        epoch=max(ctx.epoch, marker.epoch if marker is not None else 0),
        topic=topic,
        partition=partition,
        written=(*written, (first, end)),
        range_epoch=ctx.epoch,
        batch=ctx.batch_id,
        rows=len(offsets),
        digest=digest,
        output=output,
    )
    return GroupPlan(send, len(offsets) - len(send), new)


# ---- reading committed markers ---------------------------------------------------------------


def _read(
    consumer: KafkaConsumer, tp: TopicPartition, lo: int, hi: int, deadline: float, on: Callable[[Any], None]
) -> None:
    """Every committed record of [lo, hi) in offset order. Waits while an open transaction holds
    the last stable offset below ``hi`` (read_committed), until ``deadline``."""
    consumer.assign([tp])
    consumer.seek(tp, lo)
    while consumer.position(tp) < hi:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"marker partition {tp.topic}[{tp.partition}] stayed behind an open transaction "
                f"(read up to {consumer.position(tp)} of {hi})"
            )
        for record in consumer.poll(timeout_ms=_POLL_MS).get(tp, ()):
            if record.offset < hi:
                on(record)


def latest(
    readers: tuple[KafkaConsumer, KafkaConsumer],
    tp: TopicPartition,
    keys: Iterable[str],
    want: str | None,
    deadline: float,
) -> dict[str, Marker | None]:
    """The newest committed marker of each key (absent: none), reading backwards from the high
    watermark in doubling windows until ``want`` is found (None: the whole partition).

    Reading up to the high watermark (not just the last stable offset) matters: a marker committed
    after another id's still-open transaction sits above the LSO, and missing it would re-send rows."""
    committed, uncommitted = readers
    wanted = {k.encode(): k for k in keys}
    hi = uncommitted.end_offsets([tp])[tp]
    start = uncommitted.beginning_offsets([tp])[tp]
    found: dict[str, Marker | None] = {}
    size = _FIRST_WINDOW if want is not None else max(hi - start, 1)
    seen: dict[str, Any] = {}

    def keep(record: Any) -> None:
        name = wanted.get(record.key) if record.key is not None else None
        if name is not None:
            seen[name] = record.value  # later offsets overwrite: the newest in the window

    while hi > start:
        lo = max(start, hi - size)
        seen.clear()
        _read(committed, tp, lo, hi, deadline, keep)
        for name, raw in seen.items():
            if name not in found:
                found[name] = Marker.decode(raw, f"{name!r} in {tp.topic}[{tp.partition}]")
        if want is not None and want in found:
            break
        hi, size = lo, size * 2
    return found


def instance_markers(
    readers: tuple[KafkaConsumer, KafkaConsumer], tp: TopicPartition, prefix: str, deadline: float
) -> dict[str, Marker | None]:
    """Every key of the instance (its record and its range ids) with its newest committed marker:
    a read of the whole partition, driver side, once per fence."""
    committed, uncommitted = readers
    hi = uncommitted.end_offsets([tp])[tp]
    start = uncommitted.beginning_offsets([tp])[tp]
    mine, ranges = prefix.encode(), (prefix + ":").encode()
    raw: dict[bytes, Any] = {}

    def keep(record: Any) -> None:
        if record.key == mine or (record.key is not None and record.key.startswith(ranges)):
            raw[record.key] = record.value

    if hi > start:
        _read(committed, tp, start, hi, deadline, keep)
    where = f"in {tp.topic}[{tp.partition}]"
    return {k.decode(): Marker.decode(v, f"{k.decode()!r} {where}") for k, v in raw.items()}
