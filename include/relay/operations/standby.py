"""A pipeline's hot standby (``standby = "hot"``): start one beside the ACTIVE instance, stop it.

The takeover itself is the standby driver's (``relay.protocol.failover``); only a submitter (the
CLI, a DAG task, the health check) can launch a driver, so these start one: ``relay deploy`` once the
first batch committed, ``relay standby``, and every health check with self-heal (the health DAG),
which is how a pipeline gets a new standby after a failover or an upgrade (the upgrade stops the
old version's standby before green starts: one instance waits beside blue at a time).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing

from relay.config import RelayConfig
from relay.errors import RelayError
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import launch_or_fail
from relay.operations.inventory import no_room, take_inventory
from relay.operations.upgrade_state import ALL_TERMINAL
from relay.protocol.failover import FAILOVER_KIND, HOT_STANDBY
from relay.spark.launcher import LOCAL_PREFIX, app_name, spark_client
from relay.spark.placement import active_of, shares_worker

Progress = Callable[[str], None]
FAILED_BUDGET = 3
"""Hot standbys of one version that may fail within ``FAILED_WINDOW_S`` before Relay stops starting them."""
FAILED_WINDOW_S = 3600.0
ROOM_SETTLE_S = 30.0
"""How long a start waits for room: after a failover the master relaunches the dead driver, which
holds its cores until the ledger refuses it (a JVM start, some seconds)."""


def _noop(_: str) -> None:
    pass


def hot_standbys(instances: list[Instance]) -> list[Instance]:
    """The live hot standbys among ``instances`` (waiting: no lease yet)."""
    return [i for i in instances if i.role == HOT_STANDBY and i.state.standby]


def _misplaced(config: RelayConfig, live: list[Instance], standby: Instance, progress: Progress) -> bool:
    """The standby runs on the active's worker while another worker has room for it (it came up
    while that worker was away, e.g. during the host loss it took over from)."""
    active = active_of(live)
    if active is None or (standby.submission_id or LOCAL_PREFIX).startswith(LOCAL_PREFIX):
        return False
    try:
        with closing(spark_client(config)) as client:
            state = client.master_state()
    except RelayError:
        return False
    if not shares_worker(state, active.submission_id, standby.submission_id):
        return False
    progress(f"the hot standby (instance {standby.id}) runs on the active's worker: moving it to another")
    return True


def _why_not(config: RelayConfig, ledger: Ledger, live: list[Instance], now: float) -> str | None:
    """Why no standby can be started now (None: start one)."""
    active = [i for i in live if i.state in (InstanceState.ACTIVE, InstanceState.STARTING)]
    if len(active) != 1 or len(live) != 1:
        states = ", ".join(f"{i.id} {i.state.value}" for i in live) or "nothing"
        return f"a standby waits beside exactly one ACTIVE instance (live: {states})"
    busy = ledger.in_progress(config.pipeline, ALL_TERMINAL)
    if busy:
        return f"{busy[0]['kind']} {busy[0]['id']} is in progress"
    failed = [
        i
        for i in ledger.instances(config.pipeline)
        if i.role == HOT_STANDBY
        and i.state is InstanceState.FAILED
        and i.version == active[0].version
        and i.created_at > now - FAILED_WINDOW_S
    ]
    if len(failed) >= FAILED_BUDGET:
        return (
            f"{len(failed)} hot standbys of {active[0].version} failed in the last hour "
            f"(last: {failed[-1].error}): read their driver log"
        )
    return None


def ensure_standby(
    config: RelayConfig, ledger: Ledger, local: bool = False, progress: Progress = _noop
) -> dict:
    """Start a hot standby when the pipeline wants one and has none; say what there is either way.

    ``{"standby": "none"}`` when the pipeline has no standby configured; else the waiting standby
    (``instance``, ``state``: READY once warm), whether this call ``started`` it, or ``reason``."""
    if config.standby != "hot":
        return {"standby": "none"}
    live = ledger.instances(config.pipeline, live_only=True)
    waiting = hot_standbys(live)
    if waiting and not _misplaced(config, live, waiting[0], progress):
        first = waiting[0]
        return {"standby": "hot", "instance": first.id, "state": first.state.value, "started": False}
    if waiting:  # stopped: a new one is placed on another worker than the active's
        from relay.operations.stop import stop_instance

        stop_instance(config, ledger, waiting[0], timeout_s=60.0, progress=progress)
        live = ledger.instances(config.pipeline, live_only=True)
    reason = _why_not(config, ledger, live, time.time())
    local = local or any((i.submission_id or "").startswith(LOCAL_PREFIX) for i in live)
    inv = None if reason or local else take_inventory(config, ledger, reconcile=False)
    if inv is not None and inv.master is not None:
        reason = no_room(config, inv.master, settle_s=ROOM_SETTLE_S)
    if reason:
        progress(f"no hot standby started: {reason}")
        return {"standby": "hot", "instance": None, "started": False, "reason": reason}
    active = live[0]
    with ledger.tx() as conn:
        inst = ledger.create_instance(
            conn,
            config.pipeline,
            active.version,
            active.color.other,
            "",
            "",
            InstanceState.STANDBY,
            role=HOT_STANDBY,
            resources=active.resources,
        )
        ledger.set_instance(
            inst.id,
            conn,
            checkpoint_dir=str(config.checkpoints_dir / f"instance-{inst.id}"),
            app_name=app_name(config.pipeline, inst.id),
        )
    try:
        submission = launch_or_fail(config, ledger, ledger.instance(inst.id), local=local)
    except RelayError as exc:
        progress(f"the hot standby (instance {inst.id}) could not be launched: {exc}")
        return {"standby": "hot", "instance": inst.id, "started": False, "reason": str(exc)}
    progress(f"hot standby instance {inst.id} ({active.version}) submitted as driver {submission}")
    return {"standby": "hot", "instance": inst.id, "state": "STANDBY", "started": True}


def stop_standbys(config: RelayConfig, ledger: Ledger, progress: Progress = _noop) -> list[int]:
    """Stop the pipeline's waiting hot standbys (before an upgrade: green is the one that waits)."""
    from relay.operations.stop import stop_instance

    stopped = []
    for inst in hot_standbys(ledger.instances(config.pipeline, live_only=True)):
        progress(f"stopping the hot standby (instance {inst.id}) first")
        stop_instance(config, ledger, inst, timeout_s=60.0, progress=progress)
        stopped.append(inst.id)
    return stopped


def failovers(ledger: Ledger, pipeline: str, limit: int = 10) -> list[dict]:
    """The pipeline's latest failovers, newest first: from, to, why, when."""
    return [op["data"] for op in ledger.operations(pipeline, FAILOVER_KIND, limit)]


__all__ = ["ensure_standby", "failovers", "hot_standbys", "stop_standbys"]
