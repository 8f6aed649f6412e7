"""Blue-green upgrade with an exact handoff at offsets H: blue applies [cursor, H), green [H, ...).

Every step is a persisted state (``operations`` table), so a run that dies half-way is resumed by
running the upgrade again, and two upgrades (or an upgrade and a recovery) never run at once.
Before green's first commit the upgrade can abort (blue never stopped); after it, only forward.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from enum import Enum

from relay.artifacts import artifact, build_artifact, validate_version
from relay.audit import AuditReport, audit
from relay.config import RelayConfig
from relay.crashpoints import crash_point
from relay.errors import ConfigError, KafkaError, OperationError
from relay.kafka_offsets import KafkaOffsets
from relay.launcher import app_name, driver_running, kill, wait_until_active
from relay.ledger import schema as s
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import launch_or_fail
from relay.operations.inventory import master_apps, take_inventory
from relay.operations.stop import stop_instance

Progress = Callable[[str], None]


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


def _abort(config: RelayConfig, ledger: Ledger, op: dict, reason: str, progress: Progress) -> dict:
    """Green never committed: fence and kill it, give blue its leases back. Blue never stopped."""
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
    return _result(ledger, op)


def _result(ledger: Ledger, op: dict) -> dict:
    return {
        "upgrade_id": op["id"],
        "state": op["state"],
        "error": op.get("error"),
        **op["data"],
        "history": op["history"],
    }


def _applied_by(ledger: Ledger, instance_id: int) -> int:
    from sqlalchemy import func, select

    with ledger.tx() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(s.messages).where(s.messages.c.instance_id == instance_id)
            ).scalar_one()
        )


def upgrade(
    config: RelayConfig,
    version: str,
    handoff: str = "latest",
    grace_s: float = 300.0,
    drain_timeout_s: float = 600.0,
    local: bool = False,
    progress: Progress = _noop,
) -> dict:
    """Run (or resume) the blue-green upgrade of the pipeline to ``version``."""
    validate_version(version)
    explicit = parse_handoff(handoff, config.topic)
    if grace_s <= 0 or drain_timeout_s <= 0:
        raise ConfigError("grace and drain timeout must be positive")
    ledger = Ledger(config.ledger_url)
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
        op = _preflight(config, ledger, version, handoff, grace_s, drain_timeout_s, local, progress)
    result = _drive(config, ledger, op, explicit, local, progress)
    ledger.save_report(
        config.pipeline, "upgrade", result["state"], json.loads(json.dumps(result, default=str))
    )
    return result


def _preflight(
    config: RelayConfig,
    ledger: Ledger,
    version: str,
    handoff: str,
    grace_s: float,
    drain_timeout_s: float,
    local: bool,
    progress: Progress,
) -> dict:
    inv = take_inventory(config, ledger)
    if inv.master_error and not local:
        raise OperationError(f"cannot check the Spark master: {inv.master_error}")
    if len(inv.live) != 1 or inv.unknown_apps or (not local and len(inv.apps) != 1):
        raise OperationError(
            f"an upgrade needs exactly one running instance of {config.pipeline}, "
            f"found: {inv.describe()}. Nothing was changed."
        )
    blue = inv.live[0]
    if blue.state is not InstanceState.ACTIVE:
        raise OperationError(f"instance {blue.id} is {blue.state.value}, not ACTIVE: nothing was changed")
    if blue.version == version:
        raise OperationError(f"instance {blue.id} already runs version {version}")
    if not artifact(config, version).exists():
        progress(f"building artifact {version} from the current code")
        build_artifact(config, version)
    op = ledger.open_operation(
        config.pipeline,
        "upgrade",
        UpgradeState.PREFLIGHT.value,
        {
            "version": version,
            "handoff": handoff,
            "grace_s": grace_s,
            "drain_timeout_s": drain_timeout_s,
            "local": local,
        },
        {"blue_id": blue.id, "blue_version": blue.version, "started_at": time.time()},
        ALL_TERMINAL,
    )
    progress(f"upgrade {op['id']}: blue is instance {blue.id} ({blue.version}); target {version}")
    return op


def _drive(
    config: RelayConfig,
    ledger: Ledger,
    op: dict,
    explicit: dict[int, int] | None,
    local: bool,
    progress: Progress,
) -> dict:
    params = op["params"]
    while op["state"] not in TERMINAL:
        state = UpgradeState(op["state"])
        blue = ledger.instance(op["data"]["blue_id"])
        if state is UpgradeState.PREFLIGHT:
            crash_point("upgrade.opened")
            green = _handoff(config, ledger, op["id"], blue, params["version"], explicit)
            crash_point("upgrade.handed_off")
            progress(
                f"handoff: blue closes at {ledger.operation(op['id'])['data']['handoff']}; green is "
                f"instance {green.id}"
            )
        elif state is UpgradeState.GREEN_STARTING:
            green = ledger.instance(op["data"]["green_id"])
            if green.submission_id is None:
                try:
                    launch_or_fail(config, ledger, green, local=local)
                except Exception as exc:  # noqa: BLE001 - any launch failure aborts before green commits
                    return _abort(
                        config, ledger, ledger.operation(op["id"]), f"green launch failed: {exc}", progress
                    )
                crash_point("upgrade.green_submitted")
            elapsed = time.time() - op["data"].get("handoff_at", time.time())
            try:
                wait_until_active(config, ledger, green.id, max(params["grace_s"] - elapsed, 1.0), progress)
            except OperationError as exc:
                if any(le.next_offset > le.start_offset for le in ledger.leases(green.id)):
                    progress(f"green committed but then: {exc}; going forward")
                else:
                    return _abort(config, ledger, ledger.operation(op["id"]), str(exc), progress)
            ledger.move_operation(
                op["id"],
                UpgradeState.DRAINING_BLUE.value,
                green_first_commit_s=round(time.time() - op["data"]["handoff_at"], 2),
            )
            progress(f"green (instance {green.id}) committed; blue drains up to the handoff")
            crash_point("upgrade.green_committed")
        elif state is UpgradeState.DRAINING_BLUE:
            t0 = time.time()
            deadline = t0 + params["drain_timeout_s"]
            while not all(lease.drained for lease in ledger.leases(blue.id) if lease.end_offset is not None):
                if time.time() > deadline:
                    op = ledger.move_operation(
                        op["id"],
                        UpgradeState.FAILED.value,
                        error=(
                            f"blue (instance {blue.id}) did not reach the handoff within "
                            f"{params['drain_timeout_s']:.0f}s; green keeps running. Run relay deploy after "
                            "stopping, or rerun the upgrade to keep waiting"
                        ),
                    )
                    return _result(ledger, op)
                if not driver_running(config, blue.submission_id):
                    progress(
                        f"blue's driver {blue.submission_id} is not running; its rest will be taken over"
                    )
                time.sleep(0.5)
            ledger.move_operation(
                op["id"], UpgradeState.STOPPING_BLUE.value, blue_drain_s=round(time.time() - t0, 2)
            )
            crash_point("upgrade.blue_drained")
        elif state is UpgradeState.STOPPING_BLUE:
            stop_instance(config, ledger, blue, progress=progress)
            crash_point("upgrade.blue_stopped")
            if not local:
                green = ledger.instance(op["data"]["green_id"])
                _verify_only(config, green)
            green_id = op["data"]["green_id"]
            window = _audit_window(config, ledger, op)
            ledger.move_operation(
                op["id"],
                UpgradeState.DONE.value,
                total_s=round(time.time() - op["data"]["started_at"], 2),
                applied_by_blue=_applied_by(ledger, blue.id),
                applied_by_green=_applied_by(ledger, green_id),
                duplicates=window.totals["duplicates"],
                gaps=window.totals["missing"],
                audit_mode=window.mode,
            )
            progress(f"upgrade {op['id']} DONE: only instance {green_id} runs")
        op = ledger.operation(op["id"])
    return _result(ledger, op)


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


def _verify_only(config: RelayConfig, green: Instance, timeout_s: float = 60.0) -> None:
    """The master must list exactly one application of the pipeline: green's."""
    deadline = time.time() + timeout_s
    while True:
        apps = master_apps(config, config.pipeline)
        if [a.name for a in apps] == [green.app_name]:
            return
        if time.time() > deadline:
            raise OperationError(
                f"after the upgrade the master lists {[a.name for a in apps]}, expected only {green.app_name}"
            )
        time.sleep(0.5)
