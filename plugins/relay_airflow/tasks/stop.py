"""relay_stop's tasks: ask every live instance to stop, wait (deferred), settle; verify none runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import AirflowFailException
from relay.operations.stop import request_stops, settle_instance_stop, verify_stopped
from relay.operations.upgrade_steps import VERIFY_TIMEOUT_S
from relay.operations.waits import DRIVERS_STOPPED, ONLY_APPS, OnlyAppsWait

from relay_airflow.operators.ledger_wait import WaitFor
from relay_airflow.tasks import ledger_of, log, relay_config, upstream
from relay_airflow.triggers.ledger_wait import DONE, FAILED

STOP_TIMEOUT_S = 120.0  # a DAG without a timeout_seconds param (relay_recover): `relay stop`'s default


def stop_prepare(context: Any) -> WaitFor | dict[str, Any]:
    """Request the graceful stops; nothing live = nothing to wait for (a rerun after a stop)."""
    config = relay_config(context)
    timeout_s = float(context["params"].get("timeout_seconds", STOP_TIMEOUT_S))
    requested_at = time.time()
    ids = request_stops(config, ledger_of(config), log.info)
    if not ids:
        log.info("nothing of %s is live: nothing to stop", config.pipeline)
        return {"pipeline": config.pipeline, "stopped": []}
    args = {"instance_ids": ids, "requested_at": requested_at, "timeout_s": timeout_s}
    return WaitFor(DRIVERS_STOPPED, args, timeout_s, config.pipeline, note="graceful stop between batches")


def stop_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    """Settle each instance: a driver still running after the wait is fenced and killed."""
    if event["status"] == FAILED:
        raise AirflowFailException(f"the stop could not be checked: {event['error']}")
    config = relay_config(context)
    ledger = ledger_of(config)
    args = event["args"]
    stopped = [
        settle_instance_stop(config, ledger, i, args["timeout_s"], args["requested_at"], log.info)
        for i in args["instance_ids"]
    ]
    return {"pipeline": config.pipeline, "stopped": stopped}


def verify_prepare(context: Any) -> WaitFor:
    config = relay_config(context)
    return WaitFor(ONLY_APPS, {"names": []}, VERIFY_TIMEOUT_S, config.pipeline, note="no application left")


def verify_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    config = relay_config(context)
    if event["status"] != DONE:
        raise AirflowFailException(f"still running: {OnlyAppsWait(config, []).mismatch()}")
    stopped = (upstream(context, "stop") or {}).get("stopped", [])
    return {**verify_stopped(config, ledger_of(config)), "stopped": stopped}


def stop_and_verify(
    prepare_stop: Callable[[Any], Any] = stop_prepare, prepare_verify: Callable[[Any], Any] = verify_prepare
) -> tuple[Any, Any]:
    """The deferred ``stop`` and ``verify_none_runs`` tasks (relay_stop's; relay_recover's with its
    own prepares, which skip them once the recovery is past its stop), in the current DAG."""
    from datetime import timedelta

    from relay_airflow.operators.ledger_wait import LedgerWaitOperator

    stop = LedgerWaitOperator(
        task_id="stop", prepare=prepare_stop, complete=stop_complete, execution_timeout=timedelta(minutes=20)
    )
    verify = LedgerWaitOperator(
        task_id="verify_none_runs",
        prepare=prepare_verify,
        complete=verify_complete,
        execution_timeout=timedelta(minutes=10),
    )
    return stop, verify
