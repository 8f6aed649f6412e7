"""relay_recover's tasks: plan, (approve: the operator), open, stop and verify (deferred, relay_stop's
own tasks), execute, wait for the first commit, audit.

The recovery is opened in the ledger only by ``open_recovery``, after the approval: a rejected or dry
run changes nothing. The tasks after it find this run's recovery by the run's key, so each can be
cleared and rerun; the stop and its check act only while the recovery is RECOVERING (never on the
instance a recovery has already submitted).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException
from relay.config.inputs import recover_inputs
from relay.errors import ConfigError, OperationError
from relay.operations import recover_steps as steps
from relay.operations.recover_steps import RecoveryState
from relay.operations.waits import FIRST_COMMIT

from relay_airflow.assets import emit_pipeline_event
from relay_airflow.operators.ledger_wait import WaitFor
from relay_airflow.tasks import ledger_of, log, relay_config, run_key, upstream
from relay_airflow.tasks import stop as stops
from relay_airflow.triggers.ledger_wait import DONE

FIRST_COMMIT_WAIT_S = 300.0  # the new instance's first commit (as `relay recover --execute`)


def arguments(p: dict[str, Any]) -> dict[str, Any]:
    """The recovery's arguments, checked across params first: a bad combination fails the task with
    one line before the ledger or Kafka is touched (a per-param schema cannot express these rules)."""
    try:
        checked = recover_inputs(p["strategy"], p["time"], p["offsets"])
    except ConfigError as exc:
        raise AirflowFailException(f"relay_recover refused its params: {exc}") from None
    return {
        "strategy": checked.strategy,
        "timestamp_ms": checked.timestamp_ms,
        "offsets": checked.offsets,
        "reason": p["reason"],
        "allow_reprocess": p["allow_reprocess"],
    }


def plan() -> dict[str, Any]:
    """Always: the plan, printed as a table and returned as JSON; nothing changes."""
    from relay.operations.recover import plan_step

    context = get_current_context()
    p = context["params"]
    args = arguments(p)  # first: refuse before reading anything
    return plan_step(
        relay_config(context),
        args["strategy"],
        args["timestamp_ms"],
        args["offsets"],
        dry_run=p["dry_run"],
        allow_reprocess=args["allow_reprocess"],
        progress=log.info,
    )


def _this_run(context: Any) -> dict:
    config = relay_config(context)
    op = steps.find_recovery(ledger_of(config), config.pipeline, run_key(context))
    if op is None:
        raise AirflowFailException("this run opened no recovery: run (or clear) the execute task first")
    return op


def open_recovery() -> dict[str, Any]:
    """After the approval: open the recovery (RECOVERING: nothing changed yet), or resume this run's
    or an unfinished one the plan named."""
    context = get_current_context()
    config = relay_config(context)
    ledger = ledger_of(config)
    key = run_key(context)
    planned = upstream(context, "plan")
    op = steps.find_recovery(ledger, config.pipeline, key)
    if op is None and planned.get("resume_recovery_id") is not None:
        op = steps.add_run_key(ledger, ledger.operation(planned["resume_recovery_id"]), key)
        log.info("resuming recovery %s at state %s", op["id"], op["state"])
    if op is None:
        op = steps.open_recovery(config, planned["plan"], arguments(context["params"]), log.info, key)
    if op["state"] == RecoveryState.FAILED.value:
        raise AirflowFailException(f"recovery {op['id']} FAILED: {op.get('error')}")
    return _summary(config.pipeline, op)


def _past_the_stop(context: Any) -> dict[str, Any] | None:
    """This run's summary when its recovery is past RECOVERING (stopped and archived already:
    nothing to stop or check, and the new instance must not be stopped), else None."""
    op = _this_run(context)
    return None if op["state"] == RecoveryState.RECOVERING.value else _summary(op["pipeline"], op)


def stop_prepare(context: Any) -> WaitFor | dict[str, Any]:
    """relay_stop's graceful stop, deferred (no worker held while drivers finish their batch)."""
    return _past_the_stop(context) or stops.stop_prepare(context)


def verify_prepare(context: Any) -> WaitFor | dict[str, Any]:
    """relay_stop's check that the master runs nothing of the pipeline, deferred."""
    return _past_the_stop(context) or stops.verify_prepare(context)


def execute() -> dict[str, Any]:
    """Archive the checkpoints (after checking again that nothing runs), lease, submit."""
    context = get_current_context()
    config = relay_config(context)
    op = steps.execute_until_launched(config, ledger_of(config), _this_run(context)["id"], progress=log.info)
    return _summary(config.pipeline, op)


def _summary(pipeline: str, op: dict) -> dict[str, Any]:
    data = {k: v for k, v in op["data"].items() if k != "run_keys"}
    return {"pipeline": pipeline, "dry_run": False, "recovery_id": op["id"], "state": op["state"], **data}


def wait_prepare(context: Any) -> WaitFor | dict[str, Any]:
    op = _this_run(context)
    if op["state"] != RecoveryState.LEASED.value:
        return _summary(relay_config(context).pipeline, op)
    instance = op["data"]["instance_id"]
    return WaitFor(
        FIRST_COMMIT,
        {"instance_id": instance},
        FIRST_COMMIT_WAIT_S,
        relay_config(context).pipeline,
        note="new instance",
    )


def wait_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    """First commit: EXECUTED. No first commit: the recovery ends FAILED (a person looks)."""
    config = relay_config(context)
    error = None if event["status"] == DONE else event["error"]
    first_s = event["waited_s"] if error is None else None
    try:
        op = steps.committed(config, ledger_of(config), _this_run(context)["id"], error, log.info, first_s)
    except OperationError as exc:
        raise AirflowFailException(f"recovery FAILED: {exc}") from None
    return _summary(config.pipeline, op)


def audit() -> dict[str, Any]:
    """The audit after the recovery (declared gaps count as accounted for); emit the asset event."""
    from relay.audit import audit as run_audit

    context = get_current_context()
    config = relay_config(context)
    ledger = ledger_of(config)
    op = _this_run(context)
    if op["state"] != RecoveryState.EXECUTED.value:
        raise AirflowFailException(f"recovery {op['id']} is {op['state']}, not EXECUTED")
    report = run_audit(config, ledger)
    totals = report.to_json()["totals"]
    log.info("audit after recovery %s: ok=%s %s", op["id"], report.ok, totals)
    if not report.ok:
        raise AirflowFailException(f"the audit after recovery {op['id']} is not clean: {totals}")
    instance = ledger.instance(op["data"]["instance_id"])
    emit_pipeline_event(context, config, instance.version, instance.id, "recovery")
    return {**_summary(config.pipeline, op), "audit": totals}
