"""Where a hot standby's driver runs: on another worker than the active's, so one host loss takes one.

Spark's standalone master puts a driver on any worker with room; it has no anti-affinity. It does
place drivers by custom resources (``spark.driver.resource.<name>.amount`` matched against what
each worker declares), so every worker Relay starts declares a resource of its own, named after it
(:func:`worker_options`), and a standby's driver and executors ask for one unit each of another
live worker's: a host loss then leaves the standby whole (its executors too, or its first batch
would wait for new ones). The request is part of the driver's description, so the master's
supervised relaunches keep it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from relay.errors import RelayError
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.spark.rest import MasterState, SparkStandaloneClient

PREFIX = "relayworker"
UNITS = 64
"""Drivers that may hold one worker's resource at once (one unit each; far more than fit)."""


def resource_name(host: str, ui_port: int) -> str:
    """The worker's own resource: unique per host and web UI port (no dots: Spark splits on them)."""
    return f"{PREFIX}_" + re.sub(r"[^A-Za-z0-9]", "_", f"{host}_{ui_port}")


def worker_options(name: str, folder: Path) -> str:
    """SPARK_WORKER_OPTS that declare resource ``name`` (its addresses in a file under ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    allocation = {"id": {"componentName": "spark.worker", "resourceName": name}}
    allocation["addresses"] = [str(i) for i in range(UNITS)]  # type: ignore[assignment]
    path.write_text(json.dumps([allocation]))
    return f"-Dspark.worker.resource.{name}.amount={UNITS} -Dspark.worker.resourcesFile={path}"


def own_resource(resources: tuple[str, ...]) -> str | None:
    return next((r for r in resources if r.startswith(PREFIX)), None)


def away_from(state: MasterState, driver_id: str | None) -> dict[str, str]:
    """sparkProperties that put a driver on a live worker other than ``driver_id``'s.

    Empty when there is none to ask for (one worker, workers that declare no Relay resource, the
    driver unknown to the master): the driver then goes wherever the master has room."""
    driver = state.driver(driver_id) if driver_id else None
    if driver is None:
        return {}
    others = [
        w for w in state.workers if w.state == "ALIVE" and w.id != driver.worker and own_resource(w.resources)
    ]
    if not others:
        return {}
    best = max(others, key=lambda w: (w.cores - w.cores_used, w.memory_mb - w.memory_used_mb))
    name = own_resource(best.resources)
    return {f"spark.driver.resource.{name}.amount": "1", f"spark.executor.resource.{name}.amount": "1"}


def active_of(instances: list[Instance]) -> Instance | None:
    """The ACTIVE (or STARTING) instance, the one a hot standby waits beside (a standby has a role)."""
    return next(
        (
            i
            for i in instances
            if i.role is None and i.state in (InstanceState.ACTIVE, InstanceState.STARTING)
        ),
        None,
    )


def standby_properties(ledger: Ledger, instance: Instance, client: SparkStandaloneClient) -> dict[str, str]:
    """:func:`away_from` the driver of the ACTIVE instance that ``instance`` (a standby) waits beside."""
    active = active_of(ledger.instances(instance.pipeline, live_only=True))
    if active is None or not active.submission_id:
        return {}
    try:
        return away_from(client.master_state(), active.submission_id)
    except RelayError:  # the master is briefly away: the standby goes where there is room
        return {}


def shares_worker(state: MasterState, active_driver: str | None, standby_driver: str | None) -> bool:
    """Whether a standby's driver runs on the active's worker although another live worker could
    take it (:func:`away_from` has somewhere else to ask for): a host loss would take both."""
    active = state.driver(active_driver) if active_driver else None
    standby = state.driver(standby_driver) if standby_driver else None
    if active is None or standby is None or active.worker != standby.worker:
        return False
    return bool(away_from(state, active_driver))
