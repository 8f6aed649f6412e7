"""Check of what runs: one instance only (the ledger's instances against the Spark master's applications).

The inputs are read once into :class:`Seen` (who is live, what each of the master's applications is to
the ledger (``relay.health.apps``), the refused starts, the run state); each finding is then judged by
its own small function, so a rule can be read, and changed, without the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relay.health.apps import Apps, other_drivers, sort_apps
from relay.health.report import DEPLOY, REFUSAL_WINDOW_S, STOP, Check, Level, RunState
from relay.ledger.models import Attempt, AttemptState, Instance, InstanceState
from relay.operations.inventory import STALE_HEARTBEAT_S, Inventory
from relay.spark.rest import SparkApp

COMMITTING_S = 60.0  # a commit this recent: the pipeline runs, whatever the master says
NAME = "single_instance"
KEEP_ONE = f"keep one instance: {STOP}, then {DEPLOY}"
CHECK_MASTER = "check the Spark master (`relay stack status`)"
REFUSED_ACTION = "find who submits copies of the job (they were refused and wrote nothing)"


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


def stopped_on_purpose(instances: list[Instance]) -> Instance | None:
    """The newest instance, when a person stopped it (``relay stop`` asks in the ledger, then the
    instance ends STOPPED, or FENCED when its driver had to be killed); None otherwise (a crash,
    a failure, a driver SIGTERMed by Spark: those are DOWN)."""
    newest = max(instances, key=lambda i: i.id, default=None)
    if newest is None or not newest.stop_requested:
        return None
    return newest if newest.state in (InstanceState.STOPPED, InstanceState.FENCED) else None


# ------------------------------------------------------------------------- what is seen, once
@dataclass(frozen=True)
class Seen:
    """Everything the single-instance finding judges, derived once from the ledger and the master."""

    live: list[Instance]
    apps: Apps
    refused: list[dict]  # starts refused within REFUSAL_WINDOW_S
    current: list[dict[str, Any]]  # live attempts of the current epochs
    superseded: list[dict[str, Any]]  # older attempts that still heartbeat
    upgrade: bool
    run_state: RunState
    stopped: Instance | None  # the instance a person stopped, when nothing runs


def attempt_rows(
    live: list[Instance], attempts: dict[int, list[Attempt]], now: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(current, superseded) live attempts of the live instances, as the report lists them."""
    current: list[dict[str, Any]] = []
    superseded: list[dict[str, Any]] = []
    for inst in live:
        cur, old = live_attempts(inst, attempts.get(inst.id, []), now)
        current += [{"instance": inst.id, "attempt": a.id, "epoch": a.epoch} for a in cur]
        superseded += [{"instance": inst.id, "attempt": a.id, "epoch": a.epoch} for a in old]
    return current, superseded


def run_state_of(
    live: list[Instance], inventory: Inventory, stopping: list[SparkApp], instances: list[Instance]
) -> tuple[RunState, Instance | None]:
    """(whether the job runs, the instance stopped on purpose when nothing does). An application still
    finishing after `relay stop` runs nothing; a master that does not answer leaves it UNKNOWN unless
    the ledger has a live instance."""
    nothing_runs = not live and all(app in stopping for app in inventory.apps)
    stopped = stopped_on_purpose(instances) if nothing_runs else None
    if inventory.master_error and not live:
        return RunState.UNKNOWN, stopped
    if stopped is not None:
        return RunState.STOPPED, stopped
    return (RunState.DOWN if nothing_runs else RunState.RUNNING), stopped


def see(
    pipeline: str,
    inventory: Inventory,
    instances: list[Instance],
    attempts: dict[int, list[Attempt]],
    now: float,
    refusals: list[dict] | None,
) -> Seen:
    """Both views, read once for every judgement below."""
    by_id = {i.id: i for i in instances}
    live = [by_id.get(i.id, i) for i in inventory.live]
    apps = sort_apps(pipeline, inventory.apps, live, by_id, attempts, now)
    current, superseded = attempt_rows(live, attempts, now)
    run_state, stopped = run_state_of(live, inventory, apps.stopping, instances)
    refused = [r for r in refusals or [] if r["created_at"] > now - REFUSAL_WINDOW_S]
    return Seen(live, apps, refused, current, superseded, is_upgrade(live), run_state, stopped)


def single_data(
    seen: Seen, inventory: Inventory, instances: list[Instance], attempts: dict[int, list[Attempt]]
) -> dict[str, Any]:
    """The finding's details: both views as compared, and what each judgement found."""
    return {
        "live_instances": [
            {
                "id": i.id,
                "state": i.state.value,
                "version": i.version,
                "color": i.color.value,
                "submission_id": i.submission_id,
            }
            for i in seen.live
        ],
        "dead_instances": [
            {"id": i.id, "state": i.state.value, "submission_id": i.submission_id} for i in inventory.dead
        ],
        "master_apps": [{"id": a.id, "name": a.name, "state": a.state.value} for a in inventory.apps],
        "master_error": inventory.master_error,
        "other_drivers": other_drivers(inventory, instances, attempts),
        "refused_starts": [
            {"instance": r["instance_id"], "driver": r["driver_id"], "host": r["host"], "at": r["created_at"]}
            for r in seen.refused
        ],
        "unknown_apps": [a.id for a in seen.apps.not_ours],
        "zombie_apps": [
            {"app": a.id, "instance": i.id, "state": i.state.value} for a, i in seen.apps.zombies
        ],
        "live_attempts": seen.current,
        "superseded_attempts": seen.superseded,
        "upgrade_in_progress": seen.upgrade,
        "status": seen.run_state.value,
    }


# --------------------------------------------------------------------------- the judgements
def master_unreachable(
    master_error: str | None, live: bool, now: float, last_commit_at: float | None
) -> tuple[str | None, str | None]:
    """(warning, problem) for a master that does not answer. While the pipeline keeps committing it is
    a master restart (the drivers go on): a warning, since nothing beside it can be verified meanwhile."""
    if not master_error:
        return None, None
    if live and last_commit_at is not None and now - last_commit_at < COMMITTING_S:
        return (
            f"Spark master unreachable ({master_error}), but the pipeline committed "
            f"{now - last_commit_at:.0f}s ago: what runs beside it cannot be verified meanwhile"
        ), None
    return None, f"Spark master unreachable: {master_error}"


def several_running(live: list[Instance], current: list[dict[str, Any]], upgrade: bool) -> str | None:
    """More than one instance, or attempt, alive outside an upgrade (which runs two by design)."""
    if len(live) > 1 and not upgrade:
        return (
            f"{len(live)} live instances {[i.id for i in live]} "
            f"({', '.join(i.state.value for i in live)}) while no upgrade is in progress"
        )
    if len(current) > (2 if upgrade else 1):
        return f"{len(current)} attempts alive at once: {current}"
    return None


def refused_starts(refused: list[dict]) -> str | None:
    """Drivers refused at start for want of the launch token: they wrote nothing, but someone runs
    copies of the job."""
    if not refused:
        return None
    return f"{len(refused)} start(s) refused in the last {REFUSAL_WINDOW_S / 60:.0f} min: " + "; ".join(
        r["reason"] for r in refused[-3:]
    )


def app_actions(apps: Apps) -> list[str]:
    """What to do about applications Relay did not start and zombies (fenced ones cannot commit)."""
    actions: list[str] = []
    if apps.not_ours:
        actions.append(
            "kill the unknown application(s) in the Spark master, then check that no output was "
            "written outside the ledger (`relay audit`)"
        )
    fenced = [inst.id for _, inst in apps.zombies if inst.state is InstanceState.FENCED]
    unfenced = [inst.id for _, inst in apps.zombies if inst.state is not InstanceState.FENCED]
    if unfenced:
        actions.append(
            f"fence instance(s) {unfenced} (it is not fenced: it could still commit) and kill "
            f"their driver(s): {STOP}"
        )
    if fenced:
        actions.append(f"kill the driver(s) of fenced instance(s) {fenced} (they cannot commit): {STOP}")
    return actions


def findings(
    seen: Seen, master_error: str | None, now: float, last_commit_at: float | None
) -> tuple[list[str], list[str], list[str]]:
    """(problems, warnings, actions) of every judgement, in the order the report names them."""
    warning, problem = master_unreachable(master_error, bool(seen.live), now, last_commit_at)
    several = several_running(seen.live, seen.current, seen.upgrade)
    problems = [p for p in (problem, *seen.apps.problems, several) if p]
    warnings = [w for w in (warning, refused_starts(seen.refused)) if w]
    actions = [f"{CHECK_MASTER}; what runs cannot be verified"] if problem else []
    actions += app_actions(seen.apps) + ([KEEP_ONE] if several else [])
    return problems, warnings, actions


def what_runs(seen: Seen, inventory: Inventory, data: dict[str, Any]) -> Check:
    """Nothing wrong: the OK finding says whether the job was stopped on purpose, is down or runs."""
    if seen.stopped is not None:
        return Check(
            NAME,
            Level.OK,
            f"STOPPED on purpose: instance {seen.stopped.id} ({seen.stopped.version}) was stopped by "
            "`relay stop`; nothing runs the pipeline until the next deploy",
            data,
        )
    if seen.run_state is RunState.DOWN:
        why = (
            f" (instance(s) {[i.id for i in inventory.dead]} are live in the ledger but nothing runs them)"
            if inventory.dead
            else ""
        )
        return Check(NAME, Level.OK, f"DOWN: nothing runs the pipeline{why}", data)
    what = "; ".join(f"instance {i.id} {i.state.value} ({i.version}, {i.color.value})" for i in seen.live)
    upgrade = " (upgrade in progress)" if seen.upgrade else ""
    return Check(NAME, Level.OK, f"RUNNING: {what}{upgrade}", data)


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
    seen = see(pipeline, inventory, instances, attempts, now, refusals)
    data = single_data(seen, inventory, instances, attempts)
    problems, warnings, actions = findings(seen, inventory.master_error, now, last_commit_at)
    if problems:  # refused starts stay named: with an impostor running they tell who submits copies
        action = "; ".join(actions + ([REFUSED_ACTION] if warnings else []))
        return Check(NAME, Level.CRITICAL, "; ".join(problems + warnings), data, action)
    if warnings:
        return Check(
            NAME, Level.WARN, "; ".join(warnings), data, REFUSED_ACTION if seen.refused else CHECK_MASTER
        )
    return what_runs(seen, inventory, data)
