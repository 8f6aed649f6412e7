"""Self-heal: relaunch a live instance whose driver Spark will never run again.

Why: Spark's supervision relaunches a driver that exits non-zero, never one the master ended as
KILLED (a recovered master had its re-registered worker kill a driver it had just relaunched:
observed with Spark 4.2 standalone) nor one a master restarted without recovery has forgotten. The
ledger still says ACTIVE, nothing runs, and until now a person had to run stop + deploy. The health
check (DAG ``relay_health``; ``relay health --heal``) relaunches such an instance itself: the same
instance and checkpoint under a new submission with a NEW launch token, so the old submission is
refused should the master ever bring it back, and the new attempt's epoch fences anything of it
still writing. No record is lost or applied twice: the relaunch replays from the ledger's cursors,
like any restart.

It relaunches only when every condition holds, and otherwise says which one did not (a person
decides, or the next check looks again):
- ``RELAY_HEAL`` is on (the default);
- the master answers, is ALIVE, and reports the driver final (KILLED, FAILED, FINISHED, ERROR) or
  does not know it (NOT_FOUND);
- the instance is ACTIVE, no stop was asked for, and no operation (upgrade, recovery, rollback) is
  in progress: an upgrade's instances belong to the upgrade DAG;
- none of its attempts heartbeated in the last ``DRIVER_ALIVE_S`` (a driver still dying);
- it was relaunched fewer than ``MAX_RELAUNCHES`` times in the last ``RELAUNCH_WINDOW_S``: a
  driver that dies again after each relaunch is a crash loop for a person, not for a loop.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from relay.config import RelayConfig
from relay.errors import RelayError
from relay.ledger import schema as s
from relay.ledger.attempts import DRIVER_ALIVE_S
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import Inventory
from relay.operations.upgrade_state import ALL_TERMINAL
from relay.spark.launcher import LOCAL_PREFIX, launch, spark_client
from relay.spark.rest import DriverState

Progress = Callable[[str], None]
REPORT_KIND = "heal"
MAX_RELAUNCHES = 3
RELAUNCH_WINDOW_S = 3600.0
RELAUNCHING = "relaunching-"  # the submission id while a check relaunches the instance (a claim)
NOT_RUNNING_AGAIN = (*(s for s in DriverState if s.is_final), DriverState.NOT_FOUND)


@dataclass
class Relaunch:
    """What the self-heal did (or why not) for one instance the ledger calls live and nothing runs."""

    instance_id: int
    old_submission: str | None
    driver_state: str | None
    relaunched: bool = False
    new_submission: str | None = None
    reason: str = ""
    lasting: bool = False
    """Not relaunched for a reason the next check will find again (a person must act)."""

    def to_json(self) -> dict:
        return asdict(self)


def _noop(_: str) -> None:
    pass


def recent_relaunches(ledger: Ledger, pipeline: str, instance_id: int, now: float) -> int:
    rows = ledger.reports(pipeline, REPORT_KIND, limit=50)
    return sum(
        1
        for r in rows
        if r["body"].get("instance_id") == instance_id
        and r["body"].get("relaunched")
        and r["created_at"] >= now - RELAUNCH_WINDOW_S
    )


def _why_not(
    config: RelayConfig,
    ledger: Ledger,
    inventory: Inventory,
    inst: Instance,
    state: DriverState | None,
    now: float,
) -> tuple[str, bool] | None:
    """Why this dead instance must not be relaunched now, and whether that lasts (None: relaunch)."""
    if not config.heal:
        return "self-heal is off (RELAY_HEAL=false)", True
    if inventory.master_error:
        return f"the Spark master did not answer: {inventory.master_error}", False
    if inst.submission_id and inst.submission_id.startswith(LOCAL_PREFIX):
        return "a local driver (relay deploy --local) is not relaunched", True
    if inst.state is not InstanceState.ACTIVE:
        return f"instance {inst.id} is {inst.state.value}: only an ACTIVE instance is relaunched", False
    if inst.stop_requested:
        return f"a stop was asked for instance {inst.id}", False
    if state not in NOT_RUNNING_AGAIN:
        return f"the master reports its driver {state.value if state else 'unknown'}: it may still run", False
    busy = ledger.in_progress(config.pipeline, ALL_TERMINAL)
    if busy:
        return f"{busy[0]['kind']} {busy[0]['id']} is in progress: it owns the pipeline's instances", False
    beating = [
        a
        for a in ledger.attempts(inst.id)
        if a.state is AttemptState.RUNNING and a.heartbeat_at > now - DRIVER_ALIVE_S
    ]
    if beating:
        ago = now - beating[-1].heartbeat_at
        return f"attempt {beating[-1].id} heartbeated {ago:.0f}s ago: its driver may be dying", False
    done = recent_relaunches(ledger, config.pipeline, inst.id, now)
    if done >= MAX_RELAUNCHES:
        return (
            f"relaunched {done} times in the last {RELAUNCH_WINDOW_S / 60:.0f} min already: read the driver "
            "log, fix the cause, then relay stop and relay deploy",
            True,
        )
    return None


def relaunch_dead(
    config: RelayConfig, ledger: Ledger, inventory: Inventory, progress: Progress = _noop
) -> list[Relaunch]:
    """Relaunch each instance of ``inventory.dead`` that may be (see the module); one record each.

    Every relaunch (done or refused) is saved as a ``heal`` report so the next checks, the audit
    trail and the crash-loop budget see it. Never raises for one instance: a failed submission is
    recorded and the next check tries again.
    """
    client = spark_client(config) if inventory.dead and not inventory.master_error else None
    if client is not None:
        try:
            if not client.master_state().alive:
                inventory.master_error = "the master is not ALIVE (recovering or standby)"
        except RelayError as exc:
            inventory.master_error = str(exc)
    out: list[Relaunch] = []
    for inst in inventory.dead:
        now = time.time()
        state: DriverState | None = None
        submission = inst.submission_id
        if (
            client is not None
            and not inventory.master_error
            and submission
            and not submission.startswith(LOCAL_PREFIX)
        ):
            try:
                state = client.driver_status(submission)
            except RelayError as exc:
                inventory.master_error = str(exc)
        rec = Relaunch(inst.id, inst.submission_id, state.value if state else None)
        why = _why_not(config, ledger, inventory, inst, state, now)
        if why is not None:
            rec.reason, rec.lasting = why
            progress(f"instance {inst.id}: not relaunched: {rec.reason}")
        else:
            rec.reason = f"the master reports driver {inst.submission_id} {state.value}"
            progress(f"instance {inst.id} is ACTIVE but {rec.reason}: relaunching it")
            rec.relaunched = _relaunch(config, ledger, inst, rec, progress)
        if why is None or rec.relaunched:
            ledger.save_report(
                config.pipeline, REPORT_KIND, "OK" if rec.relaunched else "FAILED", rec.to_json()
            )
        out.append(rec)
    if client is not None:
        client.close()
    return out


def _claim(ledger: Ledger, inst: Instance) -> bool:
    """Take the relaunch: the instance is still ACTIVE, no stop asked, on the dead submission, and
    no other check (the DAG's and a person's ``relay health --heal`` may run at once) took it first.
    A compare-and-set on the submission id: two relaunches would start two drivers of one instance."""
    with ledger.tx() as conn:
        claimed = conn.execute(
            s.instances.update()
            .where(
                s.instances.c.id == inst.id,
                s.instances.c.state == InstanceState.ACTIVE.value,
                s.instances.c.stop_requested.is_(False),
                s.instances.c.submission_id == inst.submission_id
                if inst.submission_id
                else s.instances.c.submission_id.is_(None),
            )
            .values(submission_id=f"{RELAUNCHING}{secrets.token_hex(6)}")
        ).rowcount
    return claimed == 1


def _relaunch(config: RelayConfig, ledger: Ledger, inst: Instance, rec: Relaunch, progress: Progress) -> bool:
    if not _claim(ledger, inst):
        now = ledger.instance(inst.id)
        rec.reason += f"; not relaunched: instance {inst.id} changed meanwhile ({now.state.value})"
        return False
    for a in ledger.attempts(inst.id):
        if a.state is AttemptState.RUNNING:  # its driver is final: it will never record its end
            ledger.end_attempt(
                a.id, AttemptState.CRASHED, f"driver {rec.driver_state} (found by the self-heal)"
            )
    try:
        rec.new_submission = launch(config, ledger, ledger.instance(inst.id))
    except RelayError as exc:
        ledger.set_instance(inst.id, submission_id=inst.submission_id)  # the claim back: found dead again
        rec.reason += f"; the relaunch failed: {type(exc).__name__}: {exc}"[:500]
        rec.lasting = True
        progress(f"instance {inst.id}: {rec.reason}")
        return False
    progress(f"instance {inst.id} relaunched as driver {rec.new_submission}")
    return True


__all__ = ["MAX_RELAUNCHES", "Relaunch", "relaunch_dead"]
