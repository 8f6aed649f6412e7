"""Stop: graceful (between batches, offsets == commits), verified through the Spark master's REST view.

Split in three steps so Airflow can wait between them without holding a worker: ask every live
instance to stop (:func:`request_stops`), wait until their drivers are gone (``waits.DriversStoppedWait``,
in-process here, in a trigger there), then settle each one (:func:`settle_instance_stop`: fence and kill
what did not stop in time, record the states). Each step is safe to run again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from relay.config import RelayConfig
from relay.errors import OperationError
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import master_apps, take_inventory
from relay.polling import poll
from relay.spark.launcher import driver_running, kill

Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def _current_attempt_stopped(ledger: Ledger, instance_id: int) -> bool:
    """Graceful = the attempt holding the current epoch ended STOPPED (offsets == commits)."""
    epoch = ledger.instance(instance_id).current_epoch
    return any(a.epoch == epoch and a.state is AttemptState.STOPPED for a in ledger.attempts(instance_id))


def settle_instance_stop(
    config: RelayConfig,
    ledger: Ledger,
    instance_id: int,
    timeout_s: float,
    started_at: float,
    progress: Progress = _noop,
) -> dict:
    """After the graceful-stop wait: end a lingering driver (fencing it first unless it stopped between
    batches), record the instance's and its attempts' end. Idempotent: a stopped instance stays so."""
    graceful = _current_attempt_stopped(ledger, instance_id)
    submission = ledger.instance(instance_id).submission_id  # follows a driver the master relaunched
    if driver_running(config, submission):
        if graceful:  # the attempt stopped between batches; only its process lingers
            progress(f"instance {instance_id} stopped gracefully; ending its lingering driver {submission}")
        else:
            progress(f"instance {instance_id} did not stop within {timeout_s:.0f}s: fencing and killing it")
            ledger.fence(instance_id, f"did not stop within {timeout_s:.0f}s")
        kill(config, submission)
    current = ledger.instance(instance_id)
    if current.state.live:
        ledger.set_instance(instance_id, state=InstanceState.STOPPED if graceful else InstanceState.FENCED)
    for a in ledger.attempts(instance_id):
        if a.state is AttemptState.RUNNING:  # killed attempts never recorded their end
            ledger.end_attempt(a.id, AttemptState.CRASHED, "no longer running (found by relay stop)")
    return {"instance_id": instance_id, "graceful": graceful, "seconds": round(time.time() - started_at, 2)}


def stop_instance(
    config: RelayConfig, ledger: Ledger, inst: Instance, timeout_s: float = 120.0, progress: Progress = _noop
) -> dict:
    """Ask one instance to stop between batches; kill and fence it if it does not within the timeout."""
    t0 = time.time()
    ledger.request_stop(inst.id)
    poll(lambda: None if driver_running(config, ledger.instance(inst.id).submission_id) else True, timeout_s)
    return settle_instance_stop(config, ledger, inst.id, timeout_s, t0, progress)


def request_stops(config: RelayConfig, ledger: Ledger, progress: Progress = _noop) -> list[int]:
    """Ask every live instance of the pipeline to stop between batches; their ids (maybe none)."""
    live = take_inventory(config, ledger).live
    for inst in live:
        progress(f"stopping instance {inst.id} ({inst.version}) gracefully")
        ledger.request_stop(inst.id)
    return [inst.id for inst in live]


def verify_stopped(config: RelayConfig, ledger: Ledger, local: bool = False) -> dict:
    """Nothing of the pipeline runs: the ledger's view (the master's is the caller's wait)."""
    remaining = take_inventory(config, ledger)
    if remaining.live:
        raise OperationError(f"still running after stop: {remaining.describe()}")
    return {"pipeline": config.pipeline, "verified": "master" if not local else "ledger"}


def wait_no_apps(config: RelayConfig, timeout_s: float = 60.0) -> None:
    """The master is the outside view: nothing of the pipeline may remain in its active applications."""

    def gone() -> bool | None:
        return True if not master_apps(config, config.pipeline) else None

    def still_running() -> OperationError:
        return OperationError(
            "still running according to the Spark master: "
            + ", ".join(f"{a.id} ({a.name})" for a in master_apps(config, config.pipeline))
        )

    poll(gone, timeout_s, on_timeout=still_running)


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
    return {**verify_stopped(config, ledger, local), "stopped": stopped}
