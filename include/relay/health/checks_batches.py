"""Checks over the ledger's batches and dead letters: latency against the trigger, poison growth."""

from __future__ import annotations

import statistics
from typing import Any

from relay.config import ADAPTIVE_BATCH_S
from relay.health.report import Check, Level, fmt_s, pct

BATCH_FLOOR_S = 2.0
"""A batch may take this long whatever the trigger: a shorter trigger (the latency mode) only runs
batches back to back, and a small batch's fixed cost is not a finding. That cost was 0.3-0.5 s on two
fast cores for a one-stage pipeline, and 1.3-1.6 s (84 rows a batch) for the shuffling Kafka example on
two cores half as fast: a 1 s floor paged that healthy pipeline WARN (CI, 2026-11-29)."""
LATENCY_ACTION = (
    "check checkpoint and ledger storage latency and the batch size (RELAY_MAX_OFFSETS_PER_TRIGGER); "
    "or raise RELAY_TRIGGER_SECONDS"
)


def latency_data(
    recent: list[dict], window_s: float, trigger_seconds: float, lag: int | None, fixed_size: int | None
) -> dict[str, Any]:
    """Median and p95 of the window's batch and commit durations, and its batch sizes."""
    dur = [float(b["duration_ms"]) for b in recent]
    com = [float(b["commit_ms"]) for b in recent]
    rows = [int(b.get("rows_read") or 0) for b in recent]
    return {
        "batches": len(recent),
        "window_s": window_s,
        "trigger_ms": trigger_seconds * 1000,
        "duration_ms": {"median": statistics.median(dur) if dur else None, "p95": pct(dur, 95)},
        "commit_ms": {"median": statistics.median(com) if com else None, "p95": pct(com, 95)},
        "rows": {"median": statistics.median(rows) if rows else None, "max": max(rows, default=None)},
        "batch_size": "adaptive" if fixed_size is None else fixed_size,
        "lag": lag,
    }


def latency_text(data: dict[str, Any], fixed_size: int | None) -> str:
    """The figures every latency finding states, whatever its level."""
    size = "adaptive" if fixed_size is None else f"fixed at {fixed_size:,}"
    return (
        f"batch median {data['duration_ms']['median']:.0f} ms, p95 {data['duration_ms']['p95']:.0f} ms; "
        f"commit median {data['commit_ms']['median']:.0f} ms over {data['batches']} batch(es), "
        f"trigger {data['trigger_ms']:.0f} ms; median {data['rows']['median']:,.0f} rows a batch ({size})"
    )


def target_ms(
    trigger_ms: float, lag: int | None, median_rows: float, fixed_size: int | None
) -> tuple[float, bool]:
    """(the batch duration still on time, whether the pipeline is catching up). A trigger under
    BATCH_FLOOR_S only runs batches back to back; adaptive batches grow to ADAPTIVE_BATCH_S on purpose
    while more than a median batch is behind."""
    target = max(trigger_ms, BATCH_FLOOR_S * 1000)
    if fixed_size is None and lag is not None and lag > median_rows:
        return max(target, ADAPTIVE_BATCH_S * 1000), True
    return target, False


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
    data = latency_data(recent, window_s, trigger_seconds, lag, fixed_size)
    if not recent:
        return Check("latency", Level.OK, f"no batch committed in the last {fmt_s(window_s)}", data)
    text = latency_text(data, fixed_size)
    if data["trigger_ms"] <= 0:
        return Check("latency", Level.OK, text + " (trigger 0: no target)", data)
    target, catching_up = target_ms(data["trigger_ms"], lag, data["rows"]["median"], fixed_size)
    if catching_up:
        text += f"; catching up ({lag:,} behind)"
    med, action = data["duration_ms"]["median"], LATENCY_ACTION
    if med > critical_factor * target:
        return Check(
            "latency",
            Level.CRITICAL,
            f"batches take over {critical_factor:g}x the trigger: {text}",
            data,
            action,
        )
    if med > target:
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
