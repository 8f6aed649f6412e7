"""Recovery when Kafka retention deleted offsets a cursor points at: plan, then (on request) execute.

The seeds' advice was "delete the checkpoint", which loses the position and, silently, the data in
between. Here the plan says per partition what will be declared lost (retention took it) and what will
be skipped on purpose; executing records both as gaps, archives the old checkpoint (never deletes it)
and starts a fresh instance at the targets. Results accumulated in the ledger are untouched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum

from relay import checkpoint
from relay.config import RelayConfig
from relay.crashpoints import crash_point
from relay.errors import ConfigError, OperationError, OperationInProgressError
from relay.kafka_offsets import KafkaOffsets
from relay.launcher import app_name, wait_until_active
from relay.ledger import schema as s
from relay.ledger.models import Color, Instance
from relay.ledger.store import Ledger
from relay.operations.deploy import current_version, launch_or_fail
from relay.operations.inventory import take_inventory
from relay.operations.stop import stop
from relay.operations.upgrade import ALL_TERMINAL

Progress = Callable[[str], None]
STRATEGIES = ("earliest", "latest", "timestamp", "offsets")


def _noop(_: str) -> None:
    pass


@dataclass
class PartitionPlan:
    partition: int
    cursor: int | None
    earliest: int
    latest: int
    target: int
    lost: int  # records retention deleted before they were applied: declared lost
    skipped: int  # records still in Kafka that the strategy jumps over on purpose
    reprocess: int  # applied records that will be applied again (only with allow_reprocess)
    note: str = ""


@dataclass
class RecoveryPlan:
    pipeline: str
    topic: str
    strategy: str
    partitions: list[PartitionPlan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def total_lost(self) -> int:
        return sum(p.lost for p in self.partitions)

    @property
    def total_skipped(self) -> int:
        return sum(p.skipped for p in self.partitions)

    @property
    def total_reprocess(self) -> int:
        return sum(p.reprocess for p in self.partitions)

    def table(self) -> str:
        cols = ["partition", "cursor", "earliest", "latest", "target", "lost", "skipped", "reprocess", "note"]
        rows = [[str(getattr(p, c)) for c in cols] for p in self.partitions]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        lines.append(
            f"strategy {self.strategy}: {self.total_lost} record(s) declared lost, "
            f"{self.total_skipped} skipped on purpose, {self.total_reprocess} applied again"
        )
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(
            total_lost=self.total_lost, total_skipped=self.total_skipped, total_reprocess=self.total_reprocess
        )
        return data


def plan_recovery(
    config: RelayConfig,
    strategy: str,
    timestamp_ms: int | None = None,
    offsets: dict[int, int] | None = None,
    ledger: Ledger | None = None,
) -> RecoveryPlan:
    """Targets per partition. ``earliest`` resumes at the cursor, or at the earliest offset still
    available when retention took the cursor; ``latest`` jumps to the end; ``timestamp`` to the first
    offset at or after the time (the broker's own lookup); ``offsets`` to explicit offsets.
    Targets outside earliest..latest are clamped with a warning, as Kafka's reset tool does."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "timestamp" and timestamp_ms is None:
        raise ConfigError("strategy timestamp needs a time (timestamp_ms or an ISO time)")
    if strategy == "offsets" and not offsets:
        raise ConfigError('strategy offsets needs explicit offsets, e.g. {"0": 42, "1": 7}')
    ledger = ledger or Ledger(config.ledger_url)
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        earliest, latest = kafka.earliest(config.topic), kafka.latest(config.topic)
        by_time = kafka.offsets_for_time(config.topic, timestamp_ms) if strategy == "timestamp" else {}
    cursors: dict[int, list[int]] = {}
    for lease in ledger.pipeline_leases(config.pipeline):
        if lease.topic == config.topic and not lease.drained:
            cursors.setdefault(lease.partition, []).append(lease.next_offset)
    plan = RecoveryPlan(config.pipeline, config.topic, strategy)
    for p in sorted(latest):
        lo, hi = earliest.get(p, 0), latest[p]
        cur = min(cursors[p]) if p in cursors else None
        if len(cursors.get(p, [])) > 1:
            raise OperationError(
                f"partition {p} has {len(cursors[p])} unfinished leases (an interrupted "
                "upgrade): resume the upgrade or run relay deploy before a recovery"
            )
        base = cur if cur is not None else lo
        if strategy == "earliest":
            target = max(base, lo)
        elif strategy == "latest":
            target = hi
        elif strategy == "timestamp":
            found = by_time.get(p)
            target = hi if found is None else found
        else:
            if offsets is None:
                raise ConfigError("strategy offsets needs explicit offsets")
            target = offsets.get(p, max(base, lo))
        note = ""
        if target < lo or target > hi:
            clamped = min(max(target, lo), hi)
            plan.warnings.append(f"partition {p}: target {target} outside [{lo}, {hi}], clamped to {clamped}")
            target, note = clamped, "clamped"
        lost = max(0, min(lo, target) - base) if cur is not None else 0
        skipped = max(0, target - max(base, lo)) if cur is not None else 0
        reprocess = max(0, base - target) if cur is not None else 0
        if cur is not None and cur < lo:
            note = (note + " invalidated").strip()
        plan.partitions.append(PartitionPlan(p, cur, lo, hi, target, lost, skipped, reprocess, note))
    return plan


class RecoveryState(str, Enum):
    RECOVERING = "RECOVERING"  # opened: nothing changed yet
    ARCHIVED = "ARCHIVED"  # the pipeline is stopped (verified) and its checkpoints archived
    LEASED = "LEASED"  # gaps, the new instance and its leases committed
    EXECUTED = "EXECUTED"
    FAILED = "FAILED"


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
        progress(f"resuming recovery {op['id']} at state {op['state']}")
        return _execute(config, ledger, op, local, wait_s, progress)
    plan = plan_recovery(config, strategy, timestamp_ms, offsets, ledger)
    progress("recovery plan:\n" + plan.table())
    result = {"pipeline": config.pipeline, "dry_run": dry_run, "plan": plan.to_json()}
    if plan.total_reprocess and not allow_reprocess:
        raise OperationError(
            f"the plan moves cursors backwards over {plan.total_reprocess} applied record(s); "
            "set allow_reprocess to apply them again (the sink must be idempotent)"
        )
    if dry_run:
        progress("dry run: nothing was changed")
        return result
    op = ledger.open_operation(
        config.pipeline,
        "recovery",
        RecoveryState.RECOVERING.value,
        {
            "strategy": strategy,
            "timestamp_ms": timestamp_ms,
            "offsets": offsets,
            "reason": reason,
            "allow_reprocess": allow_reprocess,
            "version": version or current_version(ledger, config.pipeline),
        },
        {"plan": plan.to_json(), "started_at": time.time()},
        ALL_TERMINAL,
    )
    crash_point("recovery.opened")
    return _execute(config, ledger, op, local, wait_s, progress)


def _execute(
    config: RelayConfig, ledger: Ledger, op: dict, local: bool, wait_s: float, progress: Progress
) -> dict:
    """Drive the persisted steps; each step's work and its state move are one transaction or idempotent."""
    try:
        while op["state"] not in (RecoveryState.EXECUTED.value, RecoveryState.FAILED.value):
            state = RecoveryState(op["state"])
            if state is RecoveryState.RECOVERING:
                op = _stop_and_archive(config, ledger, op, local, progress)
                crash_point("recovery.stopped")
            elif state is RecoveryState.ARCHIVED:
                op = _open_new_instance(config, ledger, op)
                crash_point("recovery.leased")
            else:
                inst = ledger.instance(op["data"]["instance_id"])
                if inst.submission_id is None:
                    launch_or_fail(config, ledger, inst, local=local)
                    crash_point("recovery.submitted")
                first = wait_until_active(config, ledger, inst.id, wait_s, progress)
                op = ledger.move_operation(
                    op["id"],
                    RecoveryState.EXECUTED.value,
                    first_commit_s=round(first.seconds, 2),
                    total_s=round(time.time() - op["data"]["started_at"], 2),
                )
                progress(f"recovered: instance {inst.id} committed after {first.seconds:.1f}s")
    except Exception as exc:
        ledger.move_operation(op["id"], RecoveryState.FAILED.value, error=f"{type(exc).__name__}: {exc}")
        raise
    result = {
        "pipeline": config.pipeline,
        "dry_run": False,
        "recovery_id": op["id"],
        "state": op["state"],
        **op["data"],
    }
    ledger.save_report(config.pipeline, "recovery", op["state"], json.loads(json.dumps(result, default=str)))
    return result


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
        return ledger.move_operation(op["id"], RecoveryState.LEASED.value, conn=conn, instance_id=inst.id)
