"""Hot standby failover: a warm instance of the running version takes a dead active's place in ONE
ledger transaction, without the dead one's cooperation.

Why in the standby's own driver: it is already up (session, source, Python workers) and watching, so
the pause is the detection bound plus one batch; the master's relaunch (a JVM, a session and Python
workers before the first batch) took 15-70 s. Death is judged on the standby's clock from what
changes in the ledger, never by comparing two hosts' clocks: the active's heartbeat not moving for
``FAILOVER_AFTER_S``, its current attempt ended (crashed), or a new attempt of it (the master
relaunched a dead driver). A ledger that can't be read restarts the count (both sides were cut off).

The transaction fences the active (its later commits and attempts are refused), hands its leases to
the standby at their cursors (``Ledger.take_over``: the fenced active becomes the predecessor the
standby takes over in the sink before it writes, so whatever its tasks wrote past its last commit
is neither lost nor written twice) and makes the standby STARTING. A false alarm (an active only
paused) costs a handoff: its later commits and sink writes are refused and it exits as a zombie.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from relay.ledger import schema as s
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger

HOT_STANDBY = "hot-standby"
"""The ``role`` of a pipeline's hot standby instance."""
FAILOVER_AFTER_S = 3.0
"""Seconds without a heartbeat of the active before its standby takes over (drivers beat each second)."""
FAILOVER_KIND = "failover"
"""The operations row each failover writes (state DONE), in the takeover's own transaction."""
TAKEN_OVER = (InstanceState.ACTIVE, InstanceState.STARTING)


@dataclass(frozen=True)
class Seen:
    """What the standby read of the active: its current attempt and that attempt's heartbeat."""

    instance_id: int
    epoch: int
    attempt_state: AttemptState | None
    heartbeat_at: float


def look_at_active(ledger: Ledger, pipeline: str, standby_id: int) -> Seen | None:
    """The pipeline's ACTIVE (or STARTING) instance as a standby sees it; None when there is none
    to watch (stopping, stopped, an upgrade's instances, or the standby alone)."""
    with ledger.tx() as conn:
        rows = conn.execute(
            select(s.instances).where(
                s.instances.c.pipeline == pipeline,
                s.instances.c.state.in_([st.value for st in TAKEN_OVER]),
                s.instances.c.id != standby_id,
            )
        ).all()
        if len(rows) != 1 or rows[0]._mapping["stop_requested"]:
            return None
        inst = rows[0]._mapping
        attempt = conn.execute(
            select(s.attempts.c.state, s.attempts.c.heartbeat_at).where(
                s.attempts.c.instance_id == inst["id"], s.attempts.c.epoch == inst["current_epoch"]
            )
        ).first()
    if attempt is None:  # not started yet: its start is judged like a beat that never moves
        return Seen(inst["id"], inst["current_epoch"], None, float(inst["updated_at"]))
    return Seen(inst["id"], inst["current_epoch"], AttemptState(attempt[0]), float(attempt[1]))


class DeathWatch:
    """Is the active dead? Judged by what changes between looks, on the watcher's clock only."""

    def __init__(self, after_s: float = FAILOVER_AFTER_S) -> None:
        self.after_s = after_s
        self._last: Seen | None = None
        self._since = 0.0  # monotonic time of the first look at the current heartbeat

    def reset(self) -> None:
        """Forget what was seen (the ledger was away, or nothing to watch): the count starts again."""
        self._last = None

    def dead(self, seen: Seen | None, now: float | None = None) -> str | None:
        """Why the active is dead (a failover's reason), or None while it looks alive."""
        now = time.monotonic() if now is None else now
        last, self._last = self._last, seen
        if seen is None:
            return None
        if last is None or last.instance_id != seen.instance_id:
            self._since = now
            return None
        if seen.epoch != last.epoch:
            return f"instance {seen.instance_id} was relaunched (epoch {last.epoch} -> {seen.epoch})"
        if seen.attempt_state not in (None, AttemptState.RUNNING):
            return f"instance {seen.instance_id}'s attempt ended {seen.attempt_state.value}"
        if seen.heartbeat_at != last.heartbeat_at:
            self._since = now
            return None
        if now - self._since >= self.after_s:
            return f"no heartbeat of instance {seen.instance_id} for {now - self._since:.1f}s"
        return None


def fail_over(
    ledger: Ledger, standby_id: int, seen: Seen, reason: str, terminal: tuple[str, ...]
) -> dict | None:
    """Take the active's place in one transaction; None (nothing changed) when it is not dead after
    all: it beat again, it is stopping, an operation (``terminal``: the states that end one) owns
    the pipeline, or this instance is no longer a waiting standby."""
    with ledger.tx() as conn:
        active = ledger.instance(seen.instance_id, conn, lock=True)  # waits for an in-flight commit
        standby = ledger.instance(standby_id, conn, lock=True)
        if not standby.state.standby or standby.stop_requested:
            return None
        if active.state not in TAKEN_OVER or active.stop_requested:
            return None
        busy = conn.execute(
            select(s.operations.c.id).where(
                s.operations.c.pipeline == active.pipeline, s.operations.c.state.not_in(terminal)
            )
        ).first()
        if busy is not None:
            return None
        if _beat_since(conn, active, seen):
            return None
        now = time.time()
        ledger.fence(active.id, f"failed over to instance {standby.id}: {reason}", conn)
        taken = ledger.take_over(conn, active.pipeline, standby)
        ledger.set_instance(standby.id, conn, state=InstanceState.STARTING, role=None)  # the active now
        data = {
            "from_instance": active.id,
            "to_instance": standby.id,
            "reason": reason,
            "leases": [lease.to_json() for lease in taken],
            "failed_over_at": now,
        }
        conn.execute(
            s.operations.insert().values(
                pipeline=active.pipeline,
                kind=FAILOVER_KIND,
                state="DONE",
                params={},
                data=data,
                history=[{"state": "DONE", "at": now}],
                created_at=now,
                updated_at=now,
            )
        )
    return data


def _beat_since(conn: Connection, active: Instance, seen: Seen) -> bool:
    """The attempt the standby judged is still current and beat after the look: alive after all."""
    if active.current_epoch != seen.epoch:
        return False  # a newer attempt: the judged one is gone (a relaunch)
    row = conn.execute(
        select(s.attempts.c.state, s.attempts.c.heartbeat_at).where(
            s.attempts.c.instance_id == active.id, s.attempts.c.epoch == seen.epoch
        )
    ).first()
    if row is None:
        return False
    return row[0] == AttemptState.RUNNING.value and float(row[1]) > seen.heartbeat_at


__all__ = ["FAILOVER_AFTER_S", "FAILOVER_KIND", "HOT_STANDBY", "DeathWatch", "Seen", "fail_over"]
