"""Stateful pipelines: operator state that survives an upgrade, by warm-up replay.

A stateful pipeline (``Pipeline(stateful=True, warm_up_s=...)``) applies its transform to the
stream, so Spark keeps the aggregation's state in the instance's checkpoint and hands each batch's
UPDATED rows (output mode ``update``) to the sink. A new version starts with an empty checkpoint, so
without help its first windows would be counted from the handoff on only. Relay's answer:

1. **Shadow reading.** Green, while a warm standby, starts its source ``warm_up_s`` back (by the
   records' Kafka timestamps, :func:`warm_up_offsets`) and reads on, outside any lease, with its
   writes suppressed (the tasks run, so Spark's state store advances, with no range to apply). Its
   source records each batch's planned end under green's row lock, as blue's does. Green reports
   READY once it has caught up to within one batch of the topic's end.
2. **The handoff takes H at or above green's planned ends** as well as blue's, in the same locked
   transaction: green has read nothing at or past H, so every record from H on is in a batch green
   writes, and every record below H in one blue writes.
3. **Newer writer wins, by group key.** Output rows carry no single source record, so the sink's
   source position is the WRITER's: ``(relay-state, generation, epoch * 2**32 + batch id)`` where
   the generation is the highest lease id of the writing instance (:func:`generation`). Lease ids
   only grow and every takeover opens leases, so green (leases opened at the handoff) beats blue's
   drain, a rollback's instance beats both, and blue after an aborted upgrade (Relay opens it a new
   lease) beats green. Within one writer a later attempt (a newer epoch) wins, then a later batch;
   a replayed batch writes the same values again (the state is restored from the checkpoint). The
   epoch matters when a relaunch finds its checkpoint empty: its batch ids start at 0 again under
   the same generation, and its whole, warmed-up values must still beat its own older rows (the
   model's finding HEAL_SAME_GENERATION, issue #29). ``PostgresUpsertSink`` keeps exactly this rule.

4. **Every new writer warms up, not only an upgrade's green** (issue #29). A stateful instance whose
   query starts on an empty checkpoint (a deploy after a stop, a recovery, a relaunch that lost its
   checkpoint) starts its source :func:`warm_up_before` its cursors: ``warm_up_s`` before the
   newest record below them, by Kafka timestamps. Those records are outside its leases: its tasks
   write none of them while Spark's state store takes them in, and its source caps each batch at
   the cursor while it reads below it (``relay.protocol.guard``: ``warm_until``), so no batch holds
   records on both sides. From the cursor on it writes with a state as whole as the old
   instance's, and wins as the newer generation. After a recovery whose warm-up reaches below
   Kafka's earliest offset, the windows that straddle it are counted from what Kafka still holds.

Why the results match a run without an upgrade: a window still open at H gets records only at or
after ``H - warm_up_s``, all of which green read, so green's value for it is whole and wins; a window
closed before H is blue's, written whole. The rule a pipeline must keep: ``warm_up_s`` at least the
longest window plus the watermark delay, and records' event times close to their Kafka timestamps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from relay.errors import ConfigError, KafkaError

STATE_TOPIC = "relay-state"  # the _relay_topic of every row a stateful pipeline writes
Ranges = Mapping[tuple[str, int], tuple[int, int]]


def generation(lease_ids: Iterable[int]) -> int:
    """The writer's generation: the highest id among the instance's leases (0: none yet)."""
    return max(lease_ids, default=0)


def state_position(epoch: int, batch_id: int) -> int:
    """The writer's position within its generation: a newer attempt beats any batch of an older one."""
    return (epoch << 32) + batch_id


def state_ranges(source_ranges: Ranges, gen: int, position: int) -> dict[tuple[str, int], tuple[int, int]]:
    """The sink's ranges for one batch of aggregated rows: the writer's position when the batch
    holds any record this instance may apply, else none (a shadow batch: every row skipped)."""
    if not source_ranges:
        return {}
    return {(STATE_TOPIC, gen): (position, position + 1)}


def with_state_position(df: Any, gen: int, position: int) -> Any:
    """``df`` (a batch of aggregated rows) with the source columns the sink orders writes by."""
    from pyspark.sql import functions as F

    return (
        df.withColumn("topic", F.lit(STATE_TOPIC))
        .withColumn("partition", F.lit(gen).cast("int"))
        .withColumn("offset", F.lit(position).cast("long"))
    )


def check_stateful_sink(pipeline_name: str, sink: object) -> None:
    """Only a keyed upsert keeps "newer writer wins" by group key (ConfigError otherwise)."""
    from relay.sinks.postgres_upsert import PostgresUpsertSink

    if not isinstance(sink, PostgresUpsertSink):
        raise ConfigError(
            f"pipeline {pipeline_name} is stateful: its sink must be a PostgresUpsertSink keyed by the "
            f"aggregation's group columns (newer writer wins), not {type(sink).__name__}"
        )


def warm_up_offsets(bootstrap: str, topic: str, seconds: float, now_ms: int) -> str:
    """startingOffsets JSON of a stateful standby: per partition, the first offset whose Kafka
    timestamp is at or after ``now - seconds`` (the partition's end when it has none that late)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError as VendorKafkaError

    since = max(int(now_ms - seconds * 1000), 0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise KafkaError(f"topic {topic} has no partitions (or does not exist): no warm-up start")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        found = consumer.offsets_for_times(dict.fromkeys(tps, since))
        ends = consumer.end_offsets(tps)
    except VendorKafkaError as exc:
        raise KafkaError(f"cannot find the warm-up start of {topic}: {exc}") from exc
    finally:
        consumer.close()
    start = {str(tp.partition): (found[tp].offset if found.get(tp) else ends[tp]) for tp in tps}
    return json.dumps({topic: start})


def warm_up_before(bootstrap: str, topic: str, seconds: float, cursors: Mapping[int, int]) -> str:
    """startingOffsets JSON of a stateful instance starting on an empty checkpoint at ``cursors``
    (partition -> where it writes next): per partition, the first offset whose Kafka timestamp is
    at or after ``T - seconds``, T being the newest timestamp among the records just below the
    cursors; never below Kafka's earliest offset nor above the cursor."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError as VendorKafkaError

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tps = {p: TopicPartition(topic, p) for p in sorted(cursors)}
        earliest = consumer.beginning_offsets(list(tps.values()))
        stamps = [_timestamp_before(consumer, tp, cursors[p]) for p, tp in tps.items()]
        newest = max((t for t in stamps if t is not None), default=None)
        if newest is None:  # nothing below any cursor: nothing to warm up from
            return json.dumps({topic: {str(p): c for p, c in cursors.items()}})
        since = max(int(newest - seconds * 1000), 0)
        found = consumer.offsets_for_times(dict.fromkeys(tps.values(), since))
    except VendorKafkaError as exc:
        raise KafkaError(f"cannot find the warm-up start of {topic}: {exc}") from exc
    finally:
        consumer.close()
    start = {}
    for p, tp in tps.items():
        at = found[tp].offset if found.get(tp) else cursors[p]
        start[str(p)] = max(earliest[tp], min(at, cursors[p]))
    return json.dumps({topic: start})


def _timestamp_before(consumer: Any, tp: Any, cursor: int, timeout_s: float = 30.0) -> int | None:
    """The Kafka timestamp (ms) of the last record below ``cursor`` (None: no record there).

    Reads a window just below the cursor, widened while it holds no record (offsets of transaction
    markers and aborted records hold none)."""
    low = consumer.beginning_offsets([tp])[tp]
    consumer.assign([tp])
    width, deadline = 16, time.monotonic() + timeout_s
    while cursor > low:
        first = max(low, cursor - width)
        consumer.seek(tp, first)
        last = None
        while consumer.position(tp) < cursor and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200).get(tp, []):
                if record.offset < cursor:
                    last = record
        if last is not None:
            return int(last.timestamp)
        if first == low or time.monotonic() >= deadline:
            return None
        width *= 8
    return None


def caught_up(
    end: Mapping[str, Mapping[int, int]], latest: Mapping[int, int], topic: str, slack: int
) -> bool:
    """A shadow batch ending at ``end`` is within ``slack`` records of the topic's ``latest`` ends."""
    lag = sum(max(latest[p] - end.get(topic, {}).get(p, 0), 0) for p in latest)
    return lag <= slack
