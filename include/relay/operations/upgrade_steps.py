"""The persisted steps of a blue-green upgrade with a warm standby, one function each, in order.

1. start green as a warm standby: created without leases, submitted; blue keeps running uncapped.
2. green READY (session, source and Python workers up; its query holds).
3. handoff: only now H is read; one transaction closes blue's leases at H and opens green's at H.
4. cutover gate: green committed past H and its lag is within ``max_lag`` before ``catchup_s``.
Then ``upgrade_finish``: blue drains to H, stops, the window is audited, DONE.

Until blue stops, a failed step or gate ABORTS: green is fenced and killed, blue takes its leases
back (from green's cursors when green had committed), and blue never stopped. Each step reads the
operation's state from the ledger and acts only in its own state, so a step can be run again after
a crash or by a cleared Airflow task; :func:`relay.operations.upgrade.upgrade` (the CLI) is these
steps in a loop. Waits (READY, the gate, the drain, the stop) are not steps: the caller waits in
between, in-process or in an Airflow trigger, with the checks of ``waits``.
"""

from __future__ import annotations

import time

from relay.config import RelayConfig
from relay.crashpoints import crash_point
from relay.errors import ConfigError, OperationError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger import schema as s
from relay.ledger.models import Instance, InstanceState, Lease, Offsets
from relay.ledger.store import Ledger
from relay.operations.deploy import launch_or_fail
from relay.operations.upgrade_finish import (  # noqa: F401 - the blue side, re-exported for callers
    BLUE_STOP_TIMEOUT_S,
    VERIFY_TIMEOUT_S,
    begin_drain,
    blue_drained,
    blue_stopped,
    drain_deadline,
    expected_apps,
    finish,
    request_blue_stop,
)
from relay.operations.upgrade_state import (  # noqa: F401 - re-exported: the upgrade's vocabulary
    ABORTABLE,
    ALL_TERMINAL,
    TERMINAL,
    Progress,
    UpgradeState,
    ended,
    in_state,
    noop,
    parse_handoff,
    resolved_max_lag,
    result,
    seconds,
)
from relay.spark.launcher import app_name, kill


# ---------------------------------------------------------------------- 1. green, warm standby
def start_green(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = noop) -> dict:
    """PREFLIGHT -> GREEN_WARMING: create green (STANDBY, no lease) and submit its driver.

    Green reads nothing until the handoff gives it a lease, so blue runs on uncapped meanwhile. A
    submission that fails aborts (nothing of blue was touched)."""
    op = in_state(ledger, op_id, UpgradeState.PREFLIGHT)
    if op is not None:
        crash_point("upgrade.opened")
        with ledger.tx() as conn:
            blue = ledger.instance(op["data"]["blue_id"], conn)
            green = ledger.create_instance(  # blue's resources, unless the upgrade is a scale
                conn,
                config.pipeline,
                op["params"]["version"],
                blue.color.other,
                "",
                "",
                state=InstanceState.STANDBY,
                resources=op["params"].get("resources") or blue.resources,
            )
            ledger.set_instance(
                green.id,
                conn,
                checkpoint_dir=str(config.checkpoints_dir / f"instance-{green.id}"),
                app_name=app_name(config.pipeline, green.id),
            )
            op = ledger.move_operation(op_id, UpgradeState.GREEN_WARMING.value, conn=conn, green_id=green.id)
        crash_point("upgrade.green_created")
    op = in_state(ledger, op_id, UpgradeState.GREEN_WARMING)
    if op is None:
        return ledger.operation(op_id)
    green = ledger.instance(op["data"]["green_id"])
    if green.submission_id is None:
        try:
            launch_or_fail(config, ledger, green, local=bool(op["params"].get("local")))
        except Exception as exc:  # noqa: BLE001 - any launch failure aborts before the handoff
            return abort(config, ledger, op_id, f"green launch failed: {exc}", progress)
        op = ledger.move_operation(op_id, UpgradeState.GREEN_WARMING.value, green_submitted_at=time.time())
        crash_point("upgrade.green_submitted")
        progress(f"green (instance {green.id}, {green.version}) submitted as a warm standby; blue runs on")
    return op


def ready_left(op: dict) -> float:
    """Seconds green still has to report READY: the grace period counts from its submission."""
    since = op["data"].get("green_submitted_at") or op["data"].get("started_at") or time.time()
    return max(float(op["params"]["grace_s"]) - (time.time() - float(since)), 1.0)


# ---------------------------------------------------------------------------- 2. green READY
def green_ready(
    config: RelayConfig, ledger: Ledger, op_id: int, error: str | None, progress: Progress = noop
) -> dict:
    """After the wait: GREEN_WARMING -> GREEN_READY, or ABORTED with the driver's own error."""
    op = in_state(ledger, op_id, UpgradeState.GREEN_WARMING)
    if op is None:
        return ledger.operation(op_id)
    if error is not None:
        return abort(config, ledger, op_id, f"green never got READY: {error}", progress)
    green = ledger.instance(op["data"]["green_id"])
    ready_at = green.updated_at if green.state is InstanceState.READY else time.time()
    op = ledger.move_operation(
        op_id,
        UpgradeState.GREEN_READY.value,
        green_ready_at=ready_at,
        green_ready_s=seconds(ready_at, op["data"].get("green_submitted_at")),
    )
    crash_point("upgrade.green_ready")
    progress(f"green (instance {green.id}) is READY after {op['data']['green_ready_s']}s")
    return op


# ------------------------------------------------------------------------------- 3. handoff
def hand_off(config: RelayConfig, ledger: Ledger, op_id: int, progress: Progress = noop) -> dict:
    """GREEN_READY -> GREEN_STARTING, one transaction: blue's leases close at H, green's open at H."""
    op = in_state(ledger, op_id, UpgradeState.GREEN_READY)
    if op is None:
        return ledger.operation(op_id)
    explicit = parse_handoff(op["params"]["handoff"], config.topic)
    blue = ledger.instance(op["data"]["blue_id"])
    green = ledger.instance(op["data"]["green_id"])
    try:
        _handoff(config, ledger, op_id, blue, green, explicit)
    except ConfigError as exc:  # an explicit H below blue's cursor or planned end: nothing moved
        return abort(config, ledger, op_id, str(exc), progress)
    crash_point("upgrade.handed_off")
    op = ledger.operation(op_id)
    progress(f"handoff: blue closes at {op['data']['handoff']}; green (instance {green.id}) starts there")
    return op


def _handoff(
    config: RelayConfig,
    ledger: Ledger,
    op_id: int,
    blue: Instance,
    green: Instance,
    explicit: dict[int, int] | None,
) -> None:
    """One transaction: close blue's open leases at H, open green's at H, green READY -> STARTING.

    H is never below blue's cursor nor below the end of a batch blue's source planned (recorded
    under blue's row lock, which this transaction holds): such a batch may still be in flight, and
    committed past H it would move blue's Spark position past what an abort gives back (issue #12).
    Kafka's latest offset (read before the lock) is raised to it; an explicit H below it is refused.
    """
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        latest = kafka.latest(config.topic)
    with ledger.tx() as conn:
        # Lock blue's row first: blue's commits and its source's planning lock it too, so no cursor
        # moves and no batch is planned while H is chosen.
        blue, planned = ledger.lock_planned(blue.id, conn)
        if blue.state is not InstanceState.ACTIVE:
            raise OperationError(f"blue (instance {blue.id}) is {blue.state.value}, not ACTIVE: no handoff")
        # Green's row too: a stateful green's source plans shadow batches under it (relay.pipeline.stateful).
        green, green_planned = ledger.lock_planned(green.id, conn)
        if green.state is not InstanceState.READY:
            raise OperationError(f"green (instance {green.id}) is {green.state.value}, not READY: no handoff")
        open_leases = [lease for lease in ledger.leases(blue.id, conn) if lease.end_offset is None]
        blue_cursors = {str(lease.partition): lease.next_offset for lease in open_leases}
        h = {
            lease.partition: handoff_offset(lease, planned, explicit, latest, green_planned)
            for lease in open_leases
        }
        for lease in open_leases:
            ledger.close_lease(conn, lease, h[lease.partition])
        for partition, offset in sorted(h.items()):
            ledger.open_lease(conn, green, config.topic, partition, offset)
        ledger.set_instance(green.id, conn, state=InstanceState.STARTING)
        ledger.set_instance(blue.id, conn, state=InstanceState.DRAINING)
        # Same transaction: a crash can't leave the handoff done and the state at GREEN_READY.
        ledger.move_operation(
            op_id,
            UpgradeState.GREEN_STARTING.value,
            conn=conn,
            blue_cursors=blue_cursors,
            blue_planned={str(p): planned.get(config.topic, {}).get(p) for p in sorted(h)},
            green_planned={str(p): green_planned.get(config.topic, {}).get(p) for p in sorted(h)},
            handoff={str(p): o for p, o in h.items()},
            handoff_at=time.time(),
        )


def handoff_offset(
    lease: Lease,
    planned: Offsets,
    explicit: dict[int, int] | None,
    latest: dict[int, int],
    green_planned: Offsets | None = None,
) -> int:
    """H of one of blue's open leases: at or above its cursor and blue's planned end there, and at
    or above green's planned end (a stateful green reads ahead in shadow, ``relay.pipeline.stateful``: a
    record it read below H would be in a batch it never writes, and blue stops at H).

    ``latest`` (Kafka's end, read before blue's row was locked) is raised to all three: blue may have
    planned, and even committed, past it since. An explicit H below one is refused (ConfigError:
    the upgrade aborts, nothing moved): the operator asked for that H, and raising it would change
    which version applies which offsets behind their back.
    """
    cursor = lease.next_offset
    end = planned.get(lease.topic, {}).get(lease.partition, cursor)
    shadow = (green_planned or {}).get(lease.topic, {}).get(lease.partition, 0)
    where = f"{lease.topic}[{lease.partition}]"
    if explicit is None or lease.partition not in explicit:
        return max(latest.get(lease.partition, cursor), cursor, end, shadow)
    target = explicit[lease.partition]
    if target < cursor:
        raise ConfigError(
            f"handoff offset {target} of {where} is below blue's cursor {cursor}: "
            "those offsets are already applied"
        )
    if target < end:
        raise ConfigError(
            f"handoff offset {target} of {where} is below {end}, the end of a batch blue has "
            f"already planned (it may be running): hand off at {end} or later, or at latest"
        )
    if target < shadow:
        raise ConfigError(
            f"handoff offset {target} of {where} is below {shadow}, where green has already read "
            f"(warming its state): hand off at {shadow} or later, or at latest"
        )
    return target


# ------------------------------------------------------------------------- 4. cutover gate
def catchup_left(op: dict) -> float:
    """Seconds green still has to pass the gate: they count from the handoff."""
    elapsed = time.time() - float(op["data"].get("handoff_at", time.time()))
    return max(float(op["params"].get("catchup_s", op["params"]["grace_s"])) - elapsed, 1.0)


def max_lag(config: RelayConfig, op: dict) -> int:
    """The gate's lag bound of this upgrade, in records."""
    return resolved_max_lag(config, op["params"].get("max_lag"))


def green_caught_up(
    config: RelayConfig,
    ledger: Ledger,
    op_id: int,
    error: str | None,
    lag: int | None = None,
    progress: Progress = noop,
) -> dict:
    """After the gate's wait: GREEN_STARTING -> DRAINING_BLUE, or ABORTED (``error``: why the gate
    failed); green's committed offsets stay applied and blue continues after them."""
    op = in_state(ledger, op_id, UpgradeState.GREEN_STARTING)
    if op is None:
        return ledger.operation(op_id)
    if error is not None:
        return abort(config, ledger, op_id, f"cutover gate failed: {error}", progress)
    now = time.time()
    op = ledger.move_operation(
        op_id,
        UpgradeState.DRAINING_BLUE.value,
        caught_up_at=now,
        green_first_commit_s=seconds(_first_commit_at(ledger, op), op["data"].get("handoff_at")),
        green_caught_up_s=seconds(now, op["data"].get("handoff_at")),
        lag_at_cutover=lag,
    )
    progress(f"green (instance {op['data']['green_id']}) passed the gate (lag {lag}); blue drains to H")
    crash_point("upgrade.green_caught_up")
    return op


def _first_commit_at(ledger: Ledger, op: dict) -> float | None:
    from sqlalchemy import func, select

    with ledger.tx() as conn:
        return conn.execute(
            select(func.min(s.batches.c.committed_at)).where(
                s.batches.c.instance_id == op["data"]["green_id"]
            )
        ).scalar_one()


# --------------------------------------------------------------------------------- abort
def abort(config: RelayConfig, ledger: Ledger, op_id: int, reason: str, progress: Progress = noop) -> dict:
    """Before blue stops: fence and kill green, give blue everything green did not apply. Blue never
    stopped; a green that committed keeps what it applied (blue continues after green's cursors).

    Green's leases are closed where their cursors are, never deleted, and blue continues on NEW
    leases that start exactly there: green is then a predecessor of blue's new lease
    (``relay.protocol.predecessors``). Green's tasks may have written to the sink past its last ledger commit
    (even before its first one); blue's driver fences green in the sink and skips what it wrote
    before writing the same offsets (issue #29: a deleted lease made the Kafka sink write them
    twice). The new leases' ids are above green's, so blue is also the newer writer generation of a
    stateful pipeline (``relay.pipeline.stateful``)."""
    op = ledger.operation(op_id)
    if op["state"] not in ABORTABLE:
        raise OperationError(f"upgrade {op_id} is {op['state']}: blue has stopped, only forward now")
    blue_id, green_id = op["data"]["blue_id"], op["data"].get("green_id")
    if green_id is not None:
        green = ledger.instance(green_id)
        ledger.fence(green_id, f"upgrade {op['id']} aborted: {reason}")  # from here green cannot commit
        kill(config, green.submission_id)
    handoff = {int(p): o for p, o in op["data"].get("handoff", {}).items()}
    with ledger.tx() as conn:
        green_ends: dict[int, int] = {}  # partition -> where green stopped (its lease's start H if untouched)
        applied: dict[int, int] = {}
        for lease in ledger.leases(green_id, conn) if green_id is not None else []:
            if lease.end_offset is None:
                ledger.close_lease(conn, lease, lease.next_offset)
            green_ends[lease.partition] = max(green_ends.get(lease.partition, 0), lease.next_offset)
            if lease.next_offset > lease.start_offset:
                applied[lease.partition] = green_ends[lease.partition]
        blue = ledger.instance(blue_id, conn)
        for lease in ledger.leases(blue_id, conn):
            if lease.end_offset is None or handoff.get(lease.partition) != lease.end_offset:
                continue
            # Blue drains [cursor, H) on the lease it has, then applies from where green stopped.
            start = max(green_ends.get(lease.partition, lease.end_offset), lease.end_offset)
            ledger.open_lease(conn, blue, lease.topic, lease.partition, start)
        if blue.state is InstanceState.DRAINING:
            ledger.set_instance(blue_id, conn, state=InstanceState.ACTIVE)
        op = ledger.move_operation(
            op["id"], UpgradeState.ABORTED.value, error=reason, conn=conn, green_applied_before_abort=applied
        )
    progress(f"upgrade {op['id']} ABORTED: {reason}; blue (instance {blue_id}) keeps running")
    ended(config, ledger, op)
    return op
