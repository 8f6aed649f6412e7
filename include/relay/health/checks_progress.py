"""Progress: Burrow's evaluation rules (OK, WARN, STALL, STOP, ERR) over the cursor history.

The cursor history is the ledger's ``batches`` table; the lag history is the offsets that previous
health reports persisted. Rates derived from both are shared with the lag and retention checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relay.health.report import (
    DEPLOY,
    STOP,
    Check,
    Level,
    PartitionStatus,
    RunState,
    fmt_s,
)

_PROGRESS_LEVEL = {
    PartitionStatus.OK: Level.OK,
    PartitionStatus.UNOWNED: Level.OK,
    PartitionStatus.WARN: Level.WARN,
    PartitionStatus.STALL: Level.CRITICAL,
    PartitionStatus.STOP: Level.CRITICAL,
    PartitionStatus.ERR: Level.CRITICAL,
    PartitionStatus.STOPPED: Level.OK,
}


def cursor_moves(batches: list[dict], topic: str, since: float) -> dict[int, int]:
    """Records the cursor moved per partition in batches committed after ``since`` (from the ledger)."""
    moved: dict[int, int] = {}
    for b in batches:
        if b["committed_at"] < since:
            continue
        for r in b.get("ranges") or []:
            if r.get("topic") == topic:
                p = int(r["partition"])
                moved[p] = moved.get(p, 0) + max(int(r["to"]) - int(r["from"]), 0)
    return moved


def last_moves(batches: list[dict], topic: str) -> dict[int, float]:
    """Commit time of the newest batch that moved each partition's cursor (among ``batches``)."""
    last: dict[int, float] = {}
    for b in batches:
        for r in b.get("ranges") or []:
            if r.get("topic") == topic and int(r["to"]) > int(r["from"]):
                p = int(r["partition"])
                last[p] = max(last.get(p, 0.0), float(b["committed_at"]))
    return last


def consume_rates(
    batches: list[dict], topic: str, since: float, trigger_seconds: float = 0.0
) -> dict[int, float]:
    """Records/s each partition's cursor moved while batches ran, over batches committed after ``since``.

    Why not records moved / window: a pipeline that idled for most of the window (nothing to read)
    and then took a burst would show a rate many times too low, and a lag in seconds many times too
    high. Each batch counts for its own duration, or one trigger interval when it was faster (the
    cadence at which a backlogged job can take batches).
    """
    moved: dict[int, int] = {}
    busy: dict[int, float] = {}
    for b in batches:
        if b["committed_at"] < since:
            continue
        took = max(float(b["committed_at"]) - float(b["started_at"]), trigger_seconds, 1e-3)
        for r in b.get("ranges") or []:
            n = int(r["to"]) - int(r["from"])
            if r.get("topic") == topic and n > 0:
                p = int(r["partition"])
                moved[p] = moved.get(p, 0) + n
                busy[p] = busy.get(p, 0.0) + took
    return {p: moved[p] / busy[p] for p in moved}


def waiting_bound(p: int, cursor: int, samples: list[dict], now: float) -> float | None:
    """Upper bound of how long the record at ``cursor`` has existed, from earlier health samples.

    A sample whose latest offset was still at or below the cursor was taken before that record was
    written: records cannot have waited longer than since that sample. None without such a sample.
    """
    empty = [s["at"] for s in samples if p in s["offsets"] and int(s["offsets"][p]["latest"]) <= cursor]
    return max(now - max(empty), 0.0) if empty else None


def history_samples(reports: list[dict]) -> list[dict]:
    """Offsets per partition seen by previous health reports, oldest first: ``[{at, offsets: {p: row}}]``."""
    out = []
    for r in reports:
        body = r.get("body") or {}
        rows = (body.get("data") or {}).get("offsets")
        if rows:
            out.append(
                {
                    "at": float(body.get("created_at") or r["created_at"]),
                    "offsets": {int(row["partition"]): row for row in rows},
                }
            )
    return sorted(out, key=lambda s: s["at"])


def window_samples(samples: list[dict], now: float, window_s: float) -> list[dict]:
    """The samples inside the window, preceded by the last one before it (the window's baseline)."""
    start = now - window_s
    before = [s for s in samples if s["at"] <= start]
    inside = [s for s in samples if start < s["at"] < now]
    return ([before[-1]] if before else []) + inside


def _offset_rates(
    offsets: list[dict], samples: list[dict], now: float, field: str
) -> dict[int, float | None]:
    """Records/s by which ``field`` (latest or earliest) moved per partition since the oldest sample."""
    rates: dict[int, float | None] = {}
    for row in offsets:
        p = int(row["partition"])
        old = next((s for s in samples if p in s["offsets"]), None)
        if old is None or now - old["at"] <= 0:
            rates[p] = None
        else:
            rates[p] = max(int(row[field]) - int(old["offsets"][p][field]), 0) / (now - old["at"])
    return rates


def produce_rates(offsets: list[dict], samples: list[dict], now: float) -> dict[int, float | None]:
    """Records/s written per partition since the oldest sample (None without history)."""
    return _offset_rates(offsets, samples, now, "latest")


def earliest_rates(offsets: list[dict], samples: list[dict], now: float) -> dict[int, float | None]:
    """Records/s retention removed per partition since the oldest sample (None without history)."""
    return _offset_rates(offsets, samples, now, "earliest")


@dataclass(frozen=True)
class Window:
    """What every partition's judgement reads, gathered once per check."""

    now: float
    window_s: float
    run_state: RunState
    moves: dict[int, int]  # records each cursor moved in the window
    last: dict[int, float]  # when each cursor last moved
    window: list[dict]  # the samples of the window, after its baseline
    samples: list[dict]  # every earlier sample
    waiting: dict[int, float | None]  # the age of the oldest unapplied record, when it could be read
    history_s: float | None  # how long the running attempt(s) could have moved the cursor


def lag_history(p: int, window: list[dict]) -> list[int]:
    """The partition's lag at each sample of the window that knew it."""
    return [
        int(s["offsets"][p]["lag"])
        for s in window
        if p in s["offsets"] and s["offsets"][p].get("lag") is not None
    ]


def stalled_for(p: int, cursor: int | None, w: Window) -> tuple[float | None, float | None]:
    """(how long the cursor may have been stuck, how long records have waited at it).

    The smallest of what is known, never more than the pipeline's history: since the cursor last
    moved, since the attempt became active (``history_s``), since records wait at the cursor (their
    age, else a bound from earlier samples). None: nothing bounds it (no live attempt known).
    """
    bound = None if cursor is None else waiting_bound(p, cursor, w.samples, w.now)
    waited = min((x for x in (w.waiting.get(p), bound) if x is not None), default=None)
    bounds = [w.now - w.last[p]] if p in w.last else []
    bounds += [b for b in (w.history_s, waited) if b is not None]
    return (min(bounds) if bounds else None), waited


def growing(lag: int | None, lags: list[int]) -> bool:
    """The lag grew over every sample of the window, up to now (Burrow's WARN)."""
    if lag is None or not lags:
        return False
    series = [*lags, lag]
    return all(b > a for a, b in zip(series, series[1:]))


def partition_status(
    cursor: int | None,
    earliest: int,
    lag: int | None,
    advanced: bool,
    grows: bool,
    stalled_s: float | None,
    w: Window,
) -> PartitionStatus:
    """Burrow's rule for one partition, the first that applies (see :func:`check_progress`)."""
    if cursor is None:
        return PartitionStatus.UNOWNED
    if cursor < earliest:
        return PartitionStatus.ERR
    if not lag:
        return PartitionStatus.OK
    if w.run_state is RunState.DOWN:
        return PartitionStatus.STOP
    if w.run_state is RunState.STOPPED:
        return PartitionStatus.STOPPED
    if advanced:
        return PartitionStatus.WARN if grows else PartitionStatus.OK
    if w.run_state is RunState.UNKNOWN:
        return PartitionStatus.OK
    stuck = stalled_s is None or stalled_s >= w.window_s
    return PartitionStatus.STALL if stuck else PartitionStatus.OK


def judge_partition(row: dict, w: Window) -> dict[str, Any]:
    """One partition's status, and the figures it was judged on, as the report lists them."""
    p, cursor, lag = int(row["partition"]), row.get("cursor"), row.get("lag")
    lags = lag_history(p, w.window)
    advanced = w.moves.get(p, 0) > 0
    stalled_s, waited = stalled_for(p, cursor, w)
    status = partition_status(cursor, int(row["earliest"]), lag, advanced, growing(lag, lags), stalled_s, w)
    return {
        "partition": p,
        "status": status.value,
        "cursor": cursor,
        "lag": lag,
        "moved_in_window": w.moves.get(p, 0),
        "lag_history": lags,
        "stalled_s": None if stalled_s is None or advanced or not lag else round(stalled_s, 1),
        "waiting_s": None if waited is None else round(waited, 1),
    }


# ------------------------------------------------------------------- one finding per status
Finding = tuple[str, str | None]  # (what the report says, what to run next)


def _err(ids: list[int], parts: list[dict], window_s: float) -> Finding:
    return (
        f"ERR on partition(s) {ids}: the cursor is below the earliest "
        "offset, retention removed records the pipeline had not read",
        "run the recovery DAG relay_recover (strategy earliest; dry-run first)",
    )


def _stop(ids: list[int], parts: list[dict], window_s: float) -> Finding:
    return f"STOP on partition(s) {ids}: messages are waiting and nothing reads them", DEPLOY


def _stopped(ids: list[int], parts: list[dict], window_s: float) -> Finding:
    return f"stopped on purpose: records wait on partition(s) {ids} for the next deploy", None


def _stall(ids: list[int], parts: list[dict], window_s: float) -> Finding:
    stuck = ", ".join(
        f"[{d['partition']}] for "
        + (fmt_s(d["stalled_s"]) if d["stalled_s"] is not None else f"over {fmt_s(window_s)}")
        for d in parts
        if d["status"] == PartitionStatus.STALL.value
    )
    return (
        f"STALL on partition(s) {ids}: the job runs and records are "
        f"waiting, but the cursor has not moved ({stuck})",
        f"read the driver log; if it hangs, {STOP} then {DEPLOY}",
    )


def _falling_behind(ids: list[int], parts: list[dict], window_s: float) -> Finding:
    return (
        f"falling behind on partition(s) {ids}: the cursor moves but the lag grows",
        "raise RELAY_MAX_OFFSETS_PER_TRIGGER or the worker's cores, or lower the produce rate",
    )


_FINDINGS = (
    (PartitionStatus.ERR, _err),
    (PartitionStatus.STOP, _stop),
    (PartitionStatus.STOPPED, _stopped),
    (PartitionStatus.STALL, _stall),
    (PartitionStatus.WARN, _falling_behind),
)


def progress_text(
    by_status: dict[PartitionStatus, list[int]], parts: list[dict], window_s: float
) -> tuple[str, str | None]:
    """(message, action): the finding of each status present, most severe first."""
    msgs, actions = [], []
    for status, finding in _FINDINGS:
        if status in by_status:
            msg, action = finding(by_status[status], parts, window_s)
            msgs.append(msg)
            actions += [action] if action else []
    if not msgs:
        msgs.append("every partition is caught up or moving" if parts else "no offsets to evaluate")
    return "; ".join(msgs), "; ".join(actions) or None


def check_progress(
    offsets: list[dict],
    batches: list[dict],
    samples: list[dict],
    run_state: RunState,
    now: float,
    window_s: float = 300.0,
    active_since: float | None = None,
    topic: str | None = None,
    waiting: dict[int, float | None] | None = None,
) -> Check:
    """Burrow's rules per partition over the window.

    ERR when the cursor is below the earliest offset; STOP when the job is down with lag; WARN when the
    cursor moves but the lag grew over every sample of the window; STALL when the job runs with lag,
    the cursor did not move in the window, and it has been stuck for at least a whole window; OK
    otherwise.

    "Stuck for" is the smallest of what is known, never more than the pipeline's history: the time
    since the partition's cursor last moved; since ``active_since`` (the current attempt's first
    commit, or its start while it has none: a driver takes 20-40 s to its first batch, and a slow
    first start must not count as a stall once it committed); and since records have been waiting at
    the cursor (``waiting``: the age of the oldest unapplied record, else a bound from earlier
    samples). Without these bounds a pipeline deployed 13 s earlier, or idle until a burst arrived
    5 s earlier, was reported "STALL 5.0 min".
    """
    topic = topic or (offsets[0]["topic"] if offsets else "")
    history_s = None if active_since is None else max(now - active_since, 0.0)
    w = Window(
        now,
        window_s,
        run_state,
        cursor_moves(batches, topic, now - window_s),
        last_moves(batches, topic),
        window_samples(samples, now, window_s),
        samples,
        waiting or {},
        history_s,
    )
    parts = [judge_partition(row, w) for row in offsets]
    by_status: dict[PartitionStatus, list[int]] = {}
    for d in parts:
        by_status.setdefault(PartitionStatus(d["status"]), []).append(d["partition"])
    data = {
        "window_s": window_s,
        "partitions": parts,
        "run_state": run_state.value,
        "active_since": active_since,
        "history_s": None if history_s is None else round(history_s, 1),
    }
    level = Level.worst([_PROGRESS_LEVEL[st] for st in by_status])
    message, action = progress_text(by_status, parts, window_s)
    return Check("progress", level, message, data, action)
