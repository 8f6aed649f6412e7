"""Ledger rows -> what the Relay page plots: time series (uPlot's aligned columns) and the timeline.

Pure functions over plain dicts (the rows ``readings`` reads), so the shaping is tested against a
real ledger without Airflow or a browser. Times stay epoch seconds in the plotted columns (uPlot's
time scale wants numbers and draws them in the browser's local time); every listed event also carries
an ISO 8601 string, so nothing a person reads is an epoch number.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from relay.operations.scale import executors_of

# Colors of the instance's own name (blue/green), shaded by instance so two blues stay apart.
INSTANCE_SHADES = {
    "blue": ("#2563eb", "#1e40af", "#60a5fa"),
    "green": ("#16a34a", "#166534", "#4ade80"),
}
PARTITION_COLORS = ("#7c3aed", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#ca8a04", "#4b5563", "#dc2626")
MAX_POINTS = 1500  # beyond this a series is bucketed by time (a screen is ~1500 px wide anyway)


def iso(ts: float | None) -> str | None:
    """UTC ISO 8601 (with offset): the browser shows it in local time."""
    if ts is None:
        return None
    return datetime.fromtimestamp(float(ts), tz=UTC).isoformat(timespec="seconds")


def instance_color(color: str, instance_id: int) -> str:
    shades = INSTANCE_SHADES.get(color, ("#6b7280",))
    return shades[instance_id % len(shades)]


def partition_color(index: int) -> str:
    return PARTITION_COLORS[index % len(PARTITION_COLORS)]


def chart(x: list[float], series: list[dict[str, Any]], unit: str, note: str = "") -> dict[str, Any]:
    """A plot's data: shared x (epoch s) and one value column per series (None = no point)."""
    points = sum(1 for s in series for v in s["values"] if v is not None)
    return {"x": x, "series": series, "unit": unit, "points": points, "note": note}


def partition_label(topic: str, partition: int, topics: set[str]) -> str:
    return f"{topic}[{partition}]" if len(topics) > 1 else f"p{partition}"


def _bucket_width(times: list[float], max_points: int) -> float | None:
    """Seconds per bucket when there are more points than fit, else None (one point per row)."""
    if len(times) <= max_points or len(times) < 2:
        return None
    return max((times[-1] - times[0]) / max_points, 1e-3)


# -- throughput, batch duration, cursors (from the batches table) ------------------------------------


def throughput(batches: list[dict], instances: dict[int, dict], max_points: int = MAX_POINTS) -> dict:
    """Records/s per instance: a batch's rows over the time since the instance's previous commit.

    Why per instance: an upgrade shows as blue's line handing over to green's. An instance's first
    batch in the window has no previous commit to measure from: no point (its rows over its own
    duration would be a processing rate, a spike on every start). Bucketed: records / bucket width.
    """
    rows = sorted(batches, key=lambda b: b["committed_at"])
    ids = sorted({int(b["instance_id"]) for b in rows})
    width = _bucket_width([b["committed_at"] for b in rows], max_points)
    column = {i: n for n, i in enumerate(ids)}
    x: list[float] = []
    values: list[list[float | None]] = [[] for _ in ids]
    if width is None:
        previous: dict[int, float] = {}
        for b in rows:
            inst, at = int(b["instance_id"]), float(b["committed_at"])
            since = previous.get(inst)
            previous[inst] = at
            x.append(at)
            for n in range(len(ids)):
                values[n].append(None)
            if since is not None:
                values[column[inst]][-1] = round(int(b["rows_read"]) / max(at - since, 1e-3), 2)
        note = "records per second between commits"
    else:
        t0 = rows[0]["committed_at"]
        sums: dict[int, dict[int, int]] = {}
        for b in rows:
            k = min(int((b["committed_at"] - t0) / width), max_points - 1)
            per = sums.setdefault(k, {})
            per[int(b["instance_id"])] = per.get(int(b["instance_id"]), 0) + int(b["rows_read"])
        for k in sorted(sums):
            x.append(round(t0 + (k + 0.5) * width, 3))
            for inst, n in column.items():
                got = sums[k].get(inst)
                values[n].append(None if got is None else round(got / width, 2))
        note = f"records per second, averaged over {width:.0f} s buckets"
    series = [
        {
            "label": _instance_label(instances.get(i), i),
            "color": instance_color((instances.get(i) or {}).get("color", ""), i),
            "values": values[column[i]],
        }
        for i in ids
    ]
    return chart(x, series, "records/s", note)


def _instance_label(inst: dict | None, instance_id: int) -> str:
    if inst is None:
        return f"#{instance_id}"
    return f"#{instance_id} {inst['version']} ({inst['color']})"


def durations(batches: list[dict], max_points: int = MAX_POINTS) -> dict:
    """Batch duration and ledger-commit time (ms) per batch; bucketed: the slowest in each bucket."""
    rows = sorted(batches, key=lambda b: b["committed_at"])
    width = _bucket_width([b["committed_at"] for b in rows], max_points)
    x: list[float] = []
    batch: list[float | None] = []
    commit: list[float | None] = []
    if width is None:
        for b in rows:
            x.append(float(b["committed_at"]))
            batch.append(round(float(b["duration_ms"]), 1))
            commit.append(round(float(b["commit_ms"]), 1))
        note = "per batch"
    else:
        t0 = rows[0]["committed_at"]
        worst: dict[int, tuple[float, float]] = {}
        for b in rows:
            k = min(int((b["committed_at"] - t0) / width), max_points - 1)
            d, c = worst.get(k, (0.0, 0.0))
            worst[k] = (max(d, float(b["duration_ms"])), max(c, float(b["commit_ms"])))
        for k in sorted(worst):
            x.append(round(t0 + (k + 0.5) * width, 3))
            batch.append(round(worst[k][0], 1))
            commit.append(round(worst[k][1], 1))
        note = f"slowest batch per {width:.0f} s bucket"
    series = [
        {"label": "batch duration", "color": "#0f766e", "values": batch},
        {"label": "ledger commit", "color": "#b45309", "values": commit},
    ]
    return chart(x, series, "ms", note)


def cursors(batches: list[dict], max_points: int = MAX_POINTS) -> dict:
    """Each partition's cursor (the next offset to apply) after every batch that moved it."""
    rows = sorted(batches, key=lambda b: b["committed_at"])
    keys = sorted({(r["topic"], int(r["partition"])) for b in rows for r in b.get("ranges") or []})
    topics = {t for t, _ in keys}
    column = {k: n for n, k in enumerate(keys)}
    width = _bucket_width([b["committed_at"] for b in rows], max_points)
    buckets: dict[float, dict[tuple[str, int], int]] = {}
    for b in rows:
        at = float(b["committed_at"])
        if width is not None:
            t0 = rows[0]["committed_at"]
            at = round(t0 + (min(int((at - t0) / width), max_points - 1) + 0.5) * width, 3)
        slot = buckets.setdefault(at, {})
        for r in b.get("ranges") or []:
            key = (r["topic"], int(r["partition"]))
            slot[key] = max(slot.get(key, 0), int(r["to"]))  # the last move in the bucket
    x = sorted(buckets)
    values: list[list[float | None]] = [[buckets[t].get(k) for t in x] for k in keys]
    series = [
        {
            "label": partition_label(t, p, topics),
            "color": partition_color(column[(t, p)]),
            "values": values[n],
        }
        for n, (t, p) in enumerate(keys)
    ]
    return chart(x, series, "offset", "cursor after each batch")


# -- lag (health reports + a live reading) ------------------------------------------------------------


def lag(reports: list[dict], live: list[dict] | None, now: float, live_error: str | None = None) -> dict:
    """Records not yet applied per partition: one point per persisted health report, plus now.

    Why these sources: lag needs Kafka's latest offset at that time, which the ledger only has where
    a health run (every 5 min, ``relay_health``) persisted it; the page adds a live reading (latest
    offsets vs the ledger's cursors) when Kafka answers within a short timeout.
    """
    samples: list[tuple[float, list[dict]]] = []
    for r in sorted(reports, key=lambda r: r["created_at"]):
        rows = ((r.get("body") or {}).get("data") or {}).get("offsets") or []
        if rows:
            samples.append((float(r["created_at"]), rows))
    if live:
        samples.append((now, live))
    keys = sorted({(row["topic"], int(row["partition"])) for _, rows in samples for row in rows})
    topics = {t for t, _ in keys}
    x = [at for at, _ in samples]
    values: list[list[float | None]] = [[] for _ in keys]
    for _, rows in samples:
        by_key = {(row["topic"], int(row["partition"])): row.get("lag") for row in rows}
        for n, key in enumerate(keys):
            got = by_key.get(key)
            values[n].append(None if got is None else int(got))
    series = [
        {"label": partition_label(t, p, topics), "color": partition_color(n), "values": values[n]}
        for n, (t, p) in enumerate(keys)
    ]
    count = len(samples) - (1 if live else 0)
    note = f"{count} health report(s)" + (
        " + a live reading now" if live else f"; no live reading ({live_error or 'no cursor'})"
    )
    return chart(x, series, "records", note)


def live_lag_rows(
    cursors_by_key: dict[tuple[str, int], int], latest: dict[str, dict[int, int]]
) -> list[dict]:
    """Rows shaped like a health report's offsets: the live reading of lag per leased partition."""
    rows = []
    for (topic, partition), cursor in sorted(cursors_by_key.items()):
        end = latest.get(topic, {}).get(partition)
        if end is None:
            continue
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "latest": end,
                "cursor": cursor,
                "lag": max(end - cursor, 0),
            }
        )
    return rows


# -- the timeline, instances, health, dead letters -----------------------------------------------------


def timeline(
    instances: list[dict], operations: list[dict], gaps: list[dict], since: float, now: float
) -> dict[str, Any]:
    """Instances as lanes over time, operations (with H and versions) and gaps as events."""
    lanes = []
    for inst in instances:
        live = inst["state"] in ("STANDBY", "READY", "STARTING", "ACTIVE", "DRAINING")
        end = now if live else float(inst["updated_at"])
        if end < since:
            continue
        lanes.append(
            {
                "id": inst["id"],
                "label": _instance_label(inst, inst["id"]),
                "color": instance_color(inst["color"], inst["id"]),
                "state": inst["state"],
                "start": float(inst["created_at"]),
                "end": end,
                "live": live,
                "start_iso": iso(inst["created_at"]),
                "end_iso": None if live else iso(end),
            }
        )
    return {
        "since": since,
        "until": now,
        "since_iso": iso(since),
        "until_iso": iso(now),
        "lanes": lanes,
        "operations": [operation_event(op) for op in operations],
        "gaps": [gap_event(g) for g in gaps],
    }


def operation_event(op: dict) -> dict[str, Any]:
    """One upgrade or recovery: its span, state history, and H (upgrade) or targets (recovery)."""
    data, params = op.get("data") or {}, op.get("params") or {}
    event: dict[str, Any] = {
        "id": op["id"],
        "kind": op["kind"],
        "state": op["state"],
        "start": float(op["created_at"]),
        "end": float(op["updated_at"]),
        "start_iso": iso(op["created_at"]),
        "end_iso": iso(op["updated_at"]),
        "error": op.get("error"),
        "history": [
            {"state": h["state"], "at": h["at"], "iso": iso(h["at"])} for h in op.get("history") or []
        ],
    }
    if op["kind"] == "failover":
        event.update(
            from_instance=data.get("from_instance"),
            to_instance=data.get("to_instance"),
            reason=data.get("reason") or "",
            handoff_at=data.get("failed_over_at"),
            handoff_iso=iso(data.get("failed_over_at")),
            label=f"failover #{data.get('from_instance', '?')} \u2192 #{data.get('to_instance', '?')}",
        )
    elif op["kind"] == "upgrade":
        handoff = {int(p): int(o) for p, o in (data.get("handoff") or {}).items()}
        event.update(
            from_version=data.get("blue_version"),
            to_version=params.get("version"),
            handoff=[{"partition": p, "offset": o} for p, o in sorted(handoff.items())],
            handoff_at=data.get("handoff_at"),
            handoff_iso=iso(data.get("handoff_at")),
            label=_upgrade_label(data.get("blue_version"), params.get("version"), params.get("resources")),
        )
    else:
        plan = (data.get("plan") or {}).get("partitions") or []
        event.update(
            strategy=params.get("strategy"),
            to_version=params.get("version"),
            reason=params.get("reason") or "",
            targets=[{"partition": int(p["partition"]), "offset": int(p["target"])} for p in plan],
            label=f"recovery ({params.get('strategy', '?')})",
        )
    return event


def _upgrade_label(blue: str | None, green: str | None, resources: dict | None) -> str:
    """An upgrade to the same version with other resources is a scale (relay scale, the autoscale policy)."""
    if resources and blue == green:
        return f"scale {blue} to {executors_of(resources)} executor(s)"
    return f"upgrade {blue or '?'} \u2192 {green or '?'}"


def gap_event(gap: dict) -> dict[str, Any]:
    return {
        "id": gap["id"],
        "topic": gap["topic"],
        "partition": int(gap["partition"]),
        "start_offset": int(gap["start_offset"]),
        "end_offset": int(gap["end_offset"]),
        "records": int(gap["end_offset"]) - int(gap["start_offset"]),
        "kind": gap["kind"],
        "reason": gap["reason"],
        "at": float(gap["created_at"]),
        "iso": iso(gap["created_at"]),
    }


def dead_letter_counts(times: list[float], since: float, now: float, buckets: int = 48) -> dict:
    """Dead letters per time bucket over the window (a bar plot: when did the poison arrive)."""
    width = max((now - since) / buckets, 1.0)
    counts = [0] * buckets
    for t in times:
        if since <= t <= now:
            counts[min(int((t - since) / width), buckets - 1)] += 1
    x = [round(since + (k + 0.5) * width, 3) for k in range(buckets)]
    series = [{"label": "dead letters", "color": "#dc2626", "values": counts}]
    out = chart(x, series, "records", f"per {math.ceil(width / 60)} min")
    out["points"] = sum(counts)
    return out
