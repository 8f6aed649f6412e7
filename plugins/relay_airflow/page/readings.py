"""What the Relay page reads: the ledger's rows for one pipeline and a time window, and (briefly) Kafka.

Read-only SQL over the ledger's tables (``relay.ledger.schema``) with bounded row counts, so a page
load stays cheap on a ledger with months of batches. Kafka is asked only for the live lag, with a short
timeout, and its answer (or its failure) is kept a few seconds: a page refresh or a down broker must
not stall every request. No Airflow here: ``app`` hands in the ledger URL and bootstrap servers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from relay.errors import KafkaError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from sqlalchemy import func, select, union

from relay_airflow.page import panels, series

MAX_BATCHES = 20_000
MAX_REPORTS = 2_000
MAX_DEAD_LETTERS = 50
MAX_OPERATIONS = 50
KAFKA_TIMEOUT_S = 2.0
KAFKA_TTL_S = 10.0  # an answer (or a failure) is reused this long


def _rows(ledger: Ledger, query: Any) -> list[dict]:
    with ledger.tx() as conn:
        return [dict(r._mapping) for r in conn.execute(query).all()]


def pipelines(ledger: Ledger) -> list[str]:
    """Every pipeline the ledger knows (a health report alone names one too)."""
    query = union(select(s.pipelines.c.name), select(s.reports.c.pipeline.label("name")).distinct())
    with ledger.tx() as conn:
        return sorted({r[0] for r in conn.execute(query).all()})


def overview(ledger: Ledger, pipeline: str, now: float) -> dict[str, Any]:
    """Instances (with attempts and leases), the latest health report, the dead letters."""
    inst_rows = _rows(ledger, select(s.instances).where(s.instances.c.pipeline == pipeline))
    ids = [i["id"] for i in inst_rows]
    attempts: dict[int, list[dict]] = {}
    for a in _rows(
        ledger, select(s.attempts).where(s.attempts.c.instance_id.in_(ids)).order_by(s.attempts.c.id)
    ):
        attempts.setdefault(a["instance_id"], []).append(a)
    leases: dict[int, list[dict]] = {}
    for lease in _rows(ledger, select(s.leases).where(s.leases.c.pipeline == pipeline)):
        leases.setdefault(lease["instance_id"], []).append(lease)
    r = s.reports
    latest = _rows(
        ledger,
        select(r).where(r.c.pipeline == pipeline, r.c.kind == "health").order_by(r.c.id.desc()).limit(1),
    )
    d = s.dead_letters
    with ledger.tx() as conn:
        dead_total = int(conn.execute(select(func.count()).where(d.c.pipeline == pipeline)).scalar_one())
    dead = _rows(
        ledger, select(d).where(d.c.pipeline == pipeline).order_by(d.c.id.desc()).limit(MAX_DEAD_LETTERS)
    )
    return {
        "pipeline": pipeline,
        "generated_iso": series.iso(now),
        "instances": panels.instance_cards(inst_rows, attempts, leases),
        "health": panels.health(latest[0] if latest else None, now),
        "dead_letters": {"total": dead_total, "recent": panels.dead_letter_rows(dead)},
    }


def _batches(ledger: Ledger, pipeline: str, since: float) -> list[dict]:
    b = s.batches
    cols = [b.c.instance_id, b.c.rows_read, b.c.ranges, b.c.committed_at, b.c.duration_ms, b.c.commit_ms]
    query = (
        select(*cols)
        .where(b.c.pipeline == pipeline, b.c.committed_at >= since)
        .order_by(b.c.committed_at.desc())
        .limit(MAX_BATCHES)
    )
    return _rows(ledger, query)[::-1]


def plots(
    ledger: Ledger, pipeline: str, since: float, now: float, kafka_bootstrap: str | None
) -> dict[str, Any]:
    """Every time series of the page over ``[since, now]``."""
    batches = _batches(ledger, pipeline, since)
    instances = {
        i["id"]: i for i in _rows(ledger, select(s.instances).where(s.instances.c.pipeline == pipeline))
    }
    r = s.reports
    reports = _rows(
        ledger,
        select(r.c.created_at, r.c.body)
        .where(r.c.pipeline == pipeline, r.c.kind == "health", r.c.created_at >= since)
        .order_by(r.c.created_at.desc())
        .limit(MAX_REPORTS),
    )
    live, live_error = live_lag(ledger, pipeline, kafka_bootstrap)
    d = s.dead_letters
    with ledger.tx() as conn:
        dead_times = [
            float(t)
            for (t,) in conn.execute(
                select(d.c.created_at).where(d.c.pipeline == pipeline, d.c.created_at >= since)
            ).all()
        ]
    return {
        "pipeline": pipeline,
        "since": since,
        "until": now,
        "since_iso": series.iso(since),
        "until_iso": series.iso(now),
        "kafka": {"ok": live is not None, "error": live_error},
        "lag": series.lag(reports, live, now, (live_error or "").split(": ", 1)[0] or None),
        "throughput": series.throughput(batches, instances),
        "duration": series.durations(batches),
        "cursors": series.cursors(batches),
        "dead_letters": series.dead_letter_counts(dead_times, since, now),
    }


def history(ledger: Ledger, pipeline: str, since: float, now: float) -> dict[str, Any]:
    """The upgrade/recovery timeline over ``[since, now]`` with every operation's H and every gap."""
    insts = _rows(
        ledger, select(s.instances).where(s.instances.c.pipeline == pipeline).order_by(s.instances.c.id)
    )
    o = s.operations
    ops = _rows(
        ledger,
        select(o).where(o.c.pipeline == pipeline).order_by(o.c.id.desc()).limit(MAX_OPERATIONS),
    )
    g = s.gaps
    gaps = _rows(ledger, select(g).where(g.c.pipeline == pipeline).order_by(g.c.id))
    return series.timeline(insts, ops[::-1], gaps, since, now)


def frontier(ledger: Ledger, pipeline: str) -> dict[tuple[str, int], int]:
    """The lowest undrained cursor per partition: where the pipeline still has to read from."""
    out: dict[tuple[str, int], int] = {}
    for lease in ledger.pipeline_leases(pipeline):
        if lease.drained:
            continue
        key = (lease.topic, lease.partition)
        out[key] = min(out.get(key, lease.next_offset), lease.next_offset)
    return out


_cache: dict[tuple[str, str], tuple[float, list[dict] | None, str | None]] = {}
_cache_lock = threading.Lock()


def live_lag(
    ledger: Ledger, pipeline: str, bootstrap: str | None, ttl_s: float = KAFKA_TTL_S
) -> tuple[list[dict] | None, str | None]:
    """(rows, None) with Kafka's latest offsets vs the cursors, or (None, why) when it can't be had."""
    if not bootstrap:
        return None, "no Kafka bootstrap configured"
    key = (bootstrap, pipeline)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < ttl_s:
        return hit[1], hit[2]
    cursors = frontier(ledger, pipeline)
    rows: list[dict] | None = None
    error: str | None = None
    if not cursors:
        error = "no open lease"
    else:
        try:
            with KafkaOffsets(bootstrap, timeout_s=KAFKA_TIMEOUT_S) as kafka:
                latest = {t: kafka.latest(t) for t in sorted({t for t, _ in cursors})}
            rows = series.live_lag_rows(cursors, latest)
        except KafkaError as exc:
            error = f"Kafka unreachable: {exc}"
    with _cache_lock:
        _cache[key] = (time.monotonic(), rows, error)
    return rows, error
