"""The persisted steps of an executed recovery, one function each, in the order they run.

RECOVERING (opened, nothing changed) -> ARCHIVED (stopped, verified, checkpoints archived) -> LEASED
(gaps, new instance, leases) -> EXECUTED (its first commit). Each step acts only in its own state, so
it can be run again after a crash or by a cleared Airflow task; :func:`relay.operations.recover.recover`
is these steps in a loop, waiting for the first commit in-process. Any error ends the recovery FAILED.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from enum import Enum

from sqlalchemy import delete

from relay.config import RelayConfig
from relay.crashpoints import crash_point
from relay.errors import OperationError
from relay.ledger import schema as s
from relay.ledger.models import Color, Instance
from relay.ledger.store import Ledger
from relay.operations.deploy import current_version, launch_or_fail
from relay.operations.inventory import take_inventory
from relay.operations.recover_plan import plan_recovery
from relay.operations.stop import stop
from relay.operations.upgrade_steps import ALL_TERMINAL
from relay.protocol import checkpoint
from relay.spark.launcher import app_name

Progress = Callable[[str], None]
RUN_KEYS = "run_keys"  # the callers' runs (Airflow DAG runs) that opened or resumed the recovery


def _noop(_: str) -> None:
    pass


class RecoveryState(str, Enum):
    RECOVERING = "RECOVERING"  # opened: nothing changed yet
    ARCHIVED = "ARCHIVED"  # the pipeline is stopped (verified) and its checkpoints archived
    LEASED = "LEASED"  # gaps, the new instance and its leases committed
    EXECUTED = "EXECUTED"
    FAILED = "FAILED"


def result(config: RelayConfig, op: dict) -> dict:
    return {
        "pipeline": config.pipeline,
        "dry_run": False,
        "recovery_id": op["id"],
        "state": op["state"],
        **op["data"],
    }


def find_recovery(ledger: Ledger, pipeline: str, key: str) -> dict | None:
    """The recovery a run with this key opened or resumed (any state), or None."""
    for op in ledger.operations(pipeline, "recovery", 20):
        if key in op["data"].get(RUN_KEYS, []):
            return op
    return None


def open_recovery(
    config: RelayConfig,
    plan: dict,
    params: dict,
    progress: Progress = _noop,
    key: str | None = None,
) -> dict:
    """Persist the recovery of an approved ``plan`` at RECOVERING (nothing changed yet).

    Refused when retention took more since the plan was made: a person approved declaring the
    plan's records lost, not more. ``params``: strategy, timestamp_ms, offsets, reason,
    allow_reprocess, version (None: the version the pipeline ran last).
    """
    ledger = Ledger(config.ledger_url)
    now = plan_recovery(config, params["strategy"], params["timestamp_ms"], params["offsets"], ledger)
    approved = {p["partition"]: p["lost"] for p in plan["partitions"]}
    more = [p for p in now.partitions if p.lost > approved.get(p.partition, 0)]
    if more:
        raise OperationError(
            "retention deleted more since the plan was made: "
            + ", ".join(
                f"partition {p.partition} would lose {p.lost}, approved {approved.get(p.partition, 0)}"
                for p in more
            )
            + ". Nothing was changed: plan (and approve) again."
        )
    op = ledger.open_operation(
        config.pipeline,
        "recovery",
        RecoveryState.RECOVERING.value,
        {**params, "version": params.get("version") or current_version(ledger, config.pipeline)},
        {"plan": plan, "started_at": time.time(), **({RUN_KEYS: [key]} if key else {})},
        ALL_TERMINAL,
    )
    crash_point("recovery.opened")
    progress(f"recovery {op['id']} opened ({params['strategy']})")
    return op


def add_run_key(ledger: Ledger, op: dict, key: str | None) -> dict:
    """Remember that the run ``key`` resumed this recovery (a rerun of its task finds it)."""
    if not key or key in op["data"].get(RUN_KEYS, []):
        return op
    return ledger.move_operation(op["id"], op["state"], **{RUN_KEYS: [*op["data"].get(RUN_KEYS, []), key]})


def execute_until_launched(
    config: RelayConfig, ledger: Ledger, op_id: int, local: bool = False, progress: Progress = _noop
) -> dict:
    """Stop and archive, lease, submit: every step up to the first-commit wait (those not done yet)."""
    op = ledger.operation(op_id)
    with failing(ledger, op_id):
        if op["state"] == RecoveryState.RECOVERING.value:
            op = _stop_and_archive(config, ledger, op, local, progress)
            crash_point("recovery.stopped")
        if op["state"] == RecoveryState.ARCHIVED.value:
            op = _open_new_instance(config, ledger, op)
            crash_point("recovery.leased")
        if op["state"] == RecoveryState.LEASED.value:
            inst = ledger.instance(op["data"]["instance_id"])
            if inst.submission_id is None:
                launch_or_fail(config, ledger, inst, local=local)
                op = ledger.move_operation(op_id, op["state"], launched_at=time.time())
                crash_point("recovery.submitted")
                progress(f"instance {inst.id} submitted; waiting for its first commit")
    return op


def committed(
    config: RelayConfig,
    ledger: Ledger,
    op_id: int,
    error: str | None,
    progress: Progress = _noop,
    first_commit_s: float | None = None,
) -> dict:
    """After the wait: LEASED -> EXECUTED (report saved), or FAILED with ``error`` (raised)."""
    op = ledger.operation(op_id)
    if op["state"] != RecoveryState.LEASED.value:
        return op
    if error is not None:
        ledger.move_operation(op_id, RecoveryState.FAILED.value, error=f"OperationError: {error}")
        raise OperationError(error)
    if first_commit_s is None:  # measured by the caller's wait, else from the submission
        first_commit_s = time.time() - float(op["data"].get("launched_at", op["data"]["started_at"]))
    first_s = first_commit_s
    op = ledger.move_operation(
        op_id,
        RecoveryState.EXECUTED.value,
        first_commit_s=round(first_s, 2),
        total_s=round(time.time() - op["data"]["started_at"], 2),
    )
    progress(f"recovered: instance {op['data']['instance_id']} committed after {first_s:.1f}s")
    out = result(config, op)
    ledger.save_report(config.pipeline, "recovery", op["state"], json.loads(json.dumps(out, default=str)))
    return op


@contextlib.contextmanager
def failing(ledger: Ledger, op_id: int) -> Iterator[None]:
    """Any error inside ends the recovery FAILED (then propagates): a person looks before a retry."""
    try:
        yield
    except Exception as exc:
        ledger.move_operation(op_id, RecoveryState.FAILED.value, error=f"{type(exc).__name__}: {exc}")
        raise


def _stop_and_archive(config: RelayConfig, ledger: Ledger, op: dict, local: bool, progress: Progress) -> dict:
    """Step 1: stop whatever runs and verify that nothing does; archive checkpoints (never delete)."""
    stop(config, local=local, progress=progress)
    inv = take_inventory(config, ledger)
    if inv.live or inv.apps:
        raise OperationError(f"still running after stop: {inv.describe()}")
    archived = list(op["data"].get("archived_checkpoints", []))
    for inst in ledger.instances(config.pipeline):
        moved = checkpoint.archive(inst.checkpoint_dir) if inst.checkpoint_dir else None
        if moved:
            archived.append(str(moved))
    return ledger.move_operation(op["id"], RecoveryState.ARCHIVED.value, archived_checkpoints=archived)


def _open_new_instance(config: RelayConfig, ledger: Ledger, op: dict) -> dict:
    """Step 2, one transaction: old leases closed at their cursors, gaps, new instance at the targets.

    The gaps start at the cursors read HERE, with nothing running, not at the plan's: the plan was
    made while the old instance could still commit, and a gap over applied offsets would declare
    applied records lost (the protocol model's STALE_RECOVERY_PLAN). For the same reason strategy
    ``earliest`` resumes at the current cursor when the old instance moved past the planned target;
    an explicit target below it is refused by the overlap check unless ``allow_reprocess``.
    """
    params, plan = op["params"], op["data"]["plan"]
    why = params["reason"] or f"recovery with strategy {params['strategy']}"
    previous = ledger.instances(config.pipeline)
    with ledger.tx() as conn:
        cursors: dict[int, int] = {}
        for lease in ledger.pipeline_leases(config.pipeline, conn):
            if lease.topic == config.topic and not lease.drained:
                p = lease.partition
                cursors[p] = min(cursors.get(p, lease.next_offset), lease.next_offset)
                conn.execute(
                    s.leases.update()
                    .where(s.leases.c.id == lease.id)
                    .values(end_offset=lease.next_offset, closed_at=time.time())
                )
        targets: dict[int, int] = {}
        for pp in plan["partitions"]:
            partition, target, cursor = pp["partition"], pp["target"], cursors.get(pp["partition"])
            if cursor is not None and params["strategy"] == "earliest":
                target = max(target, cursor)
            targets[partition] = target
            if cursor is None or target <= cursor:
                continue
            lost_end = max(cursor, min(pp["earliest"], target))
            gap = (config.pipeline, config.topic, partition)
            ledger.record_gap(
                conn, *gap, cursor, lost_end, "lost", f"{why}: deleted by retention before it was applied"
            )
            ledger.record_gap(conn, *gap, lost_end, target, "skipped", f"{why}: skipped on purpose")
        inst: Instance = ledger.create_instance(
            conn,
            config.pipeline,
            params["version"],
            previous[-1].color if previous else Color.BLUE,
            "",
            "",
        )
        ledger.set_instance(
            inst.id,
            conn,
            checkpoint_dir=str(config.checkpoints_dir / f"instance-{inst.id}"),
            app_name=app_name(config.pipeline, inst.id),
        )
        for partition, target in sorted(targets.items()):
            ledger.open_lease(
                conn, inst, config.topic, partition, target, allow_overlap=params["allow_reprocess"]
            )
        # The new cursors are set on what the topic holds now: the marks of the old ones go
        # (relay.kafka.identity; a re-created topic would otherwise refuse the new instance).
        conn.execute(delete(s.partition_marks).where(s.partition_marks.c.pipeline == config.pipeline))
        return ledger.move_operation(op["id"], RecoveryState.LEASED.value, conn=conn, instance_id=inst.id)
