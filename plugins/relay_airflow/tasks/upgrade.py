"""relay_upgrade's tasks, one per persisted step of ``relay.operations.upgrade_steps``.

Each task reads the upgrade's id from ``plan``'s XCom and runs its step; a step whose state has moved
on does nothing, so any task can be cleared and rerun. An upgrade that ends ABORTED or FAILED fails
the task that saw it (no retry: the error says what happened) and the rest of the run.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException
from relay.operations import upgrade_steps as steps
from relay.operations.upgrade_steps import UpgradeState
from relay.operations.waits import CAUGHT_UP, DRAINED, DRIVERS_STOPPED, ONLY_APPS, READY, OnlyAppsWait

from relay_airflow.assets import emit_pipeline_event
from relay_airflow.operators.ledger_wait import WaitFor
from relay_airflow.tasks import ledger_of, log, relay_config, run_key, upstream
from relay_airflow.triggers.ledger_wait import DONE, FAILED, TIMEOUT


def _op_id(context: Any) -> int:
    return int(upstream(context, "plan")["upgrade_id"])


def _going(op: dict) -> dict:
    """The operation, unless it ended ABORTED/FAILED: then the task (and the run) fails with why."""
    if op["state"] in (UpgradeState.ABORTED.value, UpgradeState.FAILED.value):
        raise AirflowFailException(f"upgrade {op['id']} ended {op['state']}: {op.get('error')}")
    return op


def _summary(op: dict) -> dict[str, Any]:
    return {
        "upgrade_id": op["id"],
        "state": op["state"],
        **{k: v for k, v in op["data"].items() if k != "run_keys"},
    }


def plan() -> dict[str, Any]:
    """Preflight and open the upgrade, or resume the one in progress for this version."""
    from relay.operations.upgrade import open_upgrade

    context = get_current_context()
    p = context["params"]
    config = relay_config(context)
    resources = None
    if p.get("executors"):  # a scale: green with other resources (relay.operations.scale)
        from relay.operations.scale import scale_target

        resources = scale_target(config, int(p["executors"]))[2]
    op = open_upgrade(
        config,
        p["version"],
        handoff=p["handoff"],
        grace_s=float(p["grace_seconds"]),
        drain_timeout_s=float(p["drain_timeout_seconds"]),
        progress=log.info,
        key=run_key(context),
        catchup_s=float(p.get("catchup_seconds", 120)),
        max_lag=p.get("max_lag"),
        resources=resources,
    )
    return _summary(_going(op))


def start_green() -> dict[str, Any]:
    """Green as a warm standby: created without leases and submitted; blue runs on uncapped."""
    context = get_current_context()
    config = relay_config(context)
    return _summary(_going(steps.start_green(config, ledger_of(config), _op_id(context), log.info)))


def wait_ready_prepare(context: Any) -> WaitFor | dict[str, Any]:
    config = relay_config(context)
    op = _going(ledger_of(config).operation(_op_id(context)))
    if op["state"] != UpgradeState.GREEN_WARMING.value:
        return _summary(op)
    left = steps.ready_left(op)
    green = op["data"]["green_id"]
    note = f"green READY, {left:.0f}s left"
    return WaitFor(READY, {"instance_id": green}, left, config.pipeline, note=note)


def wait_ready_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    """Green READY: the handoff may run. Green failing (or the grace passing) first: ABORTED."""
    config = relay_config(context)
    error = None if event["status"] == DONE else event["error"]
    return _summary(_going(steps.green_ready(config, ledger_of(config), _op_id(context), error, log.info)))


def handoff() -> dict[str, Any]:
    """H is read now, with green READY: blue closes at H, green opens at H (one transaction)."""
    context = get_current_context()
    config = relay_config(context)
    return _summary(_going(steps.hand_off(config, ledger_of(config), _op_id(context), log.info)))


def wait_caught_up_prepare(context: Any) -> WaitFor | dict[str, Any]:
    config = relay_config(context)
    op = _going(ledger_of(config).operation(_op_id(context)))
    if op["state"] != UpgradeState.GREEN_STARTING.value:
        return _summary(op)
    left = steps.catchup_left(op)
    args = {
        "instance_id": op["data"]["green_id"],
        "max_lag": steps.max_lag(config, op),
        "handoff": op["data"]["handoff"],
    }
    return WaitFor(CAUGHT_UP, args, left, config.pipeline, note=f"green's lag <= {args['max_lag']}")


def wait_caught_up_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    """The cutover gate passed: blue drains. Failed (green dead, or too slow in time): ABORTED, and
    blue takes back everything green did not apply."""
    config = relay_config(context)
    done = event["status"] == DONE
    error, lag = (None, event["result"].get("lag")) if done else (event["error"], None)
    return _summary(
        _going(steps.green_caught_up(config, ledger_of(config), _op_id(context), error, lag, log.info))
    )


def drain_prepare(context: Any) -> WaitFor | dict[str, Any]:
    config = relay_config(context)
    op = _going(steps.begin_drain(ledger_of(config), _op_id(context)))
    if op["state"] != UpgradeState.DRAINING_BLUE.value:
        return _summary(op)
    left = max(steps.drain_deadline(op) - time.time(), 1.0)
    blue = op["data"]["blue_id"]
    return WaitFor(
        DRAINED, {"instance_id": blue}, left, config.pipeline, note=f"blue up to {op['data']['handoff']}"
    )


def drain_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    if event["status"] == FAILED:
        raise AirflowFailException(f"the drain could not be checked: {event['error']}")
    config = relay_config(context)
    timed_out = event["status"] == TIMEOUT
    return _summary(
        _going(steps.blue_drained(config, ledger_of(config), _op_id(context), timed_out, log.info))
    )


def stop_blue_prepare(context: Any) -> WaitFor | dict[str, Any]:
    config = relay_config(context)
    op = _going(steps.request_blue_stop(ledger_of(config), _op_id(context)))
    if op["state"] != UpgradeState.STOPPING_BLUE.value:
        return _summary(op)
    blue = op["data"]["blue_id"]
    return WaitFor(
        DRIVERS_STOPPED,
        {"instance_ids": [blue]},
        steps.BLUE_STOP_TIMEOUT_S,
        config.pipeline,
        note="blue stops",
    )


def stop_blue_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    """Blue stopped between batches, or it is fenced and killed now."""
    if event["status"] == FAILED:
        raise AirflowFailException(f"blue's stop could not be checked: {event['error']}")
    config = relay_config(context)
    return _summary(_going(steps.blue_stopped(config, ledger_of(config), _op_id(context), log.info)))


def verify_prepare(context: Any) -> WaitFor:
    config = relay_config(context)
    ledger = ledger_of(config)
    op = _going(ledger.operation(_op_id(context)))
    names = steps.expected_apps(ledger, op)
    return WaitFor(ONLY_APPS, {"names": names}, steps.VERIFY_TIMEOUT_S, config.pipeline, note=f"only {names}")


def verify_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    config = relay_config(context)
    if event["status"] != DONE:
        raise AirflowFailException(
            f"after the upgrade {OnlyAppsWait(config, event['args']['names']).mismatch()}"
        )
    return event["result"]


def audit() -> dict[str, Any]:
    """Audit the upgrade's window, DONE; emit "the pipeline runs the new version" as an asset event."""
    context = get_current_context()
    config = relay_config(context)
    op = _going(steps.finish(config, ledger_of(config), _op_id(context), log.info))
    if op["state"] != UpgradeState.DONE.value:
        raise AirflowFailException(f"upgrade {op['id']} is {op['state']}, not DONE: run the earlier tasks")
    result = steps.result(op)
    log.info("upgrade %s DONE: duplicates %s, gaps %s", op["id"], result["duplicates"], result["gaps"])
    emit_pipeline_event(context, config, op["params"]["version"], result["green_id"], "upgrade")
    return {k: v for k, v in result.items() if k != "run_keys"}
