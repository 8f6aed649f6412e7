"""The blue side of an upgrade, once green passed the cutover gate: blue drains to H, stops, audit, DONE.

Like every upgrade step (see ``upgrade_steps``), each acts only in its own state and is safe to rerun.
"""

from __future__ import annotations

import time

from relay.audit import AuditReport, audit
from relay.config import RelayConfig
from relay.crashpoints import crash_point
from relay.errors import KafkaError, RelayError
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from relay.operations.stop import settle_instance_stop
from relay.operations.upgrade_state import Progress, UpgradeState, ended, in_state, noop

BLUE_STOP_TIMEOUT_S = 120.0  # graceful-stop wait for blue (the CLI's stop_instance default)
VERIFY_TIMEOUT_S = 60.0  # how long the master may take to drop blue's application


# --------------------------------------------------------------------------- 5. blue drains
def begin_drain(ledger: Ledger, op_id: int) -> dict:
    """Start (or restart, on a rerun) the drain's clock: blue has drain_timeout_s from here."""
    op = in_state(ledger, op_id, UpgradeState.DRAINING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    return ledger.move_operation(op_id, UpgradeState.DRAINING_BLUE.value, drain_started_at=time.time())


def drain_deadline(op: dict) -> float:
    return float(op["data"]["drain_started_at"]) + float(op["params"]["drain_timeout_s"])


def blue_drained(
    config: RelayConfig, ledger: Ledger, op_id: int, timed_out: bool, progress: Progress = noop
) -> dict:
    """After the wait: DRAINING_BLUE -> STOPPING_BLUE, or FAILED when blue never reached H in time."""
    op = in_state(ledger, op_id, UpgradeState.DRAINING_BLUE)
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
        ended(config, ledger, op)
        return op
    op = ledger.move_operation(
        op_id,
        UpgradeState.STOPPING_BLUE.value,
        blue_drain_s=round(time.time() - op["data"].get("drain_started_at", time.time()), 2),
    )
    crash_point("upgrade.blue_drained")
    return op


# ----------------------------------------------------------------------------- 6. blue stops
def request_blue_stop(ledger: Ledger, op_id: int) -> dict:
    """Ask blue to stop between batches; the time is kept so a rerun knows the graceful wait began."""
    op = in_state(ledger, op_id, UpgradeState.STOPPING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    ledger.request_stop(op["data"]["blue_id"])
    return ledger.move_operation(op_id, UpgradeState.STOPPING_BLUE.value, blue_stop_requested_at=time.time())


def blue_stopped(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = noop) -> dict:
    """After the graceful-stop wait: fence and kill blue if it lingers; record its end."""
    op = in_state(ledger, op_id, UpgradeState.STOPPING_BLUE)
    if op is None:
        return ledger.operation(op_id)
    started = float(op["data"].get("blue_stop_requested_at", time.time()))
    settle_instance_stop(config, ledger, op["data"]["blue_id"], BLUE_STOP_TIMEOUT_S, started, progress)
    crash_point("upgrade.blue_stopped")
    return ledger.operation(op_id)


def expected_apps(ledger: Ledger, op: dict) -> list[str]:
    """After the upgrade the master must list green's application, and only it."""
    return [ledger.instance(op["data"]["green_id"]).app_name]


# ------------------------------------------------------------------------------- 7. audit, DONE
def finish(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = noop) -> dict:
    """STOPPING_BLUE -> DONE with the audit of the upgrade's window and who applied what."""
    op = in_state(ledger, op_id, UpgradeState.STOPPING_BLUE)
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
    ended(config, ledger, op)
    _prune(config, ledger, progress)
    return op


def _prune(config: RelayConfig, ledger: Ledger, progress: Progress) -> None:
    """Keep the newest ``keep_versions`` artifacts (never a live one, never the rollback target).
    Best effort: a folder that cannot be removed never fails a finished upgrade."""
    from relay.operations.rollback import prune_versions

    try:
        pruned = prune_versions(config, ledger)
    except (OSError, RelayError) as exc:
        progress(f"old versions not pruned: {exc}")
        return
    if pruned.get("removed"):
        progress(f"pruned old versions {', '.join(pruned['removed'])} (keeping {config.keep_versions})")


def _applied_by(ledger: Ledger, instance_id: int) -> int:
    """Rows the instance's committed batches wrote through the sink (their tasks' counts)."""
    from sqlalchemy import func, select

    b = s.batches
    with ledger.tx() as conn:
        q = select(func.coalesce(func.sum(b.c.rows_applied), 0)).where(b.c.instance_id == instance_id)
        return int(conn.execute(q).scalar_one())


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
