"""Check of the driver: restarts, crash loops and failed instances (the ledger's attempts).

Each instance worth judging is judged by two small rules (:func:`crash_loop`, :func:`failure`); which
instances are worth judging, and what a fenced one explains, are rules of their own.
"""

from __future__ import annotations

from typing import Any

from relay.health.report import DEPLOY, STOP, Check, Level, fmt_s
from relay.ledger.models import Attempt, AttemptState, Instance, InstanceState

NAME = "driver"
Finding = tuple[str, str]  # (the problem, what to run next)
SILENT_S = 10.0  # drivers beat every second: ten missed beats is a driver stopped, dying or paused


def considered(instances: list[Instance], live_ids: set[int]) -> tuple[list[Instance], list[Instance]]:
    """(the instances judged, the fenced ones newer than all of them).

    Judged: the live ones and the newest that is not FENCED (it explains why nothing runs: FAILED,
    STOPPED). A FENCED instance is never judged: fencing is a decision already taken.
    """
    judged = [i for i in instances if i.state is not InstanceState.FENCED]
    chosen = [i for i in judged if i.id in live_ids]
    latest = judged[-1] if judged else None
    if latest is not None and latest.id not in live_ids:
        chosen.append(latest)
    newest = max((i.id for i in chosen), default=0)
    return chosen, [i for i in instances if i.state is InstanceState.FENCED and i.id > newest]


def fenced_note(fenced: list[Instance], running: bool) -> str | None:
    """When nothing runs, the newest fenced instance explains why (``upgrade 3 aborted: ...``); not
    when a stop had to fence it (a person asked for that)."""
    if not fenced or running or fenced[-1].stop_requested:
        return None
    last = fenced[-1]
    why = last.error or "no reason recorded"
    return f"instance {last.id} ({last.version}, {last.color.value}) was fenced: {why}"


def crash_loop(inst: Instance, recent: list[Attempt], window_s: float, crash_attempts: int) -> Finding | None:
    """Supervision relaunches any non-zero exit forever, so only the count of unproductive attempts in
    the window tells a crash loop from a running job."""
    if len(recent) < crash_attempts:
        return None
    errors = sorted({a.error for a in recent if a.error})
    return (
        f"crash loop: instance {inst.id} started {len(recent)} attempts in the last "
        f"{fmt_s(window_s)}" + (f" (errors: {'; '.join(errors)[:300]})" if errors else ""),
        f"read the driver log (var/logs or the Spark worker), fix the cause, {STOP}, then {DEPLOY}",
    )


def failure(inst: Instance, last: Attempt | None, live: bool) -> Finding | None:
    """A FAILED instance, or a live one whose last attempt FAILED; data loss has its own remedy."""
    failed = inst.error if inst.state is InstanceState.FAILED else None
    if not failed and last is not None and last.state is AttemptState.FAILED and live:
        failed = last.error or "its last attempt FAILED"
    if not failed:
        return None
    if "data loss" in failed.lower():
        action = "run the recovery DAG relay_recover (strategy earliest; dry-run first)"
    else:
        action = f"read the driver log, fix the cause, then {DEPLOY}"
    return f"instance {inst.id} {inst.state.value}: {failed}", action


def restarting(inst: Instance, atts: list[Attempt], now: float, productive: set[int] | None) -> str | None:
    """A live ACTIVE instance between two lives of its driver: the newest attempt silent for SILENT_S
    (its worker or host lost, the process stopped), or a relaunch that has not committed yet after
    earlier attempts did. WARN, not CRITICAL: supervision is bringing it back (a crash loop and a
    failure are judged by their own rules); the next check says whether it came back."""
    last = atts[-1] if atts else None
    if inst.state is not InstanceState.ACTIVE or last is None or last.state is not AttemptState.RUNNING:
        return None
    if now - last.heartbeat_at > SILENT_S:
        silent = fmt_s(now - last.heartbeat_at)
        return f"instance {inst.id}: its driver has not beaten for {silent} (restarting, or its host lost)"
    if productive is not None and last.id not in productive and any(a.id in productive for a in atts[:-1]):
        return (
            f"instance {inst.id}: its driver is restarting (attempt {last.id} started "
            f"{fmt_s(now - last.started_at)} ago, no batch yet)"
        )
    return None


def instance_row(inst: Instance, atts: list[Attempt], recent: list[Attempt]) -> dict[str, Any]:
    """One judged instance as the report lists it."""
    last = atts[-1] if atts else None
    return {
        "id": inst.id,
        "state": inst.state.value,
        "restarts": max(len(atts) - 1, 0),
        "attempts_in_window": len(recent),
        "error": inst.error,
        "last_attempt": last.to_json() if last else None,
    }


def verdict(
    problems: list[str],
    actions: list[str],
    note: str | None,
    judged: bool,
    data: dict[str, Any],
    restarts: list[str] | None = None,
) -> Check:
    """CRITICAL for any problem; WARN when nothing runs because an instance was fenced, or while a
    driver restarts; else OK."""
    if problems:
        text = "; ".join(problems + ([note] if note else []))
        return Check(NAME, Level.CRITICAL, text, data, "; ".join(dict.fromkeys(actions)))
    if restarts:
        return Check(
            NAME, Level.WARN, "; ".join(restarts), data, "none: the next check says whether it came back"
        )
    if note:
        return Check(
            NAME,
            Level.WARN,
            f"nothing runs; {note}",
            data,
            f"fix what the fencing names, then {DEPLOY} (or run the upgrade again)",
        )
    if not judged:
        return Check(NAME, Level.OK, "no instance yet", data)
    return Check(NAME, Level.OK, f"{data['restarts']} restart(s) of the live instance(s)", data)


def check_driver(
    instances: list[Instance],
    attempts: dict[int, list[Attempt]],
    live_ids: set[int],
    now: float,
    crash_window_s: float = 600.0,
    crash_attempts: int = 3,
    productive: set[int] | None = None,
) -> Check:
    """Restarts, crash loops and failed instances.

    Supervision relaunches ANY non-zero exit forever, so a crash loop looks like a running job from the
    master: only the attempt count per instance tells. Attempts that committed a batch (``productive``)
    made progress and are restarts, not a loop.

    A FENCED instance is never judged: fencing is a decision already taken (an upgrade aborted its
    green, a stop fenced a driver that did not stop), its attempts cannot commit, and reporting its
    crashes as a crash loop sent operators after a problem that was already handled. While something
    runs, fenced instances newer than it are only listed in ``data["fenced_after"]``; when nothing
    runs, the newest one is named in a WARN because it explains why, e.g. ``upgrade 3 aborted: ...``.
    """
    judged, fenced = considered(instances, live_ids)
    note = fenced_note(fenced, running=any(i.id in live_ids for i in judged))
    rows: list[dict[str, Any]] = []
    found: list[Finding] = []
    coming_back: list[str] = []
    for inst in judged:
        atts = attempts.get(inst.id, [])
        recent = [
            a for a in atts if a.started_at >= now - crash_window_s and a.id not in (productive or set())
        ]
        rows.append(instance_row(inst, atts, recent))
        loop = crash_loop(inst, recent, crash_window_s, crash_attempts)
        failed = failure(inst, atts[-1] if atts else None, inst.id in live_ids)
        found += [f for f in (loop, failed) if f is not None]
        if inst.id in live_ids and (back := restarting(inst, atts, now, productive)) is not None:
            coming_back.append(back)
    data: dict[str, Any] = {
        "instances": rows,
        "fenced_after": [
            {"id": i.id, "version": i.version, "color": i.color.value, "reason": i.error} for i in fenced
        ],
        "restarts": sum(d["restarts"] for d in rows if d["id"] in live_ids),
    }
    return verdict([p for p, _ in found], [a for _, a in found], note, bool(judged), data, coming_back)
