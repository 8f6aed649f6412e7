"""Checks against Kafka's offsets: lag per partition, and the retention margin of the cursor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relay.health.checks_progress import consume_rates
from relay.health.report import DEPLOY, Check, Level, fmt_s
from relay.kafka.identity import RECOVER

#: How ``lag_seconds`` was obtained, as the report names it (None: no honest figure).
LAG_AGE = "record_timestamp"  # now - timestamp of the oldest unapplied record (read at the cursor)
LAG_DRAIN = "consume_rate"  # lag / the rate the cursor moved while recent batches ran
CAUGHT_UP = "caught_up"


def lag_seconds(lag: int | None, age: float | None, rate: float) -> tuple[float | None, str | None]:
    """(seconds behind, how they were obtained): the age of the oldest unapplied record when it could
    be read, else the lag at the rate the cursor moved while batches ran, else unknown."""
    if lag == 0:
        return 0.0, CAUGHT_UP
    if lag is not None and age is not None:
        return age, LAG_AGE
    if lag is not None and rate > 0:
        return lag / rate, LAG_DRAIN
    return None, None


def lag_over(
    p: int, lag: int | None, seconds: float | None, method: str | None, warn_records: int, warn_seconds: float
) -> str | None:
    """The partition's part of the WARN, when its lag is above either threshold."""
    if lag is None or not (lag > warn_records or (seconds is not None and seconds > warn_seconds)):
        return None
    how = {LAG_AGE: "oldest unapplied record", LAG_DRAIN: "at the recent consume rate"}.get(
        method or "", "seconds unknown"
    )
    return f"[{p}] {lag} records ({fmt_s(seconds)}, {how})"


def lag_verdict(parts: list[dict], over: list[str], data: dict[str, Any]) -> Check:
    """WARN naming the partitions over a threshold; else OK with the total and the worst delay."""
    if over:
        return Check(
            "lag",
            Level.WARN,
            f"lag above {data['warn_records']} records or {fmt_s(data['warn_seconds'])}: " + ", ".join(over),
            data,
            "check progress; if the job keeps up too slowly raise RELAY_MAX_OFFSETS_PER_TRIGGER or cores",
        )
    worst = max((d for d in parts if d["lag_seconds"]), key=lambda d: d["lag_seconds"], default=None)
    behind = (
        f", at most {fmt_s(worst['lag_seconds'])} behind ({worst['lag_seconds_method']})" if worst else ""
    )
    return Check("lag", Level.OK, f"total lag {data['total']} records{behind}", data)


def check_lag(
    offsets: list[dict],
    batches: list[dict],
    now: float,
    window_s: float = 300.0,
    warn_records: int = 100_000,
    warn_seconds: float = 300.0,
    topic: str | None = None,
    waiting: dict[int, float | None] | None = None,
    trigger_seconds: float = 0.0,
) -> Check:
    """Lag per partition in records and in seconds, naming how the seconds were obtained.

    Seconds come from the timestamp of the oldest unapplied record when it could be read (``waiting``:
    how long that record has waited; the most honest figure, no extrapolation), else from the lag and
    the rate the cursor moved while the window's batches ran (:func:`consume_rates`), else unknown.
    Never from a rate averaged over a window that a recent burst dominates: "12.3 min" for a burst
    produced 5 s earlier was that mistake.
    """
    topic = topic or (offsets[0]["topic"] if offsets else "")
    rates = consume_rates(batches, topic, now - window_s, trigger_seconds)
    parts, over = [], []
    for row in offsets:
        p, lag = int(row["partition"]), row.get("lag")
        rate = rates.get(p, 0.0)
        seconds, method = lag_seconds(lag, (waiting or {}).get(p), rate)
        parts.append(
            {
                "partition": p,
                "lag": lag,
                "rate_per_s": round(rate, 3),
                "lag_seconds": None if seconds is None else round(seconds, 1),
                "lag_seconds_method": method,
            }
        )
        note = lag_over(p, lag, seconds, method, warn_records, warn_seconds)
        if note:
            over.append(note)
    methods = {d["lag_seconds_method"] for d in parts} - {None, CAUGHT_UP}
    data = {
        "partitions": parts,
        "total": sum(int(d["lag"] or 0) for d in parts),
        "warn_records": warn_records,
        "warn_seconds": warn_seconds,
        "seconds_methods": sorted(methods),
    }
    return lag_verdict(parts, over, data)


# ---------------------------------------------------------------------------------- retention
def cursor_age(lag: int, produce_rate: float | None, known: float | None) -> tuple[float | None, str | None]:
    """(how old the record at the cursor is, how that was obtained): its timestamp's age when it could
    be read, else ``lag / produce_rate`` (overstated after a burst: errs towards an early warning)."""
    if known is not None:
        return known, LAG_AGE
    if produce_rate:
        return lag / produce_rate, "produce_rate"
    return None, None


def time_left(margin: int, age: float | None, retention_s: float | None, chase: float) -> float | None:
    """Seconds before retention overtakes the cursor: by the age of its record under time-based
    retention, else by how fast the earliest offset closes the margin (``chase``); None: neither."""
    estimates: list[float] = []
    if retention_s is not None and age is not None:
        estimates.append(retention_s - age)
    if chase > 0 and not estimates:  # time-based retention: the age alone says when
        estimates.append(margin / chase)
    return max(min(estimates), 0.0) if estimates else None


def gone(row: dict) -> str | None:
    """The partition's part of the CRITICAL, when retention removed records below its cursor."""
    cursor, earliest = row.get("cursor"), int(row["earliest"])
    if cursor is None or cursor >= earliest:
        return None
    return (
        f"[{int(row['partition'])}] cursor {cursor} < earliest {earliest} ({earliest - cursor} records gone)"
    )


@dataclass(frozen=True)
class Rates:
    """The rates the retention estimate reads, per partition (records/s; None: no history)."""

    produce: dict[int, float | None]
    earliest: dict[int, float | None]
    consume: dict[int, float]
    waiting: dict[int, float | None]


def retention_partition(row: dict, retention_s: float | None, rates: Rates) -> tuple[dict, float | None]:
    """(the partition as the report lists it, the seconds left before retention overtakes its cursor)."""
    p, cursor, lag = int(row["partition"]), row.get("cursor"), row.get("lag")
    if cursor is None:
        return {"partition": p, "margin": None, "time_left_s": None, "invalidated": False}, None
    margin = cursor - int(row["earliest"])
    age, method, left = None, None, None
    if margin >= 0 and lag:
        age, method = cursor_age(lag, rates.produce.get(p), rates.waiting.get(p))
        chase = (rates.earliest.get(p) or 0.0) - rates.consume.get(p, 0.0)
        left = time_left(margin, age, retention_s, chase)
    return {
        "partition": p,
        "margin": margin,
        "time_left_s": None if left is None else round(left, 1),
        "invalidated": margin < 0,
        "produce_rate": rates.produce.get(p),
        "consume_rate": rates.consume.get(p, 0.0),
        "cursor_age_s": None if age is None else round(age, 1),
        "cursor_age_method": method,
    }, left


def retention_verdict(invalid: list[str], short: list[str], data: dict[str, Any]) -> Check:
    """CRITICAL once records the pipeline had not read are gone; WARN when that is 2 intervals away."""
    if invalid:
        return Check(
            "retention",
            Level.CRITICAL,
            "invalidated: retention removed records the pipeline had not read: " + ", ".join(invalid),
            data,
            "run the recovery DAG relay_recover (strategy earliest; dry-run first to see the plan)",
        )
    if short:
        return Check(
            "retention",
            Level.WARN,
            "retention will overtake the cursor within 2 health intervals: " + ", ".join(short),
            data,
            f"make sure the job runs and keeps up ({DEPLOY} if down), or raise the topic's retention.ms",
        )
    known = data["retention_ms"] is not None and data["retention_ms"] >= 0
    note = "" if known else " (retention.ms unknown or infinite)"
    margins = [d["margin"] for d in data["partitions"] if d["margin"] is not None]
    return Check(
        "retention", Level.OK, f"smallest margin {min(margins) if margins else 'n/a'} records{note}", data
    )


def check_retention(
    offsets: list[dict],
    retention_ms: int | None,
    produce: dict[int, float | None],
    earliest_rate: dict[int, float | None],
    consume: dict[int, float],
    interval_s: float = 300.0,
    config_error: str | None = None,
    waiting: dict[int, float | None] | None = None,
) -> Check:
    """Margin (cursor - earliest) per partition and an honest estimate of the time before retention
    overtakes the cursor. Two estimates, the smaller wins, None when neither can be made:

    * age: the record at the cursor expires ``retention.ms`` after it was produced (time-based
      retention, segment granularity aside). Its age is its timestamp when it could be read
      (``waiting``), else ``lag / produce_rate``: the fallback overstates the age after a burst
      (the rate is averaged over the history), which errs towards an early warning;
    * chase, only without the first (retention by size, or ``retention.ms`` unknown): the earliest
      offset advances at the rate records were removed over the history, the cursor at the
      consumption rate; the margin closes at the difference. Under time-based retention the age is
      exact, and a one-off ``delete_records`` made the chase warn for as long as it stayed in the
      history.
    """
    retention_s = retention_ms / 1000 if retention_ms is not None and retention_ms >= 0 else None
    rates = Rates(produce, earliest_rate, consume, waiting or {})
    parts, short = [], []
    for row in offsets:
        part, left = retention_partition(row, retention_s, rates)
        parts.append(part)
        if left is not None and left < 2 * interval_s:
            short.append(f"[{part['partition']}] {fmt_s(left)} left (margin {part['margin']} records)")
    invalid = [x for x in map(gone, offsets) if x]
    data = {
        "partitions": parts,
        "retention_ms": retention_ms,
        "interval_s": interval_s,
        "config_error": config_error,
        "suggested_strategy": "earliest" if invalid else None,
    }
    return retention_verdict(invalid, short, data)


def check_identity(problems: list[str], topic: str) -> Check:
    """CRITICAL when the records at the applied offsets are not the ones applied (``relay.kafka.identity``):
    a topic re-created under the same name, a partition truncated. The driver refuses to start then."""
    if problems:
        return Check(
            "topic_identity",
            Level.CRITICAL,
            f"topic {topic!r} is not the one the pipeline read: " + "; ".join(problems),
            {"problems": problems},
            RECOVER,
        )
    return Check("topic_identity", Level.OK, "the applied records are where the pipeline read them", {})
