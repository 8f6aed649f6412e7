"""Blue-green upgrade with a warm standby and an exact handoff at H: blue applies [cursor, H), green [H, ...).

Green starts first and holds, without leases, until it is READY; only then is H chosen, so records
wait for one trigger of green, not for its start-up. Every step is a persisted state (``operations``
table), so a run that dies half-way is resumed by running the upgrade again, and two upgrades (or an
upgrade and a recovery) never run at once. Until blue stops, a failed gate aborts (blue takes its
leases back); after it, only forward. The steps live in ``upgrade_steps`` and ``upgrade_finish``
(Airflow runs each as a task); :func:`upgrade` runs them all.
"""

from __future__ import annotations

import contextlib
import time

from relay.artifacts import artifact, build_artifact, validate_version
from relay.config import RelayConfig
from relay.errors import OperationError
from relay.ledger.store import Ledger
from relay.operations import upgrade_steps as steps
from relay.operations.inventory import take_inventory
from relay.operations.standby import stop_standbys
from relay.operations.upgrade_plan import judge_blue
from relay.operations.upgrade_state import check_gates
from relay.operations.upgrade_state import noop as _noop
from relay.operations.upgrade_steps import (  # re-exported: the upgrade's public names
    ALL_TERMINAL,
    TERMINAL,
    Progress,
    UpgradeState,
    parse_handoff,
)
from relay.operations.waits import (
    CaughtUpWait,
    DrainedWait,
    DriversStoppedWait,
    OnlyAppsWait,
    WaitTimeout,
    wait_in_process,
)
from relay.polling import poll
from relay.spark.first_commit import FirstCommitWait
from relay.spark.launcher import driver_running

__all__ = ["ALL_TERMINAL", "TERMINAL", "UpgradeState", "open_upgrade", "parse_handoff", "upgrade"]

RUN_KEYS = "run_keys"  # the callers' runs (Airflow DAG runs) that opened or resumed the upgrade


def open_upgrade(
    config: RelayConfig,
    version: str,
    handoff: str = "latest",
    grace_s: float = 300.0,
    drain_timeout_s: float = 600.0,
    local: bool = False,
    progress: Progress = _noop,
    key: str | None = None,
    catchup_s: float = 120.0,
    max_lag: int | None = None,
    resources: dict | None = None,
) -> dict:
    """The upgrade to run: the one ``key`` already opened or resumed, the one in progress (same
    version), or a new one after the preflight. Returns the operation (its ``id`` drives the steps).
    ``resources``: green's own Spark resources (``relay scale``; then ``version`` may be blue's)."""
    validate_version(version)
    parse_handoff(handoff, config.topic)  # refuse a bad handoff before anything is read
    check_gates(grace_s, drain_timeout_s, catchup_s, max_lag)
    ledger = Ledger(config.ledger_url)
    if key:
        for op in ledger.operations(config.pipeline, "upgrade", 20):
            if key in op["data"].get(RUN_KEYS, []):
                progress(f"upgrade {op['id']} was opened by this run already (state {op['state']})")
                return op
    running = ledger.in_progress(config.pipeline, ALL_TERMINAL)
    if running and running[0]["kind"] == "upgrade":
        op = running[0]
        if op["params"]["version"] != version:
            raise OperationError(
                f"upgrade {op['id']} to {op['params']['version']} is in progress "
                f"(state {op['state']}): finish it before upgrading to {version}"
            )
        progress(f"resuming upgrade {op['id']} at state {op['state']}")
    else:
        gates = {
            "grace_s": grace_s,
            "drain_timeout_s": drain_timeout_s,
            "catchup_s": catchup_s,
            "max_lag": max_lag,
        }
        op = _preflight(config, ledger, version, handoff, gates, local, progress, resources)
    if key:
        keys = [*op["data"].get(RUN_KEYS, []), key]
        op = ledger.move_operation(op["id"], op["state"], **{RUN_KEYS: keys})
    return op


def _preflight(
    config: RelayConfig,
    ledger: Ledger,
    version: str,
    handoff: str,
    gates: dict,
    local: bool,
    progress: Progress,
    resources: dict | None = None,
) -> dict:
    stop_standbys(config, ledger, progress)  # green is the one instance that waits beside blue
    inv = take_inventory(config, ledger)
    blocked: list[str] = []
    blue = judge_blue(config, inv, local, version, blocked, [], resources)
    if blocked or blue is None:
        raise OperationError("; ".join(blocked) + ". Nothing was changed.")
    if not artifact(config, version).exists():
        progress(f"building artifact {version} from the current code")
        build_artifact(config, version)
    op = ledger.open_operation(
        config.pipeline,
        "upgrade",
        UpgradeState.PREFLIGHT.value,
        {"version": version, "handoff": handoff, **gates, "local": local, "resources": resources},
        {"blue_id": blue.id, "blue_version": blue.version, "started_at": time.time()},
        ALL_TERMINAL,
    )
    progress(f"upgrade {op['id']}: blue is instance {blue.id} ({blue.version}); target {version}")
    return op


def upgrade(
    config: RelayConfig,
    version: str,
    handoff: str = "latest",
    grace_s: float = 300.0,
    drain_timeout_s: float = 600.0,
    local: bool = False,
    progress: Progress = _noop,
    catchup_s: float = 120.0,
    max_lag: int | None = None,
    resources: dict | None = None,
) -> dict:
    """Run (or resume) the blue-green upgrade of the pipeline to ``version``: every step, waiting here.

    ``grace_s``: for green to report READY; ``catchup_s`` and ``max_lag``: the cutover gate (after
    the handoff green must commit and get its lag to at most ``max_lag`` records, default one batch);
    ``drain_timeout_s``: for blue to reach H."""
    op = open_upgrade(
        config,
        version,
        handoff,
        grace_s,
        drain_timeout_s,
        local,
        progress,
        catchup_s=catchup_s,
        max_lag=max_lag,
        resources=resources,
    )
    ledger = Ledger(config.ledger_url)
    op_id = op["id"]
    while op["state"] not in TERMINAL:
        state = UpgradeState(op["state"])
        if state in (UpgradeState.PREFLIGHT, UpgradeState.GREEN_WARMING):
            op = steps.start_green(config, ledger, op_id, progress)
            if op["state"] != UpgradeState.GREEN_WARMING.value:
                continue  # the launch failed: ABORTED
            ready = FirstCommitWait(config, ledger, op["data"]["green_id"], reached=FirstCommitWait.WARM)
            op = steps.green_ready(
                config, ledger, op_id, _wait_error(ready, steps.ready_left(op), "warm-up"), progress
            )
        elif state is UpgradeState.GREEN_READY:
            op = steps.hand_off(config, ledger, op_id, progress)
        elif state is UpgradeState.GREEN_STARTING:
            gate = CaughtUpWait(
                config, ledger, op["data"]["green_id"], steps.max_lag(config, op), op["data"]["handoff"]
            )
            error = _wait_error(gate, steps.catchup_left(op), "catch-up")
            op = steps.green_caught_up(config, ledger, op_id, error, gate.lag, progress)
        elif state is UpgradeState.DRAINING_BLUE:
            op = _drain(config, ledger, op_id, progress)
        elif state is UpgradeState.STOPPING_BLUE:
            op = steps.request_blue_stop(ledger, op_id)
            stopped = DriversStoppedWait(config, ledger, [op["data"]["blue_id"]])
            with contextlib.suppress(OperationError):  # not in time: blue_stopped fences and kills it
                wait_in_process(stopped, steps.BLUE_STOP_TIMEOUT_S, "blue's graceful stop")
            op = steps.blue_stopped(config, ledger, op_id, progress)
            if not local:
                only = OnlyAppsWait(config, steps.expected_apps(ledger, op))
                try:
                    wait_in_process(only, steps.VERIFY_TIMEOUT_S, "the single instance check")
                except OperationError:
                    raise OperationError(f"after the upgrade {only.mismatch()}") from None
            op = steps.finish(config, ledger, op_id, progress)
    return steps.result(ledger.operation(op_id))


def _wait_error(wait: FirstCommitWait | CaughtUpWait, timeout_s: float, what: str) -> str | None:
    """Wait here; None when the condition held, else why not (the driver's own error, or the gate)."""
    try:
        wait_in_process(wait, timeout_s, what)
    except WaitTimeout:
        return f"green {what}: {wait.shortfall()} after {timeout_s:.0f}s"
    except OperationError as exc:
        return str(exc)
    return None


def _drain(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress) -> dict:
    """Wait here until blue applied everything below H, or its drain timeout passes."""
    op = steps.begin_drain(ledger, op_id)
    blue = ledger.instance(op["data"]["blue_id"])
    drained = DrainedWait(ledger, blue.id)

    def check() -> dict | None:
        done = drained.check()
        if done is None and not driver_running(config, blue.submission_id):
            progress(f"blue's driver {blue.submission_id} is not running; its rest will be taken over")
        return done

    timed_out = poll(check, steps.drain_deadline(op) - time.time()) is None
    return steps.blue_drained(config, ledger, op_id, timed_out, progress)
