"""What runs of a pipeline: the ledger's inside view against the Spark master's outside view."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from relay.config import RelayConfig
from relay.errors import SparkError
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.polling import poll
from relay.spark.capacity import Needs, never_fits, room_problem
from relay.spark.launcher import app_prefix, driver_running, spark_client
from relay.spark.rest import MasterState, SparkApp, SparkDriver

STALE_HEARTBEAT_S = 60.0


@dataclass
class Inventory:
    live: list[Instance] = field(default_factory=list)  # ledger says live and its driver runs
    dead: list[Instance] = field(default_factory=list)  # ledger says live but nothing runs it
    apps: list[SparkApp] = field(default_factory=list)  # master's active applications of the pipeline
    master_error: str | None = None
    master: MasterState | None = None  # the master's whole view, as read (None: unreachable)

    @property
    def drivers(self) -> list[SparkDriver]:
        """The master's active drivers (all pipelines); none when it could not be read."""
        return list(self.master.active_drivers) if self.master else []

    @property
    def unknown_apps(self) -> list[SparkApp]:
        known = {i.app_name for i in self.live}
        return [a for a in self.apps if a.name not in known]

    def describe(self) -> str:
        parts = [
            f"instance {i.id} ({i.version}, {i.color.value}, {i.state.value}, driver {i.submission_id})"
            for i in self.live
        ]
        parts += [
            f"Spark application {a.id} named {a.name} ({a.state.value}) unknown to the ledger"
            for a in self.unknown_apps
        ]
        return "; ".join(parts) or "nothing"


def master_apps(config: RelayConfig, pipeline: str) -> list[SparkApp]:
    prefix = app_prefix(pipeline)
    return [a for a in spark_client(config).master_state().active_apps if a.name.startswith(prefix)]


def take_inventory(config: RelayConfig, ledger: Ledger, reconcile: bool = True) -> Inventory:
    """Both views; with ``reconcile`` a live instance whose driver is gone is marked FAILED."""
    inv = Inventory()
    try:
        state = inv.master = spark_client(config).master_state()
        prefix = app_prefix(config.pipeline)
        inv.apps = [a for a in state.active_apps if a.name.startswith(prefix)]
    except SparkError as exc:
        inv.master_error = str(exc)
    for inst in ledger.instances(config.pipeline, live_only=True):
        try:
            running = driver_running(config, inst.submission_id) if inst.submission_id else False
        except SparkError as exc:  # master unreachable: trust the ledger, never reconcile blindly
            inv.master_error = inv.master_error or str(exc)
            inv.live.append(inst)
            continue
        if not running and inst.submission_id is None:
            # Not launched yet (or launch failed): alive only while something heartbeats for it.
            attempts = ledger.attempts(inst.id)
            running = (
                any(
                    a.state is AttemptState.RUNNING and a.heartbeat_at > time.time() - STALE_HEARTBEAT_S
                    for a in attempts
                )
                or inst.created_at > time.time() - STALE_HEARTBEAT_S
            )
        if running or any(a.name == inst.app_name for a in inv.apps):
            inv.live.append(inst)
        else:
            inv.dead.append(inst)
            if reconcile:
                ledger.set_instance(
                    inst.id,
                    state=InstanceState.FAILED,
                    error=inst.error or "driver gone (found by inventory)",
                )
                for a in ledger.attempts(inst.id):
                    if a.state is AttemptState.RUNNING:
                        ledger.end_attempt(a.id, AttemptState.CRASHED, "driver gone (found by inventory)")
    return inv


ROOM_SETTLE_S = 10.0  # a driver that just ended may still hold its cores in the master's view


def no_room(config: RelayConfig, master: MasterState, settle_s: float = ROOM_SETTLE_S) -> str | None:
    """Why one more instance of the pipeline can't run now (None: it can), looking again for up to
    ``settle_s`` before saying so; the master unreachable on a later look counts as no news."""
    needs = Needs.of(config)
    if never := never_fits(master, needs):
        return never
    problem = room_problem(master, needs)

    def room() -> bool | None:
        nonlocal problem
        try:
            latest = spark_client(config).master_state()
        except SparkError:
            return None  # no news: the last look stands
        problem = room_problem(latest, needs)
        return True if problem is None else None

    if problem is not None:
        poll(room, settle_s, 1.0)
    return problem
