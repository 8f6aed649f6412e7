"""Ledger rows -> the Relay page's panels: instance cards, the latest health report, dead letters.

The parts of the page that are read rather than looked at (the plots are in ``series``). Pure
functions over plain dicts, like ``series``; every time is an ISO 8601 string.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relay_airflow.page.series import instance_color, iso


def instance_cards(
    instances: list[dict], attempts: dict[int, list[dict]], leases: dict[int, list[dict]]
) -> list:
    """Newest first: color, version, state, the current attempt, and each lease with its cursor."""
    cards = []
    for inst in sorted(instances, key=lambda i: i["id"], reverse=True):
        tries = attempts.get(inst["id"], [])
        current = next((a for a in tries if a["epoch"] == inst["current_epoch"]), None)
        cards.append(
            {
                "id": inst["id"],
                "version": inst["version"],
                "color": inst["color"],
                "swatch": instance_color(inst["color"], inst["id"]),
                "state": inst["state"],
                "role": inst.get("role"),  # "hot-standby" while one waits to take a dead driver's place
                "epoch": inst["current_epoch"],
                "attempts": len(tries),
                "attempt_state": current["state"] if current else None,
                "error": inst.get("error"),
                "created_iso": iso(inst["created_at"]),
                "updated_iso": iso(inst["updated_at"]),
                "leases": [
                    {
                        "topic": lease["topic"],
                        "partition": lease["partition"],
                        "start": lease["start_offset"],
                        "end": lease["end_offset"],
                        "cursor": lease["next_offset"],
                    }
                    for lease in sorted(leases.get(inst["id"], []), key=lambda x: (x["partition"], x["id"]))
                ],
            }
        )
    return cards


def health(report: dict | None, now: float) -> dict[str, Any] | None:
    """The latest health report as the page shows it: status, age, summary, each check."""
    if report is None:
        return None
    body = report.get("body") or {}
    return {
        "status": report["status"],
        "iso": iso(report["created_at"]),
        "age_s": round(max(now - float(report["created_at"]), 0.0), 1),
        "summary": body.get("summary", ""),
        "run_state": (body.get("data") or {}).get("run_state"),
        "checks": [
            {k: c.get(k) for k in ("name", "level", "message", "action")} for c in body.get("checks") or []
        ],
    }


def preview(value: bytes | None, limit: int = 80) -> str | None:
    """A record's key or value as readable text (bytes that are not UTF-8 are shown escaped)."""
    if value is None:
        return None
    text = bytes(value).decode("utf-8", errors="backslashreplace")
    return text if len(text) <= limit else text[:limit] + "\u2026"


def dead_letter_rows(rows: Iterable[dict]) -> list[dict[str, Any]]:
    return [
        {
            "id": r["id"],
            "instance_id": r["instance_id"],
            "topic": r["topic"],
            "partition": r["partition"],
            "offset": r["offset"],
            "key": preview(r.get("key")),
            "value": preview(r.get("value")),
            "error": (r["error"] or "")[:500],
            "iso": iso(r["created_at"]),
        }
        for r in rows
    ]
