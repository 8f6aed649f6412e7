"""The persisted steps of a blue-green upgrade, one function each, in the order they run.

Each step reads the operation's state from the ledger and acts only in its own state: a step that
finds its work done (the state moved on) returns the operation as it is. So a step can be run again
after a crash or by a cleared Airflow task, and :func:`relay.operations.upgrade.upgrade` (the CLI)
is these steps in a loop. Waits (green's first commit, blue's drain, blue's stop) are not steps: the
caller waits in between, in-process or in an Airflow trigger, with the checks of ``waits``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from enum import Enum

from relay.audit import AuditReport, audit
from relay.config import RelayConfig
from relay.crashpoints import crash_point
from relay.errors import ConfigError, KafkaError, OperationError
from relay.kafka_offsets import KafkaOffsets
from relay.launcher import app_name, kill
from relay.ledger import schema as s
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import launch_or_fail
from relay.operations.stop import settle_instance_stop

Progress = Callable[[str], None]
BLUE_STOP_TIMEOUT_S = 120.0  # graceful-stop wait for blue (the CLI's stop_instance default)
VERIFY_TIMEOUT_S = 60.0  # how long the master may take to drop blue's application


class UpgradeState(str, Enum):
    PREFLIGHT = "PREFLIGHT"
    GREEN_STARTING = "GREEN_STARTING"
    DRAINING_BLUE = "DRAINING_BLUE"
    STOPPING_BLUE = "STOPPING_BLUE"
    DONE = "DONE"
    ABORTED = "ABORTED"
    FAILED = "FAILED"


TERMINAL = (UpgradeState.DONE.value, UpgradeState.ABORTED.value, UpgradeState.FAILED.value)
# Recoveries share the operations table: both kinds' terminal states end an operation.
ALL_TERMINAL = TERMINAL + ("EXECUTED", "PLANNED", "REFUSED")


def _noop(_: str) -> None:
    pass


def parse_handoff(handoff: str, topic: str) -> dict[int, int] | None:
    """``latest`` -> None (read at handoff time); else Spark-style JSON {"topic": {"0": 42}}."""
    if handoff == "latest":
        return None
    try:
        data = json.loads(handoff)
        return {int(p): int(o) for p, o in data[topic].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f'handoff must be "latest" or JSON like {{"{topic}": {{"0": 42}}}}, got {handoff!r}'
        ) from exc


def result(op: dict) -> dict:
    """What the upgrade returns (and an Airflow task pushes): state, error, figures, history."""
    return {
        "upgrade_id": op["id"],
        "state": op["state"],
        "error": op.get("error"),
        **op["data"],
        "history": op["history"],
    }


def _ended(config: RelayConfig, ledger: Ledger, op: dict) -> dict:
    """Persist the report of an upgrade that just reached a terminal state; its result."""
    out = result(op)
    ledger.save_report(config.pipeline, "upgrade", op["state"], json.loads(json.dumps(out, default=str)))
    return out


def _in(ledger: Ledger, op_id: int, state: UpgradeState) -> dict | None:
    op = ledger.operation(op_id)
    return op if op["state"] == state.value else None


# ------------------------------------------------------------------------------- 1. handoff
def hand_off(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = _noop) -> dict:
    """PREFLIGHT -> GREEN_STARTING, one transaction: blue's leases close at H, green's open at H."""
    op = _in(ledger, op_id, UpgradeState.PREFLIGHT)
    if op is None:
        return ledger.operation(op_id)
    crash_point("upgrade.opened")
    explicit = parse_handoff(op["params"]["handoff"], config.topic)
    blue = ledger.instance(op["data"]["blue_id"])
    green = _handoff(config, ledger, op_id, blue, op["params"]["version"], explicit)
    crash_point("upgrade.handed_off")
    op = ledger.operation(op_id)
    progress(f"handoff: blue closes at {op['data']['handoff']}; green is instance {green.id}")
    return op


def _handoff(
    config: RelayConfig,
    ledger: Ledger,
    op_id: int,
    blue: Instance,
    version: str,
    explicit: dict[int, int] | None,
) -> Instance:
    """One transaction: close blue's open leases at H, create green with leases [H, ...)."""
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        latest = kafka.latest(config.topic)
    with ledger.tx() as conn:
        # Lock blue's row first: blue's commits lock it too, so no cursor moves while H is chosen.
        blue = ledger.instance(blue.id, conn, lock=True)
        if blue.state is not InstanceState.ACTIVE:
            raise OperationError(f"blue (instance {blue.id}) is {blue.state.value}, not ACTIVE: no handoff")
        open_leases = [lease for lease in ledger.leases(blue.id, conn) if lease.end_offset is None]
        blue_cursors = {str(lease.partition): lease.next_offset for lease in open_leases}
        h: dict[int, int] = {}
        for lease in open_leases:
            target = (explicit or latest).get(lease.partition, latest.get(lease.partition, lease.next_offset))
            if target < lease.next_offset:
                raise ConfigError(
                    f"handoff offset {target} of {lease.topic}[{lease.partition}] is below blue's "
                    f"cursor {lease.next_offset}: those offsets are already applied"
                )
            h[lease.partition] = target
            ledger.close_lease(conn, lease, target)
        green = ledger.create_instance(conn, config.pipeline, version, blue.color.other, "", "")
        ledger.set_instance(
            green.id,
            conn,
            checkpoint_dir=str(config.checkpoints_dir / f"instance-{green.id}"),
            app_name=app_name(config.pipeline, green.id),
        )
        for partition, offset in sorted(h.items()):
            ledger.open_lease(conn, green, config.topic, partition, offset)
        ledger.set_instance(blue.id, conn, state=InstanceState.DRAINING)
        green = ledger.instance(green.id, conn)
        # Same transaction: a crash can't leave the handoff done and the state at PREFLIGHT.
        ledger.move_operation(
            op_id,
            UpgradeState.GREEN_STARTING.value,
            conn=conn,
            green_id=green.id,
            blue_cursors=blue_cursors,
            handoff={str(p): o for p, o in h.items()},
            handoff_at=time.time(),
        )
    return green


# ---------------------------------------------------------------------------- 2. start green
def start_green(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = _noop) -> dict:
    """Submit green's driver unless it was; a submission that fails aborts (blue never stopped)."""
    op = _in(ledger, op_id, UpgradeState.GREEN_STARTING)
    if op is None:
        return ledger.operation(op_id)
    green = ledger.instance(op["data"]["green_id"])
    if green.submission_id is None:
        try:
            launch_or_fail(config, ledger, green, local=bool(op["params"].get("local")))
        except Exception as exc:  # noqa: BLE001 - any launch failure aborts before green commits
            return abort(config, ledger, op_id, f"green launch failed: {exc}", progress)
        crash_point("upgrade.green_submitted")
        progress(f"green (instance {green.id}) submitted; waiting for its first commit")
    return ledger.operation(op_id)


def green_grace_left(op: dict) -> float:
    """Seconds green still has for its first commit: the grace period counts from the handoff."""
    elapsed = time.time() - op["data"].get("handoff_at", time.time())
    return max(op["params"]["grace_s"] - elapsed, 1.0)


# ------------------------------------------------------------------- 3. green's first commit
def green_committed(
    config: RelayConfig, ledger: Ledger, op_id: int, error: str | None, progress: Progress = _noop
) -> dict:
    """After the wait: GREEN_STARTING -> DRAINING_BLUE, or ABORTED when green failed before committing.

    ``error`` is why the wait ended without a first commit (None: green committed). Green having
    committed anything makes the upgrade go forward whatever happened next.
    """
    op = _in(ledger, op_id, UpgradeState.GREEN_STARTING)
    if op is None:
        return ledger.operation(op_id)
    green_id = op["data"]["green_id"]
    if error is not None:
        if any(le.next_offset > le.start_offset for le in ledger.leases(green_id)):
            progress(f"green committed but then: {error}; going forward")
        else:
            return abort(config, ledger, op_id, error, progress)
    op = ledger.move_operation(
        op_id,
        UpgradeState.DRAINING_BLUE.value,
        green_first_commit_s=round(time.time() - op["data"]["handoff_at"], 2),
    )
    progress(f"green (instance {green_id}) committed; blue drains up to the handoff")
    crash_point("upgrade.green_committed")
    return op


def abort(config: RelayConfig, ledger: Ledger, op_id: int, reason: str, progress: Progress = _noop) -> dict:
    """Green never committed: fence and kill it, give blue its leases back. Blue never stopped."""
    op = ledger.operation(op_id)
    blue_id, green_id = op["data"]["blue_id"], op["data"].get("green_id")
    if green_id is not None:
        green = ledger.instance(green_id)
        ledger.fence(green_id, f"upgrade {op['id']} aborted: {reason}")  # from here green cannot commit
        kill(config, green.submission_id)
    with ledger.tx() as conn:
        if green_id is not None:
            green_leases = ledger.leases(green_id, conn)
            if any(lease.next_offset != lease.start_offset for lease in green_leases):
                raise OperationError("green committed while aborting: the upgrade must go forward")
            for lease in green_leases:
                ledger.delete_lease(conn, lease)
        handoff = {int(p): o for p, o in op["data"].get("handoff", {}).items()}
        for lease in ledger.leases(blue_id, conn):
            if lease.end_offset is not None and handoff.get(lease.partition) == lease.end_offset:
                ledger.reopen_lease(conn, lease)
        if ledger.instance(blue_id, conn).state is InstanceState.DRAINING:
            ledger.set_instance(blue_id, conn, state=InstanceState.ACTIVE)
        op = ledger.move_operation(op["id"], UpgradeState.ABORTED.value, error=reason, conn=conn)
    progress(f"upgrade {op['id']} ABORTED: {reason}; blue (instance {blue_id}) keeps running")
    _ended(config, ledger, op)
    return op


# --------------------------------------------------------------------------- 4. blue drains
def begin_drain(ledger: Ledger, op_id: int) -> dict:
    """Start (or restart, on a rerun) the drain's clock: blue has drain_timeout_s from here."""
    op = _in(ledger, op_id, UpgradeState.DRAINING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    return ledger.move_operation(op_id, UpgradeState.DRAINING_BLUE.value, drain_started_at=time.time())


def drain_deadline(op: dict) -> float:
    return float(op["data"]["drain_started_at"]) + float(op["params"]["drain_timeout_s"])


def blue_drained(
    config: RelayConfig, ledger: Ledger, op_id: int, timed_out: bool, progress: Progress = _noop
) -> dict:
    """After the wait: DRAINING_BLUE -> STOPPING_BLUE, or FAILED when blue never reached H in time."""
    op = _in(ledger, op_id, UpgradeState.DRAINING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    if timed_out:
        op = ledger.move_operation(
            op_id,
            UpgradeState.FAILED.value,
            error=(
                f"blue (instance {op['data']['blue_id']}) did not reach the handoff within "
                f"{op['params']['drain_timeout_s']:.0f}s; green keeps running. Run relay deploy after "
                "stopping, or rerun the upgrade to keep waiting"
            ),
        )
        _ended(config, ledger, op)
        return op
    op = ledger.move_operation(
        op_id,
        UpgradeState.STOPPING_BLUE.value,
        blue_drain_s=round(time.time() - op["data"].get("drain_started_at", time.time()), 2),
    )
    crash_point("upgrade.blue_drained")
    return op


# ----------------------------------------------------------------------------- 5. blue stops
def request_blue_stop(ledger: Ledger, op_id: int) -> dict:
    """Ask blue to stop between batches; the time is kept so a rerun knows the graceful wait began."""
    op = _in(ledger, op_id, UpgradeState.STOPPING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    ledger.request_stop(op["data"]["blue_id"])
    return ledger.move_operation(op_id, UpgradeState.STOPPING_BLUE.value, blue_stop_requested_at=time.time())


def blue_stopped(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = _noop) -> dict:
    """After the graceful-stop wait: fence and kill blue if it lingers; record its end."""
    op = _in(ledger, op_id, UpgradeState.STOPPING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    started = float(op["data"].get("blue_stop_requested_at", time.time()))
    settle_instance_stop(config, ledger, op["data"]["blue_id"], BLUE_STOP_TIMEOUT_S, started, progress)
    crash_point("upgrade.blue_stopped")
    return ledger.operation(op_id)


def expected_apps(ledger: Ledger, op: dict) -> list[str]:
    """After the upgrade the master must list green's application, and only it."""
    return [ledger.instance(op["data"]["green_id"]).app_name]


# ------------------------------------------------------------------------------- 6. audit, DONE
def finish(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = _noop) -> dict:
    """STOPPING_BLUE -> DONE with the audit of the upgrade's window and who applied what."""
    op = _in(ledger, op_id, UpgradeState.STOPPING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    blue_id, green_id = op["data"]["blue_id"], op["data"]["green_id"]
    window = _audit_window(config, ledger, op)
    op = ledger.move_operation(
        op_id,
        UpgradeState.DONE.value,
        total_s=round(time.time() - op["data"]["started_at"], 2),
        applied_by_blue=_applied_by(ledger, blue_id),
        applied_by_green=_applied_by(ledger, green_id),
        duplicates=window.totals["duplicates"],
        gaps=window.totals["missing"],
        audit_mode=window.mode,
    )
    progress(f"upgrade {op_id} DONE: only instance {green_id} runs")
    _ended(config, ledger, op)
    return op


def _applied_by(ledger: Ledger, instance_id: int) -> int:
    from sqlalchemy import func, select

    with ledger.tx() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(s.messages).where(s.messages.c.instance_id == instance_id)
            ).scalar_one()
        )


def _audit_window(config: RelayConfig, ledger: Ledger, op: dict) -> AuditReport:
    """Audit only what the upgrade touched, from blue's cursors at the handoff to green's cursors.

    Deep (offset by offset against Kafka, so transaction markers are not mistaken for missing
    records) and bounded by the upgrade's window, never the topic's whole history.
    """
    since = {int(p): o for p, o in op["data"].get("blue_cursors", {}).items()} or None
    until = {le.partition: le.next_offset for le in ledger.leases(op["data"]["green_id"])}
    try:
        return audit(config, ledger, since=since, until=until, deep=True)
    except KafkaError:
        return audit(config, ledger, since=since, until=until)
