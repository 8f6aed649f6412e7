"""Offset planning of the relaykafka source: what the next micro-batch reads, as pure functions.

Why a module of its own: this is where the source's guarantees live (bounded batches, data loss
detected before a batch runs, new partitions, Relay's lease caps), and pure functions of offsets can
be checked without a broker or Spark. No Kafka client here: the reader looks offsets up and passes
them in.

Offsets are Spark's Kafka offset JSON, ``{"topic": {"partition": next_offset}}``, so a checkpoint
can move to Spark's JVM Kafka connector unchanged.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping

from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
from relay.errors import ConfigError, DataLossError, KafkaError

log = logging.getLogger(__name__)

SOURCE_NAME = "relaykafka"

#: Offsets as Spark's Kafka source stores them: topic -> partition (as a string) -> next offset.
OffsetJson = dict[str, dict[str, int]]
#: The same, keyed by (topic, partition) for arithmetic.
PartitionOffsets = dict[tuple[str, int], int]
#: Relay's lease caps: topic -> partition -> exclusive highest offset the instance may read.
Caps = Mapping[str, Mapping[int, int]]

EARLIEST, LATEST = -2, -1  # Spark's sentinels inside a startingOffsets JSON


def parse_starting_offsets(value: str, topics: tuple[str, ...]) -> str | PartitionOffsets:
    """Return 'earliest', 'latest' or the explicit offsets of a Spark-style JSON."""
    lowered = value.lower()
    if lowered in ("earliest", "latest"):
        return lowered
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise ConfigError(
            f"{SOURCE_NAME} source: startingOffsets must be earliest, latest or JSON like "
            f'{{"topic":{{"0":23}}}}, got {value!r}'
        ) from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{SOURCE_NAME} source: startingOffsets JSON must be an object, got {value!r}")
    unknown = sorted(set(parsed) - set(topics))
    if unknown:
        raise ConfigError(f"{SOURCE_NAME} source: startingOffsets names topics not subscribed: {unknown}")
    try:
        return {(t, int(p)): int(o) for t, parts in parsed.items() for p, o in parts.items()}
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(
            f"{SOURCE_NAME} source: startingOffsets JSON must map topic -> partition -> offset"
        ) from None


def to_offset_json(offsets: PartitionOffsets) -> OffsetJson:
    """Spark's Kafka offset JSON, in a stable order so equal offsets serialise to equal strings."""
    out: OffsetJson = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def from_offset_json(offsets: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    """Inverse of :func:`to_offset_json`."""
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


def batch_row_limit(limit: ReadLimit, max_offsets_per_trigger: int | None) -> int | None:
    """The most offsets the next batch may span: the smaller of Spark's limit and our own option.

    Why not simply obey ``limit``: Spark passes ``ReadAllAvailable`` instead of the source's default
    limit when the query runs with ``Trigger.Once`` (MicroBatchExecution logs "The read limit ... is
    ignored when Trigger.Once is used"), and pyspark's contract says a source should then read
    everything. For Relay that is one batch holding the whole backlog of an outage, collected on
    the driver: an out-of-memory. ``maxOffsetsPerTrigger`` is therefore a hard bound on every batch
    (``Trigger.AvailableNow`` is the way to catch up in one run: it plans bounded batches).
    None means unbounded: neither Spark nor the option set a row limit.
    """
    bounds = [max_offsets_per_trigger]
    if isinstance(limit, ReadMaxRows):
        bounds.append(int(limit.max_rows))
    present = [b for b in bounds if b is not None]
    return min(present) if present else None


def rate_limit(start: PartitionOffsets, until: PartitionOffsets, limit: int) -> PartitionOffsets:
    """Split ``limit`` offsets across partitions proportionally to their backlog; never more.

    Follows Spark's ``KafkaMicroBatchStream.rateLimit`` (floor of each prorated share, a share below
    one rounded up so no partition starves), with one correction: Spark's round-up can exceed the
    limit; here the excess is taken back from the largest shares and, when the limit is smaller
    than the number of partitions with a backlog, from the partitions with the smallest backlog
    (they wait for a later batch). The total never exceeds ``limit``.
    """
    if limit < 1:
        raise ValueError(f"a batch limit must be >= 1, got {limit}")
    sizes = {tp: end - start[tp] for tp, end in until.items() if tp in start and end - start[tp] > 0}
    total = sum(sizes.values())
    if total <= limit:
        return dict(until)
    shares: dict[tuple[str, int], int] = {}
    for tp, size in sizes.items():
        prorate = limit * (size / total)
        shares[tp] = min(size, math.ceil(prorate) if prorate < 1 else math.floor(prorate))
    excess = sum(shares.values()) - limit
    for tp in sorted(shares, key=lambda k: (-shares[k], k)):
        if excess <= 0:
            break
        take = min(excess, shares[tp] - 1)
        shares[tp] -= take
        excess -= take
    for tp in sorted(shares, key=lambda k: (sizes[k], k)):  # more partitions with data than the limit
        if excess <= 0:
            break
        excess -= shares[tp]
        shares[tp] = 0
    result = dict(until)
    for tp, share in shares.items():
        result[tp] = start[tp] + share
    return result


def plan_batch_end(
    begin: PartitionOffsets,
    earliest: PartitionOffsets,
    latest: PartitionOffsets,
    *,
    fail_on_data_loss: bool,
    caps: Caps | None = None,
    max_rows: int | None = None,
    floors: Caps | None = None,
    warm_until: Caps | None = None,
) -> PartitionOffsets:
    """End offsets of the next batch: broker ends, new partitions, data loss, caps, then the limit.

    ``begin`` is where the batch starts (Spark's ``start``), ``earliest``/``latest`` the broker's
    offsets now. Raises :class:`DataLossError` when ``begin`` points at deleted records and
    ``fail_on_data_loss`` is set, so a restart after retention took data fails before any batch runs.
    ``floors`` (the instance's lowest lease start per partition) moves the read start up to where the
    instance's records begin: a warm standby's query sits far below its handoff offset H, and neither
    data loss nor the row limit is judged on offsets that are not its own. ``warm_until`` (a
    stateful instance warming its state up below its cursor) caps a batch that starts below it there.
    """
    effective_start: PartitionOffsets = {}
    until: PartitionOffsets = {}
    for tp, first in earliest.items():
        if tp not in begin:
            # A new partition enters the offsets at its earliest offset and is read from the next
            # batch on: the checkpoint records where it starts before any of its rows are read.
            log.info("%s source: new partition %s[%d] starts at offset %d", SOURCE_NAME, *tp, first)
            until[tp] = first
            continue
        pos = max(begin[tp], (floors or {}).get(tp[0], {}).get(tp[1], begin[tp]))
        if pos < first:
            if fail_on_data_loss:
                raise DataLossError(tp[0], tp[1], pos, first)
            log.warning("%s", DataLossError(tp[0], tp[1], pos, first))
            log.warning("failOnDataLoss=false: %s[%d] continues from earliest offset %d", *tp, first)
            pos = first
        if pos > latest[tp]:
            if fail_on_data_loss:
                raise KafkaError(
                    f"{tp[0]}[{tp[1]}]: the offset went back from {pos} to {latest[tp]} "
                    "(topic recreated or truncated?); some data may have been missed"
                )
            log.warning("%s[%d]: offset went back from %d to %d, continuing there", *tp, pos, latest[tp])
            effective_start[tp] = until[tp] = latest[tp]
            continue
        effective_start[tp] = pos
        until[tp] = latest[tp]
    for tp, pos in begin.items():
        if tp not in earliest:  # partition vanished (topic deleted?): keep its position
            log.warning("%s source: partition %s[%d] is gone from Kafka", SOURCE_NAME, *tp)
            until[tp] = pos

    for tp, pos in effective_start.items():
        cap = (caps or {}).get(tp[0], {}).get(tp[1])
        if cap is not None:
            until[tp] = max(pos, min(until[tp], cap))
        warm = (warm_until or {}).get(tp[0], {}).get(tp[1])
        if warm is not None and pos < warm:
            until[tp] = min(until[tp], warm)
    if max_rows is not None:
        until = rate_limit(effective_start, until, max_rows)
    return until


#: One read of a task: (topic, partition, first offset, end offset), end exclusive.
ReadRange = tuple[str, int, int, int]


def group_ranges(ranges: list[ReadRange], max_tasks: int | None) -> list[tuple[ReadRange, ...]]:
    """The batch's ranges split into at most ``max_tasks`` tasks of similar size (records).

    Why: every Spark task pays a fixed cost (launch, two Python workers' hand-offs, one sink
    transaction) that dwarfs a few thousand records; with fewer task slots than partitions the
    tasks run one after another, so a batch pays it once per partition for no parallelism. Largest
    range first into the lightest task (deterministic); each task's ranges in (topic, partition)
    order. ``None`` or enough slots: one task per range, as Spark's Kafka source plans.
    """
    if max_tasks is None or len(ranges) <= max_tasks:
        return [(r,) for r in ranges]
    if max_tasks < 1:
        raise ValueError(f"max_tasks must be >= 1, got {max_tasks}")
    tasks: list[list[ReadRange]] = [[] for _ in range(max_tasks)]
    sizes = [0] * max_tasks
    for r in sorted(ranges, key=lambda r: (-(r[3] - r[2]), r[0], r[1])):
        lightest = min(range(max_tasks), key=lambda i: (sizes[i], i))
        tasks[lightest].append(r)
        sizes[lightest] += r[3] - r[2]
    return [tuple(sorted(t)) for t in tasks if t]
