"""Checks of what runs: one instance only (ledger vs Spark master), and its driver's restarts."""

from __future__ import annotations

from typing import Any

from relay.health.report import DEPLOY, REFUSAL_WINDOW_S, STOP, Check, Level, RunState, fmt_s
from relay.ledger.models import Attempt, AttemptState, Instance, InstanceState
from relay.operations.inventory import STALE_HEARTBEAT_S, Inventory
from relay.spark.launcher import app_prefix

STOPPING_GRACE_S = 120.0  # an application still listed this long after `relay stop` is a zombie
COMMITTING_S = 60.0  # a commit this recent: the pipeline runs, whatever the master says


def instance_of_app(pipeline: str, name: str) -> int | None:
    """Instance id an application name ``relay-<pipeline>-<id>`` stands for; None if it is not ours.

    A bare prefix match is not enough: the prefix of pipeline ``exp`` also matches ``relay-exp-foo-3``.
    """
    rest = name[len(app_prefix(pipeline)) :] if name.startswith(app_prefix(pipeline)) else ""
    return int(rest) if rest.isdigit() else None


def is_upgrade(live: list[Instance]) -> bool:
    """Two live instances are expected during an upgrade: green warming up as a standby (STANDBY,
    READY) next to an ACTIVE blue, or blue draining while green starts or runs."""
    states = sorted(i.state.value for i in live)
    if len(live) != 2 or states[0] == states[1]:
        return False
    warming = "ACTIVE" in states and ("STANDBY" in states or "READY" in states)
    handing = "DRAINING" in states and ("ACTIVE" in states or "STARTING" in states)
    return warming or handing


def live_attempts(
    instance: Instance, attempts: list[Attempt], now: float
) -> tuple[list[Attempt], list[Attempt]]:
    """(current, superseded) RUNNING attempts with a fresh heartbeat.

    Only the attempt of the instance's current epoch can commit; an older one that still heartbeats
    (the master relaunched a driver that had not finished dying) is already a harmless zombie.
    """
    fresh = [
        a for a in attempts if a.state is AttemptState.RUNNING and a.heartbeat_at > now - STALE_HEARTBEAT_S
    ]
    return (
        [a for a in fresh if a.epoch == instance.current_epoch],
        [a for a in fresh if a.epoch != instance.current_epoch],
    )


# ------------------------------------------------------------------------------------ the checks
def check_single_instance(
    pipeline: str,
    inventory: Inventory,
    instances: list[Instance],
    attempts: dict[int, list[Attempt]],
    now: float,
    refusals: list[dict] | None = None,
    last_commit_at: float | None = None,
) -> Check:
    """Ledger vs master: unknown applications, zombies of fenced/ended instances, two live attempts.

    Not findings: an application still finishing after ``relay stop`` (STOPPING_GRACE_S), and a
    master that does not answer while the pipeline keeps committing (``last_commit_at``; a master
    restart: WARN, since nothing beside the pipeline can be verified meanwhile).

    An application under a live instance's name whose id no attempt recorded is a copy Relay did not
    start (CRITICAL while it runs); a driver refused at start for want of the launch token is named
    (WARN: it wrote nothing, but someone runs copies of the job).

    ``instances`` are ALL instances of the pipeline: inventory only lists the live ones, and a FENCED
    instance still running in the master shows up there as an unknown application.
    """
    by_id = {i.id: i for i in instances}
    live = [by_id.get(i.id, i) for i in inventory.live]
    problems: list[str] = []
    actions: list[str] = []
    data: dict[str, Any] = {
        "live_instances": [
            {
                "id": i.id,
                "state": i.state.value,
                "version": i.version,
                "color": i.color.value,
                "submission_id": i.submission_id,
            }
            for i in live
        ],
        "dead_instances": [
            {"id": i.id, "state": i.state.value, "submission_id": i.submission_id} for i in inventory.dead
        ],
        "master_apps": [{"id": a.id, "name": a.name, "state": a.state.value} for a in inventory.apps],
        "master_error": inventory.master_error,
    }
    unknown, zombies, impostors, stopping = [], [], [], []
    for app in inventory.apps:
        if not app.name.startswith(app_prefix(pipeline)):
            continue
        inst_id = instance_of_app(pipeline, app.name)
        if inst_id is None:
            head, _, tail = app.name[len(app_prefix(pipeline)) :].rpartition("-")
            if head and tail.isdigit():
                continue  # another pipeline whose name extends ours (relay-exp-foo-3 for pipeline exp)
        owner = next((i for i in live if i.id == inst_id), None)
        if owner is not None:
            recorded = {a.app_id for a in attempts.get(owner.id, []) if a.app_id}
            current = [a for a in attempts.get(owner.id, []) if a.epoch == owner.current_epoch]
            starting = bool(current) and current[-1].app_id is None  # its session is still being built
            if app.id not in recorded and not starting:
                impostors.append((app, owner))
                problems.append(
                    f"Spark application {app.id} runs under instance {owner.id}'s name ({app.name}) but "
                    f"is not an attempt Relay recorded (current: "
                    f"{current[-1].app_id if current else 'none'}): a copy Relay did not start"
                )
            continue
        inst = by_id.get(inst_id) if inst_id is not None else None
        if inst is None:
            unknown.append(app)
            problems.append(
                f"Spark application {app.id} ({app.name}) runs but the ledger knows no such instance "
                "(started behind Relay's back?)"
            )
        elif inst.stop_requested and now - inst.updated_at < STOPPING_GRACE_S:
            stopping.append(app)  # `relay stop` ended it a moment ago: its application is finishing
        else:
            zombies.append((app, inst))
            problems.append(
                f"instance {inst.id} is {inst.state.value} in the ledger but still runs in the master "
                f"as {app.id} ({app.name})"
            )
    unknown += [app for app, _ in impostors]
    known_drivers = {i.submission_id for i in instances if i.submission_id} | {
        a.driver_id for atts in attempts.values() for a in atts if a.driver_id
    }
    data["other_drivers"] = [
        {"id": d.id, "state": d.state.value, "worker": d.worker}
        for d in inventory.drivers
        if d.id not in known_drivers
    ]
    warnings: list[str] = []
    recent = [r for r in refusals or [] if r["created_at"] > now - REFUSAL_WINDOW_S]
    data["refused_starts"] = [
        {"instance": r["instance_id"], "driver": r["driver_id"], "host": r["host"], "at": r["created_at"]}
        for r in recent
    ]
    if recent:
        warnings.append(
            f"{len(recent)} start(s) refused in the last {REFUSAL_WINDOW_S / 60:.0f} min: "
            + "; ".join(r["reason"] for r in recent[-3:])
        )
    if unknown:
        actions.append(
            "kill the unknown application(s) in the Spark master, then check that no output was "
            "written outside the ledger (`relay audit`)"
        )
    if zombies:
        fenced = [inst.id for _, inst in zombies if inst.state is InstanceState.FENCED]
        unfenced = [inst.id for _, inst in zombies if inst.state is not InstanceState.FENCED]
        if unfenced:
            actions.append(
                f"fence instance(s) {unfenced} (it is not fenced: it could still commit) and kill "
                f"their driver(s): {STOP}"
            )
        if fenced:
            actions.append(f"kill the driver(s) of fenced instance(s) {fenced} (they cannot commit): {STOP}")
    data["unknown_apps"] = [a.id for a in unknown]
    data["zombie_apps"] = [{"app": a.id, "instance": i.id, "state": i.state.value} for a, i in zombies]

    current: list[dict[str, Any]] = []
    superseded: list[dict[str, Any]] = []
    for inst in live:
        cur, old = live_attempts(inst, attempts.get(inst.id, []), now)
        current += [{"instance": inst.id, "attempt": a.id, "epoch": a.epoch} for a in cur]
        superseded += [{"instance": inst.id, "attempt": a.id, "epoch": a.epoch} for a in old]
    data["live_attempts"], data["superseded_attempts"] = current, superseded
    upgrade = is_upgrade(live)
    data["upgrade_in_progress"] = upgrade
    if len(live) > 1 and not upgrade:
        problems.append(
            f"{len(live)} live instances {[i.id for i in live]} "
            f"({', '.join(i.state.value for i in live)}) while no upgrade is in progress"
        )
        actions.append(f"keep one instance: {STOP}, then {DEPLOY}")
    elif len(current) > (2 if upgrade else 1):
        problems.append(f"{len(current)} attempts alive at once: {current}")
        actions.append(f"keep one instance: {STOP}, then {DEPLOY}")

    nothing_runs = not live and all(app in stopping for app in inventory.apps)
    run_state = RunState.DOWN if nothing_runs else RunState.RUNNING
    stopped = stopped_on_purpose(instances) if nothing_runs else None
    if stopped is not None:
        run_state = RunState.STOPPED
    if inventory.master_error and not live:
        run_state = RunState.UNKNOWN
    data["status"] = run_state.value
    committing = last_commit_at is not None and now - last_commit_at < COMMITTING_S
    if inventory.master_error and committing and live:  # a master restart: the drivers go on
        warnings.insert(
            0,
            f"Spark master unreachable ({inventory.master_error}), but the pipeline committed "
            f"{now - last_commit_at:.0f}s ago: what runs beside it cannot be verified meanwhile",
        )
    elif inventory.master_error:
        problems.insert(0, f"Spark master unreachable: {inventory.master_error}")
        actions.insert(0, "check the Spark master (`relay stack status`); what runs cannot be verified")
    refused_action = "find who submits copies of the job (they were refused and wrote nothing)"
    if problems:  # refused starts stay named: with an impostor running they tell who submits copies
        return Check(
            "single_instance",
            Level.CRITICAL,
            "; ".join(problems + warnings),
            data,
            "; ".join(actions + ([refused_action] if warnings else [])),
        )
    if warnings:
        action = refused_action if recent else "check the Spark master (`relay stack status`)"
        return Check("single_instance", Level.WARN, "; ".join(warnings), data, action)
    if stopped is not None:
        return Check(
            "single_instance",
            Level.OK,
            f"STOPPED on purpose: instance {stopped.id} ({stopped.version}) was stopped by `relay stop`; "
            "nothing runs the pipeline until the next deploy",
            data,
        )
    if run_state is RunState.DOWN:
        why = (
            f" (instance(s) {[i.id for i in inventory.dead]} are live in the ledger but nothing runs them)"
            if inventory.dead
            else ""
        )
        return Check("single_instance", Level.OK, f"DOWN: nothing runs the pipeline{why}", data)
    what = "; ".join(f"instance {i.id} {i.state.value} ({i.version}, {i.color.value})" for i in live)
    return Check(
        "single_instance", Level.OK, f"RUNNING: {what}" + (" (upgrade in progress)" if upgrade else ""), data
    )


def stopped_on_purpose(instances: list[Instance]) -> Instance | None:
    """The newest instance, when a person stopped it (``relay stop`` asks in the ledger, then the
    instance ends STOPPED, or FENCED when its driver had to be killed); None otherwise (a crash,
    a failure, a driver SIGTERMed by Spark: those are DOWN)."""
    newest = max(instances, key=lambda i: i.id, default=None)
    if newest is None or not newest.stop_requested:
        return None
    return newest if newest.state in (InstanceState.STOPPED, InstanceState.FENCED) else None


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
    data: dict[str, Any] = {"instances": []}
    problems: list[str] = []
    actions: list[str] = []
    judged = [i for i in instances if i.state is not InstanceState.FENCED]
    considered = [i for i in judged if i.id in live_ids]
    latest = judged[-1] if judged else None
    if latest is not None and latest.id not in live_ids:
        considered.append(latest)  # the last one explains why nothing runs (FAILED, STOPPED)
    newest = max((i.id for i in considered), default=0)
    fenced = [i for i in instances if i.state is InstanceState.FENCED and i.id > newest]
    data["fenced_after"] = [
        {"id": i.id, "version": i.version, "color": i.color.value, "reason": i.error} for i in fenced
    ]
    running = any(i.id in live_ids for i in considered)
    note = (
        f"instance {fenced[-1].id} ({fenced[-1].version}, {fenced[-1].color.value}) was fenced: "
        f"{fenced[-1].error or 'no reason recorded'}"
        if fenced and not running and not fenced[-1].stop_requested  # a stop that had to fence: asked
        else None
    )
    for inst in considered:
        atts = attempts.get(inst.id, [])
        recent = [
            a for a in atts if a.started_at >= now - crash_window_s and a.id not in (productive or set())
        ]
        last = atts[-1] if atts else None
        data["instances"].append(
            {
                "id": inst.id,
                "state": inst.state.value,
                "restarts": max(len(atts) - 1, 0),
                "attempts_in_window": len(recent),
                "error": inst.error,
                "last_attempt": last.to_json() if last else None,
            }
        )
        if len(recent) >= crash_attempts:
            errors = sorted({a.error for a in recent if a.error})
            problems.append(
                f"crash loop: instance {inst.id} started {len(recent)} attempts in the last "
                f"{fmt_s(crash_window_s)}" + (f" (errors: {'; '.join(errors)[:300]})" if errors else "")
            )
            actions.append(
                f"read the driver log (var/logs or the Spark worker), fix the cause, {STOP}, then {DEPLOY}"
            )
        failure = inst.error if inst.state is InstanceState.FAILED else None
        if not failure and last is not None and last.state is AttemptState.FAILED and inst.id in live_ids:
            failure = last.error or "its last attempt FAILED"
        if failure:
            problems.append(f"instance {inst.id} {inst.state.value}: {failure}")
            if "data loss" in failure.lower():
                actions.append("run the recovery DAG relay_recover (strategy earliest; dry-run first)")
            else:
                actions.append(f"read the driver log, fix the cause, then {DEPLOY}")
    data["restarts"] = sum(d["restarts"] for d in data["instances"] if d["id"] in live_ids)
    if problems:
        text = "; ".join(problems + ([note] if note else []))
        return Check("driver", Level.CRITICAL, text, data, "; ".join(dict.fromkeys(actions)))
    if note:
        return Check(
            "driver",
            Level.WARN,
            f"nothing runs; {note}",
            data,
            f"fix what the fencing names, then {DEPLOY} (or run the upgrade again)",
        )
    if not considered:
        return Check("driver", Level.OK, "no instance yet", data)
    return Check("driver", Level.OK, f"{data['restarts']} restart(s) of the live instance(s)", data)
