"""Turn a chaos run's events into the figures the issue asks for, and print them as a table.

Per kind: faults injected, who healed them, median and max time to the next committed batch, human
actions. Then the deep audit's totals (duplicates, missing, declared lost) and what the broker lost.
Pure functions over plain dicts, so the table can be re-rendered from a results file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relay_dev.bench import fmt_number, percentile
from relay_dev.chaos.plan import KINDS

AUDIT_FIELDS = {
    # total name -> names it may have in an audit report (top level or per partition)
    "applied_once": ("applied_once",),
    "duplicates": ("duplicates", "applied_twice_or_more"),
    "missing": ("missing",),
    "declared_lost": ("declared_lost",),
    "unread": ("unread",),
    "dead_letters": ("dead_letters",),
    "holes": ("holes",),
    "applied_unread": ("applied_unread",),
    "applied_without_record": ("applied_without_record",),
}


def audit_totals(report: dict[str, Any]) -> dict[str, int | None]:
    """Totals from an audit report, whatever its shape (``relay.audit`` is being extended to a deep
    audit: this reads its top-level totals when it has them, else sums its partitions)."""
    totals = report.get("totals") if isinstance(report.get("totals"), dict) else {}
    parts = report.get("partitions") or []
    out: dict[str, int | None] = {}
    for name, aliases in AUDIT_FIELDS.items():
        value: int | None = None
        for alias in aliases:
            for source in (totals, report):
                if isinstance(source.get(alias), int | float) and not isinstance(source.get(alias), bool):
                    value = int(source[alias])
                    break
            if value is None and parts and any(isinstance(p.get(alias), int | float) for p in parts):
                value = sum(int(p.get(alias) or 0) for p in parts)
            if value is not None:
                break
        out[name] = value
    return out


def summarize_kinds(
    events: Iterable[dict[str, Any]], actions: Iterable[dict[str, Any]], kinds: Iterable[str]
) -> list[dict[str, Any]]:
    """One row per kind (in table order), then rows for the tool's redeploys and repairs, if any."""
    events = list(events)
    rows = []
    for kind in [k for k in KINDS if k in set(kinds)]:
        mine = [e for e in events if e["kind"] == kind]
        done = [e for e in mine if e.get("at") is not None]
        times = [e["next_commit_s"] for e in done if e.get("next_commit_s") is not None]
        rows.append(
            {
                "kind": kind,
                "injected": len(done),
                "skipped": len([e for e in mine if e.get("skipped")]),
                "errors": len([e for e in mine if e.get("error")]),
                "healed_by": sorted({e["healed_by"] for e in done if e.get("healed_by")}),
                "next_commit_median_s": percentile(times, 50),
                "next_commit_max_s": max(times) if times else None,
                "no_commit_after": len(done) - len(times),
                "restart_median_s": percentile([e["restart_s"] for e in done if e.get("restart_s")], 50),
                "human_actions": sum(int(e.get("human_actions") or 0) for e in done),
            }
        )
    actions = list(actions)
    for label, mine, how in (
        ("health self-heal", [a for a in actions if a["kind"] == "self_heal"], "relay health --heal"),
        ("pipeline redeploy", [a for a in actions if a["kind"] == "pipeline"], "relay stop + relay deploy"),
        (
            "repair after window",
            [a for a in actions if a["kind"] not in ("pipeline", "self_heal")],
            "relay stack up",
        ),
    ):
        if not mine:
            continue
        times = [a["next_commit_s"] for a in mine if a.get("next_commit_s") is not None]
        rows.append(
            {
                "kind": label,
                "injected": None,
                "skipped": 0,
                "errors": len([a for a in mine if not a.get("ok")]),
                "healed_by": [how if label == "health self-heal" else f"chaos tool ({how})"],
                "next_commit_median_s": percentile(times, 50),
                "next_commit_max_s": max(times) if times else None,
                "no_commit_after": len(mine) - len(times),
                "restart_median_s": percentile([a["seconds"] for a in mine if a.get("seconds")], 50),
                "human_actions": 0 if label == "health self-heal" else len(mine),
            }
        )
    return rows


def _s(value: float | None) -> str:
    return "-" if value is None else f"{fmt_number(value)} s"


def render_table(result: dict[str, Any]) -> str:
    """The human summary of a run (also what the README quotes)."""
    cols = ["kind", "kills", "healed by", "next commit median", "max", "human actions"]
    rows = []
    for r in result.get("kinds", []):
        kills = "-" if r["injected"] is None else str(r["injected"])
        extra = [
            f"{r['skipped']} skipped" if r["skipped"] else "",
            f"{r['errors']} failed" if r["errors"] else "",
        ]
        extra += [f"{r['no_commit_after']} w/o commit" if r["no_commit_after"] else ""]
        note = ", ".join(x for x in extra if x)
        rows.append(
            [
                r["kind"],
                kills + (f" ({note})" if note else ""),
                "; ".join(r["healed_by"]) or "-",
                _s(r["next_commit_median_s"]),
                _s(r["next_commit_max_s"]),
                str(r["human_actions"]),
            ]
        )
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in (3, 4, 5) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    out = [line(cols), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    p = result.get("producer") or {}
    c = result.get("commits_summary") or {}
    out.append("")
    out.append(
        f"load: {fmt_number(p.get('sent'))} records at {fmt_number(result['options']['rate'])} msg/s "
        f"({fmt_number(p.get('poison'))} poison), {fmt_number(p.get('acked'))} acked, "
        f"{fmt_number(p.get('failed'))} send errors, {fmt_number(p.get('unconfirmed'))} unconfirmed; "
        f"{len(c.get('attempts', []))} driver attempts and {len(c.get('instances', []))} instance(s) "
        f"committed {fmt_number(c.get('batches'))} batches"
    )
    a = result.get("audit_totals") or {}
    deep = (
        "deep audit (Kafka re-read)"
        if result.get("audit_deep")
        else "audit (ledger counts; deep audit not available)"
    )
    out.append(
        f"{deep}: applied once {fmt_number(a.get('applied_once'))}, dead letters "
        f"{fmt_number(a.get('dead_letters'))}, duplicates {fmt_number(a.get('duplicates'))}, missing "
        f"{fmt_number(a.get('missing'))}, declared lost {fmt_number(a.get('declared_lost'))}, unread "
        f"{fmt_number(a.get('unread'))}, holes {fmt_number(a.get('holes'))}, applied without a record in "
        f"Kafka {fmt_number(a.get('applied_without_record'))}"
    )
    b = result.get("broker") or {}
    if b:
        out.append(
            f"broker: {fmt_number(b.get('acked_then_lost_by_broker'))} acked record(s) gone after restarts; "
            f"{fmt_number(b.get('applied_but_replaced_in_kafka'))} applied record(s) whose offset now holds "
            "another record (noida-db keeps ~1 s of writes in memory only)"
        )
    human = result.get("human_actions_total", 0)
    out.append(
        f"human actions needed: {human} (must be 0: "
        + ("met)" if human == 0 else "NOT met: restarts and redeploys the tool did that the stack should do)")
    )
    health = result.get("health") or {}
    if health.get("kinds") or health.get("final"):
        seen = ", ".join(
            f"{k} {v['reported']}/{v['sampled']}" for k, v in sorted((health.get("kinds") or {}).items())
        )
        final = health.get("final") or {}
        out.append(
            f"health (sampled every 5 s): faults it reported while they lasted: {seen or '-'}; after "
            f"catching up: {final.get('status', '-')}"
            + (f" ({', '.join(sorted(final.get('not_ok') or {}))})" if final.get("not_ok") else "")
        )
    if result.get("caught_up_s") is not None:
        out.append(f"caught up {fmt_number(result['caught_up_s'])} s after the load stopped")
    if result.get("error"):
        out.append(f"error: {result['error']}")
    if result.get("results_file"):
        out.append(f"results: {result['results_file']}")
    out.append(
        "overall: "
        + ("OK (0 duplicates, 0 missing)" if result.get("ok") else "FAILED: " + result.get("verdict", ""))
    )
    return "\n".join(out)
