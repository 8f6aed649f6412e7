"""Processing pause: each record's production -> application latency, per window of a bench run.

Why per record: an upgrade's cost to a consumer of the output is the longest a record waited, not
the operation's own step times. Production time is the Kafka record's timestamp (CreateTime, set by
the producer at send); application time is ``committed_at`` of the batch that applied it (the
counter's task writes the ``messages`` row, then the driver commits the batch). A message row joins the
batch of the same instance and batch id whose ranges cover its offset: batch ids are per instance and
a relaunch may repeat one (a replayed batch records an empty-ranged row), so the id alone is not a key.

The pure functions come first (unit tested); the readers of Kafka and the ledger follow.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .stats import percentile

Position = tuple[int, int]  # (partition, offset) within the bench topic


class Sample(NamedTuple):
    """One record: when it was produced and when it was first applied (epoch seconds)."""

    partition: int
    offset: int
    produced: float
    applied: float

    @property
    def latency(self) -> float:
        return self.applied - self.produced


def covers(ranges: Iterable[Mapping[str, Any]], topic: str, partition: int, offset: int) -> bool:
    """Whether a batch's cursor moves ``[from, to)`` include the offset."""
    return any(
        r.get("topic") == topic
        and int(r["partition"]) == partition
        and int(r["from"]) <= offset < int(r["to"])
        for r in ranges or ()
    )


def application_times(
    messages: Iterable[Mapping[str, Any]], batches: Iterable[Mapping[str, Any]], topic: str
) -> tuple[dict[Position, list[float]], int]:
    """Per record, the commit time of every batch that applied it (two = a duplicate), and how many
    message rows found no covering batch (a bug in the join or the ledger: must be 0). A row whose own
    batch never committed (its instance died after its task wrote; the next one took the row over
    in the sink, ``relay.protocol.predecessors``) is applied at the first commit that covers it."""
    by_batch: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for b in batches:
        by_batch.setdefault((int(b["instance_id"]), int(b["batch_id"])), []).append(b)
    out: dict[Position, list[float]] = {}
    unmatched = 0
    for m in messages:
        part, off = int(m["partition"]), int(m["offset"])
        if m.get("topic", topic) != topic:
            continue
        hit = next(
            (
                b
                for b in by_batch.get((int(m["instance_id"]), int(m["batch_id"])), [])
                if covers(b["ranges"], topic, part, off)
            ),
            None,
        )
        if hit is None:  # written by an instance that died before its commit and was taken over:
            hit = _first_cover(batches, topic, part, off)  # applied by the taker's covering commit
        if hit is None:
            unmatched += 1
            continue
        out.setdefault((part, off), []).append(float(hit["committed_at"]))
    return out, unmatched


def _first_cover(batches: Iterable[Mapping[str, Any]], topic: str, partition: int, offset: int) -> Any:
    """The earliest committed batch whose cursor moves cover the offset (None: none did)."""
    covering = [b for b in batches if covers(b["ranges"], topic, partition, offset)]
    return min(covering, key=lambda b: float(b["committed_at"]), default=None)


def join_samples(produced: Mapping[Position, float], applied: Mapping[Position, list[float]]) -> list[Sample]:
    """A sample per produced record that was applied (first application), in production order."""
    out = [Sample(p, o, t, min(applied[(p, o)])) for (p, o), t in produced.items() if applied.get((p, o))]
    return sorted(out, key=lambda s: (s.produced, s.partition, s.offset))


def exactly_once_counts(
    produced: Mapping[Position, float], applied: Mapping[Position, list[float]]
) -> dict[str, int]:
    """Over the produced records: applied twice or more (duplicates), never applied (gaps)."""
    dups = sum(1 for pos in produced if len(applied.get(pos, ())) > 1)
    gaps = sum(1 for pos in produced if not applied.get(pos))
    return {"records": len(produced), "duplicates": dups, "gaps": gaps}


def in_flight(samples: Iterable[Sample], start: float, end: float) -> list[Sample]:
    """The records in flight at some moment of ``[start, end)``: produced before its end and applied
    at or after its start. A record produced just before an upgrade but held until green's first
    commit counts for the upgrade, as it should."""
    return [s for s in samples if s.produced < end and s.applied >= start]


def latency_summary(samples: Iterable[Sample]) -> dict[str, Any]:
    """n, p50, p99, max of the latencies (s), and the worst record (where the pause fell)."""
    rows = list(samples)
    lat = [s.latency for s in rows]
    worst = max(rows, key=lambda s: s.latency) if rows else None
    return {
        "n": len(rows),
        "p50_s": percentile(lat, 50),
        "p99_s": percentile(lat, 99),
        "max_s": max(lat) if lat else None,
        "worst": worst._asdict() if worst else None,
    }


def pause_s(window: Mapping[str, Any], steady: Mapping[str, Any]) -> float | None:
    """The processing pause: the window's longest latency minus steady state's longest."""
    hi, base = window.get("max_s"), steady.get("max_s")
    if hi is None or base is None:
        return None
    return float(hi) - float(base)


# ---------------------------------------------------------------------------------- readers (I/O)
def read_production_times(
    bootstrap: str, topic: str, start: Mapping[int, int], end: Mapping[int, int], timeout_s: float = 120.0
) -> tuple[dict[Position, float], list[int]]:
    """Kafka timestamps (s) of the records in ``[start, end)`` per partition, and the timestamp types
    seen (0 = CreateTime, what the latency needs; 1 = LogAppendTime would hide the producer's clock)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    out: dict[Position, float] = {}
    types: set[int] = set()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(end) if end[p] > start.get(p, 0)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start.get(tp.partition, 0))
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} {dict(start)} -> {dict(end)} took over {timeout_s:.0f}s")
            for tp, recs in consumer.poll(timeout_ms=1000, max_records=10_000).items():
                for r in recs:
                    if r.offset < end[tp.partition]:
                        out[(tp.partition, r.offset)] = r.timestamp / 1000.0
                        types.add(int(r.timestamp_type))
    finally:
        consumer.close()
    return out, sorted(types)


def read_applications(
    ledger_url: str, pipeline: str, topic: str, start: Mapping[int, int], since: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The counter's message rows at or after ``start`` and the batches committed since ``since``."""
    from relay.ledger import schema as s
    from relay.ledger.store import Ledger
    from relay.sinks.ledger_messages_tables import messages
    from sqlalchemy import and_, or_, select

    m, b = messages, s.batches
    where = or_(*(and_(m.c.partition == p, m.c.offset >= o) for p, o in start.items()))
    with Ledger(ledger_url).engine.connect() as conn:
        msgs = conn.execute(
            select(m.c.topic, m.c.partition, m.c.offset, m.c.instance_id, m.c.batch_id).where(
                m.c.pipeline == pipeline, m.c.topic == topic, where
            )
        )
        messages = [dict(r._mapping) for r in msgs]
        rows = conn.execute(
            select(b.c.instance_id, b.c.batch_id, b.c.ranges, b.c.committed_at).where(
                b.c.pipeline == pipeline, b.c.committed_at >= since
            )
        )
        batches = [dict(r._mapping) for r in rows]
    return messages, batches
