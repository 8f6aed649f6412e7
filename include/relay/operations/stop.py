"""Stop: graceful (between batches, offsets == commits), verified through the Spark master's REST view."""

from __future__ import annotations

import time
from collections.abc import Callable

from relay.config import RelayConfig
from relay.errors import OperationError
from relay.launcher import driver_running, kill
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import master_apps, take_inventory

Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def _current_attempt_stopped(ledger: Ledger, instance_id: int) -> bool:
    """Graceful = the attempt holding the current epoch ended STOPPED (offsets == commits)."""
    epoch = ledger.instance(instance_id).current_epoch
    return any(a.epoch == epoch and a.state is AttemptState.STOPPED for a in ledger.attempts(instance_id))


def stop_instance(
    config: RelayConfig, ledger: Ledger, inst: Instance, timeout_s: float = 120.0, progress: Progress = _noop
) -> dict:
    """Ask one instance to stop between batches; kill and fence it if it does not within the timeout."""
    t0 = time.time()
    ledger.request_stop(inst.id)
    while time.time() - t0 < timeout_s and driver_running(config, ledger.instance(inst.id).submission_id):
        time.sleep(0.5)
    graceful = _current_attempt_stopped(ledger, inst.id)
    submission = ledger.instance(inst.id).submission_id  # follows a driver the master relaunched
    if driver_running(config, submission):
        if graceful:  # the attempt stopped between batches; only its process lingers
            progress(f"instance {inst.id} stopped gracefully; ending its lingering driver {submission}")
        else:
            progress(f"instance {inst.id} did not stop within {timeout_s:.0f}s: fencing and killing it")
            ledger.fence(inst.id, f"did not stop within {timeout_s:.0f}s")
        kill(config, submission)
    current = ledger.instance(inst.id)
    if current.state.live:
        ledger.set_instance(inst.id, state=InstanceState.STOPPED if graceful else InstanceState.FENCED)
    for a in ledger.attempts(inst.id):
        if a.state is AttemptState.RUNNING:  # killed attempts never recorded their end
            ledger.end_attempt(a.id, AttemptState.CRASHED, "no longer running (found by relay stop)")
    return {"instance_id": inst.id, "graceful": graceful, "seconds": round(time.time() - t0, 2)}


def wait_no_apps(config: RelayConfig, timeout_s: float = 60.0) -> None:
    """The master is the outside view: nothing of the pipeline may remain in its active applications."""
    deadline = time.time() + timeout_s
    while True:
        apps = master_apps(config, config.pipeline)
        if not apps:
            return
        if time.time() > deadline:
            raise OperationError(
                "still running according to the Spark master: "
                + ", ".join(f"{a.id} ({a.name})" for a in apps)
            )
        time.sleep(0.5)


def stop(
    config: RelayConfig, timeout_s: float = 120.0, local: bool = False, progress: Progress = _noop
) -> dict:
    ledger = Ledger(config.ledger_url)
    inv = take_inventory(config, ledger)
    stopped = []
    for inst in inv.live:
        progress(f"stopping instance {inst.id} ({inst.version}) gracefully")
        stopped.append(stop_instance(config, ledger, inst, timeout_s, progress))
    if not local:
        wait_no_apps(config)
    remaining = take_inventory(config, ledger)
    if remaining.live:
        raise OperationError(f"still running after stop: {remaining.describe()}")
    return {"pipeline": config.pipeline, "stopped": stopped, "verified": "master" if not local else "ledger"}
