"""Recovery when Kafka retention deleted offsets a cursor points at: plan, then (on request) execute.

The seeds' advice was "delete the checkpoint", which loses the position and, silently, the data in
between. Here the plan says per partition what will be declared lost (retention took it) and what will
be skipped on purpose; executing records both as gaps, archives the old checkpoint (never deletes it)
and starts a fresh instance at the targets. Results accumulated in the ledger are untouched.
The plan lives in ``recover_plan``, the persisted steps in ``recover_steps`` (Airflow runs them as
tasks, with a person's approval between plan and execution); :func:`recover` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.config import RelayConfig
from relay.errors import OperationError, OperationInProgressError
from relay.ledger.store import Ledger
from relay.operations import recover_steps as steps
from relay.operations.recover_plan import STRATEGIES, PartitionPlan, RecoveryPlan, plan_recovery
from relay.operations.recover_steps import RecoveryState, _open_new_instance
from relay.operations.upgrade_steps import ALL_TERMINAL
from relay.spark.first_commit import wait_until_active

__all__ = [
    "STRATEGIES",
    "PartitionPlan",
    "RecoveryPlan",
    "RecoveryState",
    "_open_new_instance",
    "plan_recovery",
    "plan_step",
    "recover",
]

Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def plan_step(
    config: RelayConfig,
    strategy: str = "earliest",
    timestamp_ms: int | None = None,
    offsets: dict[int, int] | None = None,
    dry_run: bool = True,
    allow_reprocess: bool = False,
    progress: Progress = _noop,
) -> dict:
    """The plan, printed; changes nothing. Refused while an upgrade runs, or when it would apply
    records again without ``allow_reprocess``. A recovery already in progress is what executing will
    resume: then its recorded plan is returned, with ``resume_recovery_id``."""
    ledger = Ledger(config.ledger_url)
    running = ledger.in_progress(config.pipeline, ALL_TERMINAL)
    if running and running[0]["kind"] == "upgrade":
        raise OperationInProgressError(
            f"upgrade {running[0]['id']} of {config.pipeline} is in progress "
            f"(state {running[0]['state']}): a recovery is refused until it ends",
            running[0],
        )
    if running and not dry_run:
        op = running[0]
        progress(f"recovery {op['id']} is in progress (state {op['state']}): executing resumes it")
        return {
            "pipeline": config.pipeline,
            "dry_run": False,
            "plan": op["data"]["plan"],
            "resume_recovery_id": op["id"],
        }
    plan = plan_recovery(config, strategy, timestamp_ms, offsets, ledger)
    progress("recovery plan:\n" + plan.table())
    if plan.total_reprocess and not allow_reprocess:
        raise OperationError(
            f"the plan moves cursors backwards over {plan.total_reprocess} applied record(s); "
            "set allow_reprocess to apply them again (the sink must be idempotent)"
        )
    if dry_run:
        progress("dry run: nothing was changed")
    return {"pipeline": config.pipeline, "dry_run": dry_run, "plan": plan.to_json()}


def recover(
    config: RelayConfig,
    strategy: str = "earliest",
    timestamp_ms: int | None = None,
    offsets: dict[int, int] | None = None,
    dry_run: bool = True,
    reason: str = "",
    allow_reprocess: bool = False,
    local: bool = False,
    wait_s: float = 300.0,
    version: str | None = None,
    progress: Progress = _noop,
) -> dict:
    """Plan (always) and, unless ``dry_run``, execute the recovery.

    A recovery that died half-way is resumed by executing again: it goes on from its persisted state
    with the plan it recorded (the arguments of the new call are not used for it).
    """
    planned = plan_step(config, strategy, timestamp_ms, offsets, dry_run, allow_reprocess, progress)
    if dry_run:
        return planned
    ledger = Ledger(config.ledger_url)
    if "resume_recovery_id" in planned:
        op = ledger.operation(planned["resume_recovery_id"])
        progress(f"resuming recovery {op['id']} at state {op['state']}")
    else:
        params = {
            "strategy": strategy,
            "timestamp_ms": timestamp_ms,
            "offsets": offsets,
            "reason": reason,
            "allow_reprocess": allow_reprocess,
            "version": version,
        }
        op = steps.open_recovery(config, planned["plan"], params, progress)
    op = steps.execute_until_launched(config, ledger, op["id"], local, progress)
    if op["state"] == RecoveryState.LEASED.value:
        with steps.failing(ledger, op["id"]):
            first = wait_until_active(config, ledger, op["data"]["instance_id"], wait_s, progress)
        op = steps.committed(config, ledger, op["id"], None, progress, first.seconds)
    return steps.result(config, ledger.operation(op["id"]))
