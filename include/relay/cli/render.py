"""How ``relay`` shows a result to a person: tables (rich), short sentences, ISO times.

Every command returns plain data (what ``--json`` prints); this module only renders it. Times stored
as epoch seconds are shown as ISO 8601 in the local time zone. On a terminal rich adds colour; piped,
the same text comes out without escape codes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

WIDE = 240  # columns when stdout is not a terminal
TIME_KEYS = ("_at", "started", "ended", "created", "heartbeat")
LEVEL_STYLE = {"OK": "green", "WARN": "yellow", "CRITICAL": "bold red", "ERROR": "bold red"}
STATE_STYLE = {
    "STANDBY": "cyan",
    "READY": "cyan",
    "ACTIVE": "green",
    "DRAINING": "yellow",
    "FAILED": "red",
    "FENCED": "red",
}


def iso_time(value: Any) -> str:
    """Epoch seconds (or milliseconds) as local ISO 8601 to the second; anything else unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return "" if value is None else str(value)
    seconds = value / 1000 if value > 10**11 else value
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def _is_time(key: str) -> bool:
    return any(key.endswith(k) or key == k.strip("_") for k in TIME_KEYS)


def cell(key: str, value: Any) -> str:
    """One value as text: times as ISO, lists of scalars joined, nested data as compact JSON."""
    if value is None:
        return ""
    if _is_time(key):
        return iso_time(value)
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if key not in ("partition", "id", "epoch", "instance_id") else str(value)
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict | list):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    title: str | None = None,
    style_of: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in columns:
        t.add_column(c.replace("_", " "), justify="right" if _numeric(rows, c) else "left")
    for r in rows:
        t.add_row(*(cell(c, r.get(c)) for c in columns), style=style_of(r) if style_of else None)
    return t


def _numeric(rows: Sequence[Mapping[str, Any]], column: str) -> bool:
    values = [r.get(column) for r in rows if r.get(column) is not None]
    return (
        bool(values)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        and not _is_time(column)
    )


def key_values(data: Mapping[str, Any], title: str | None = None) -> Table:
    """Scalar fields of a result as a two-column table (nested lists are rendered separately)."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE, show_header=False, pad_edge=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    for k, v in data.items():
        if not _is_rows(v):
            t.add_row(k.replace("_", " "), cell(k, v))
    return t


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _columns(rows: Iterable[Mapping[str, Any]], limit: int = 9) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if not isinstance(v, dict | list) or (isinstance(v, list) and not _is_rows(v)):
                seen.setdefault(k, None)
    return list(seen)[:limit]


def render_generic(console: Console, data: Any, title: str | None = None) -> None:
    if _is_rows(data):
        console.print(table(data, _columns(data), title))
    elif isinstance(data, dict):
        console.print(key_values(data, title))
        for k, v in data.items():
            if _is_rows(v):
                console.print(table(v, _columns(v), k.replace("_", " ")))
    else:
        console.print(cell("", data))


def render_status(console: Console, s: Mapping[str, Any]) -> None:
    counted = s.get("message_count")  # the counter's count; None for any other sink
    applied = "" if counted is None else f"{counted:,} message(s) applied, "
    console.print(
        f"[bold]{s['pipeline']}[/] reads topic [bold]{s['topic']}[/]; ledger {s['ledger']}; "
        f"{applied}{s['dead_letters']:,} dead letter(s), {len(s.get('gaps') or [])} gap(s) declared"
    )
    instances = list(s.get("instances") or [])
    if not instances:
        console.print("No instance yet: `relay deploy` starts one.")
    for inst in instances:
        last = (inst.get("attempts") or [{}])[-1]
        inst["attempts_seen"] = len(inst.get("attempts") or [])
        inst["heartbeat_at"] = last.get("heartbeat_at")
    console.print(
        table(
            instances,
            [
                "id",
                "color",
                "version",
                "state",
                "role",
                "created_at",
                "current_epoch",
                "attempts_seen",
                "heartbeat_at",
                "submission_id",
            ],
            "instances (last 10)",
            lambda r: STATE_STYLE.get(str(r.get("state"))),
        )
    )
    leases = [
        {**lease, "instance": inst["id"]}
        for inst in instances
        if inst.get("state") not in ("STOPPED", "FENCED", "FAILED")
        for lease in inst.get("leases") or []
    ]
    if leases:
        cols = ["instance", "topic", "partition", "start_offset", "end_offset", "next_offset"]
        console.print(table(leases, cols, "leases of live instances"))
    if s.get("failovers"):
        cols = ["failed_over_at", "from_instance", "to_instance", "reason"]
        console.print(table(s["failovers"], cols, "failovers (newest first)"))
    if s.get("offsets"):
        render_offsets(console, s["offsets"])
    if s.get("gaps"):
        render_generic(console, s["gaps"], "gaps (declared lost)")


def render_offsets(console: Console, rows: Sequence[Mapping[str, Any]]) -> None:
    cols = ["topic", "partition", "earliest", "latest", "cursor", "lag", "retention_margin", "invalidated"]
    console.print(table(rows, cols, "offsets", lambda r: "bold red" if r.get("invalidated") else None))


def render_health(console: Console, report: Mapping[str, Any]) -> None:
    level = str(report.get("status"))
    console.print(
        f"[bold]{report.get('pipeline')}[/]: [{LEVEL_STYLE.get(level, '')}]{level}[/] "
        f"at {iso_time(report.get('created_at'))} (report {report.get('report_id')})"
    )
    checks = report.get("checks") or []
    console.print(
        table(checks, ["level", "name", "message", "action"], None, lambda r: LEVEL_STYLE.get(r["level"]))
    )


def _contract_value(value: Any) -> str:
    """A contract field: None is unknown (not recorded), [] is none declared."""
    if value is None:
        return "unknown"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "(none)"
    return cell("", value)


def render_plan(console: Console, plan: Mapping[str, Any]) -> None:
    """An upgrade (or rollback) plan: verdict first, then what runs, what changes, H, gates, steps."""
    cur, tgt = plan.get("current") or {}, plan.get("target") or {}
    what = "Rollback" if plan.get("kind") == "rollback plan" else "Upgrade"
    verdict = "[bold red]BLOCKED[/]" if plan["blocked"] else "[green]can run[/]"
    console.print(
        f"[bold]{what} plan[/] for {escape(plan['pipeline'])} (topic {escape(plan['topic'])}): "
        f"{escape(str(cur.get('version', '?')))} -> {escape(plan['version'])}: {verdict}; nothing was changed"
    )
    for reason in plan["blocked"]:
        console.print(f"  [red]blocked:[/] {escape(reason)}")
    hashes = {k: (d.get("code_hash") or "unknown")[:12] for k, d in (("cur", cur), ("tgt", tgt))}
    if cur:
        console.print(
            f"current: instance {cur['instance']} ({cur['state']}, {cur['color']}) runs "
            f"{escape(cur['version'])}, code {hashes['cur']}, built {iso_time(cur.get('built_at')) or '?'}; "
            f"{escape(cur['artifact'])}"
        )
    built = f"built {iso_time(tgt['built_at'])}" if tgt.get("built_at") else escape(str(tgt.get("artifact")))
    console.print(f"target:  {escape(plan['version'])}, code {hashes['tgt']}, {built}")
    rows = [
        {k: (escape(_contract_value(v)) if k in ("current", "target") else v) for k, v in r.items()}
        for r in plan.get("contract") or []
    ]
    for r in rows:
        r["changed"] = {True: "CHANGES", False: "same", None: "unknown"}[r["changed"]]
    console.print(
        table(
            rows, ["field", "current", "target", "changed"], "contract", lambda r: _CHANGED.get(r["changed"])
        )
    )
    expected = plan["expected_handoff"]
    shown = ", ".join(f"{p}: {o:,}" for p, o in expected.items()) if isinstance(expected, dict) else expected
    console.print(f"handoff ({plan['handoff']}): expected H {escape(str(shown))}")
    if plan.get("partitions"):
        cols = ["partition", "blue_cursor", "kafka_latest", "handoff", "blue_drains"]
        console.print(table(plan["partitions"], cols, "partitions"))
    folders = plan.get("checkpoints") or {}
    console.print(
        f"checkpoints: blue {escape(str(folders.get('blue')))}; green {escape(str(folders.get('green')))}"
    )
    console.print(key_values(plan.get("gates") or {}, "gates"))
    for i, step in enumerate(plan.get("steps") or [], 1):
        console.print(f"  {i}. {escape(step)}")
    for warning in plan.get("warnings") or []:
        console.print(f"  [yellow]note:[/] {escape(warning)}")


_CHANGED = {"CHANGES": "yellow", "unknown": "dim"}


def render_versions(console: Console, view: Mapping[str, Any]) -> None:
    console.print(
        f"versions in {escape(view['artifacts_dir'])} (newest first; a build or an upgrade keeps the newest "
        f"{view['keep_versions']} and every one in use)"
    )
    if view.get("note"):
        console.print(f"[yellow]note:[/] {escape(view['note'])}")
    rows = [{**r, "previous": "previous" if r["previous"] else ""} for r in view["versions"]]
    cols = ["version", "built_at", "pipeline", "driver", "code_hash", "runs", "previous", "kept_because"]
    console.print(table(rows, cols, None, lambda r: "green" if r.get("runs") else None))
    if not rows:
        console.print("No version built yet: `relay build --version v1`.")


def render_pipelines(console: Console, view: Mapping[str, Any]) -> None:
    """``relay pipelines``: where they are declared, then one row each (the default marked)."""
    where = view["pipelines_file"] or "the environment (RELAY_*; no pipelines file)"
    console.print(f"pipelines of {escape(where)}; ledger {escape(view['ledger'])}")
    if view.get("note"):
        console.print(f"[yellow]note:[/] {escape(view['note'])}")
    rows = [
        {**r, "pipeline": f"{r['pipeline']} (default)" if r["default"] else r["pipeline"]}
        for r in view["pipelines"]
    ]
    cols = [
        "pipeline",
        "topic",
        "code",
        "state",
        "version",
        "live_instances",
        "last_commit_at",
        "env_missing",
    ]
    console.print(table(rows, cols, None, lambda r: STATE_STYLE.get(str(r.get("state")))))


def output_width() -> int:
    """The width tables fit when stdout is not a terminal: ``COLUMNS``, else the terminal the person
    sees on stderr or stdin (``relay status | less``: wrapped at 240 it was noise on 80 columns,
    issue #34), else WIDE, so a line a script greps is never wrapped."""
    raw = os.environ.get("COLUMNS", "")
    if raw.isdigit() and 20 <= int(raw) <= 1000:
        return int(raw)
    for stream in (sys.stderr, sys.stdin):
        try:
            return max(os.get_terminal_size(stream.fileno()).columns, 20)
        except (OSError, ValueError, AttributeError):
            continue
    return WIDE


def render(name: str, result: Any, console: Console | None = None) -> None:
    """Print ``result`` of command ``name`` for a person."""
    if console is None:
        width = output_width()
        console = Console() if sys.stdout.isatty() else Console(width=width, soft_wrap=width == WIDE)
    if name == "status":
        render_status(console, result)
    elif name == "offsets":
        render_offsets(console, result)
    elif name == "health":
        render_health(console, result)
    elif isinstance(result, Mapping) and str(result.get("kind", "")).endswith(" plan"):
        render_plan(console, result)
    elif name == "versions":
        render_versions(console, result)
    elif name == "pipelines":
        render_pipelines(console, result)
    elif name == "audit":
        from relay.audit import render as render_audit

        console.print(render_audit(result), markup=False, highlight=False, soft_wrap=True)
    else:
        render_generic(console, result, name)
