"""Checks over the ledger's batches and dead letters: latency against the trigger, poison growth."""

from __future__ import annotations

import statistics

from relay.config import ADAPTIVE_BATCH_S
from relay.health.report import Check, Level, fmt_s, pct

BATCH_FLOOR_S = 1.0
"""A batch may take this long whatever the trigger: a shorter trigger (the latency mode) only runs
batches back to back, and a small batch's fixed cost (~0.3-0.5 s on two cores) is not a finding."""


def check_latency(
    batches: list[dict],
    trigger_seconds: float,
    now: float,
    window_s: float = 300.0,
    critical_factor: float = 10.0,
    lag: int | None = None,
    fixed_size: int | None = None,
) -> Check:
    """Median and p95 of batch and ledger-commit durations against the trigger interval, and the
    batch size (median rows: adaptive unless ``fixed_size``).

    A batch slower than its trigger means the job can never keep its cadence; slow checkpoint or ledger
    storage shows up here first (it is how the seed jobs died). Not while the pipeline catches up (a
    ``lag`` above the median batch): adaptive batches then grow to take ``ADAPTIVE_BATCH_S`` on purpose.
    """
    recent = [b for b in batches if b["committed_at"] >= now - window_s]
    dur = [float(b["duration_ms"]) for b in recent]
    com = [float(b["commit_ms"]) for b in recent]
    rows = [int(b.get("rows_read") or 0) for b in recent]
    data = {
        "batches": len(recent),
        "window_s": window_s,
        "trigger_ms": trigger_seconds * 1000,
        "duration_ms": {"median": statistics.median(dur) if dur else None, "p95": pct(dur, 95)},
        "commit_ms": {"median": statistics.median(com) if com else None, "p95": pct(com, 95)},
        "rows": {"median": statistics.median(rows) if rows else None, "max": max(rows, default=None)},
        "batch_size": "adaptive" if fixed_size is None else fixed_size,
        "lag": lag,
    }
    if not recent:
        return Check("latency", Level.OK, f"no batch committed in the last {fmt_s(window_s)}", data)
    med, trig = data["duration_ms"]["median"], trigger_seconds * 1000
    size = "adaptive" if fixed_size is None else f"fixed at {fixed_size:,}"
    text = (
        f"batch median {med:.0f} ms, p95 {data['duration_ms']['p95']:.0f} ms; commit median "
        f"{data['commit_ms']['median']:.0f} ms over {len(recent)} batch(es), trigger {trig:.0f} ms; "
        f"median {data['rows']['median']:,.0f} rows a batch ({size})"
    )
    if trig <= 0:
        return Check("latency", Level.OK, text + " (trigger 0: no target)", data)
    action = (
        "check checkpoint and ledger storage latency and the batch size (RELAY_MAX_OFFSETS_PER_TRIGGER); "
        "or raise RELAY_TRIGGER_SECONDS"
    )
    trig = max(trig, BATCH_FLOOR_S * 1000)  # a 0.1 s trigger runs batches back to back: no page for that
    if fixed_size is None and lag is not None and lag > data["rows"]["median"]:
        trig = max(trig, ADAPTIVE_BATCH_S * 1000)  # catching up: long batches on purpose
        text += f"; catching up ({lag:,} behind)"
    if med > critical_factor * trig:
        return Check(
            "latency",
            Level.CRITICAL,
            f"batches take over {critical_factor:g}x the trigger: {text}",
            data,
            action,
        )
    if med > trig:
        return Check("latency", Level.WARN, f"batches are slower than the trigger: {text}", data, action)
    return Check("latency", Level.OK, text, data)


def check_dead_letters(count: int, previous: dict | None) -> Check:
    """Dead letters and their growth since the previous persisted health report."""
    prev_count = prev_at = None
    if previous is not None:
        body = previous.get("body") or {}
        prev_count = (body.get("data") or {}).get("dead_letters")
        prev_at = previous.get("created_at")
    growth = None if prev_count is None else count - int(prev_count)
    data = {"count": count, "previous": prev_count, "previous_at": prev_at, "growth": growth}
    if growth is not None and growth > 0:
        return Check(
            "dead_letters",
            Level.WARN,
            f"{growth} new dead letter(s) since the previous check ({count} in all)",
            data,
            "inspect the table dead_letters (error column) and fix the producer or the job's parser",
        )
    suffix = "" if growth is not None else " (no previous report to compare)"
    return Check("dead_letters", Level.OK, f"{count} dead letter(s), no growth{suffix}", data)
