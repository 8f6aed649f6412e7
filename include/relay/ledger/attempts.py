"""Attempts: epochs, launch tokens that bind a driver to Relay's submission, heartbeats, refusals."""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import time

from sqlalchemy import select
from sqlalchemy.engine import Connection

from relay.errors import LaunchRefusedError, LedgerError, ZombieAttemptError
from relay.ledger import schema as s
from relay.ledger.base import LedgerBase, attempt_from_row, token_hash
from relay.ledger.models import Attempt, AttemptState, Instance
from relay.polling import poll

LAUNCH_TOKEN_ENV = "RELAY_LAUNCH_TOKEN"
"""The environment variable that carries a submission's launch token to its driver (never argv)."""

DRIVER_ALIVE_S = 15.0
"""A RUNNING attempt whose heartbeat is younger than this is alive (drivers heartbeat every second)."""


class _StillAlive(Exception):
    """Another driver of the instance still heartbeats: wait for it to go stale (or refuse)."""

    def __init__(self, inst: Instance, reason: str) -> None:
        super().__init__(reason)
        self.inst, self.reason = inst, reason


class AttemptsMixin(LedgerBase):
    """One attempt per driver start; only the current epoch's attempt may commit."""

    def issue_launch_token(self, instance_id: int) -> str:
        """A fresh secret for the instance's next submission; the ledger keeps only its hash.

        The token travels to the driver in its environment (never argv or a Spark property), so a
        copy of the job that Relay did not submit cannot start an attempt and fence the real one.
        """
        token = secrets.token_urlsafe(32)
        self.set_instance(instance_id, launch_token_hash=token_hash(token))
        return token

    def start_attempt(
        self,
        instance_id: int,
        launch_token: str | None,
        driver_id: str | None = None,
        wait_s: float = 0.0,
    ) -> Attempt:
        """Take a new epoch (pipeline-wide, monotonic) and make it the instance's current one.

        Refused (``LaunchRefusedError``, recorded in ``refused_starts``) unless the driver presents
        the instance's launch token, and, with the token, while ANOTHER driver of the instance is
        alive (a RUNNING attempt under a different driver id that heartbeats): that is a replay of
        the submission, not a relaunch. A relaunch after a worker loss comes under a new driver id
        once the old one is dead, so the caller may wait up to ``wait_s`` for the old heartbeat to
        go stale. Refused (``ZombieAttemptError``) for a non-live instance. Older RUNNING attempts
        are superseded (FENCED) in the same transaction, and the instance follows ``driver_id``:
        stop/kill must address the driver that runs, not the one first submitted.
        """

        def attempt() -> Attempt:
            with self.tx() as conn:
                inst = self.instance(instance_id, conn, lock=True)
                refused = self._refusal(conn, inst, launch_token, driver_id)
                if refused is None:
                    if not inst.state.live:
                        raise ZombieAttemptError(
                            f"instance {instance_id} is {inst.state.value}: a new attempt may not start"
                        )
                    return self._new_attempt(conn, inst, driver_id)
            if refused.startswith("alive:"):
                raise _StillAlive(inst, refused.removeprefix("alive:"))
            self.record_refusal(inst, driver_id, refused)
            raise LaunchRefusedError(refused)

        try:
            started = poll(attempt, wait_s, 1.0, transient=(_StillAlive,))
        except _StillAlive as alive:
            self.record_refusal(alive.inst, driver_id, alive.reason)
            raise LaunchRefusedError(alive.reason) from None
        assert started is not None  # attempt() returns or raises
        return started

    def _refusal(
        self, conn: Connection, inst: Instance, launch_token: str | None, driver_id: str | None
    ) -> str | None:
        """Why this driver may not start an attempt (``alive:`` when another driver still runs)."""
        who = f"driver {driver_id or 'local'} on {socket.gethostname()} (pid {os.getpid()})"
        stored = conn.execute(
            select(s.instances.c.launch_token_hash).where(s.instances.c.id == inst.id)
        ).scalar()
        if not launch_token or not stored or not hmac.compare_digest(stored, token_hash(launch_token)):
            why = "it has no launch token" if not launch_token else "its launch token does not match"
            return f"{who} is not the submission Relay made for instance {inst.id}: {why}"
        alive = conn.execute(
            select(s.attempts.c.id, s.attempts.c.driver_id).where(
                s.attempts.c.instance_id == inst.id,
                s.attempts.c.state == AttemptState.RUNNING.value,
                s.attempts.c.heartbeat_at > time.time() - DRIVER_ALIVE_S,
            )
        ).all()
        others = [(a, d) for a, d in alive if d != driver_id]
        if others:
            return (
                f"alive:{who} is a copy of instance {inst.id}'s submission: its driver "
                f"{others[0][1] or 'local'} (attempt {others[0][0]}) is alive"
            )
        return None

    def _new_attempt(self, conn: Connection, inst: Instance, driver_id: str | None) -> Attempt:
        seq = (
            conn.execute(
                select(s.pipelines.c.epoch_seq).where(s.pipelines.c.name == inst.pipeline).with_for_update()
            ).scalar_one()
            + 1
        )
        conn.execute(s.pipelines.update().where(s.pipelines.c.name == inst.pipeline).values(epoch_seq=seq))
        follow = {"submission_id": driver_id} if driver_id else {}
        self.set_instance(inst.id, conn, current_epoch=seq, **follow)
        now = time.time()
        new_id = conn.execute(
            s.attempts.insert().values(
                instance_id=inst.id,
                epoch=seq,
                state=AttemptState.RUNNING.value,
                host=socket.gethostname(),
                pid=os.getpid(),
                driver_id=driver_id,
                started_at=now,
                heartbeat_at=now,
            )
        ).inserted_primary_key[0]
        conn.execute(
            s.attempts.update()
            .where(
                s.attempts.c.instance_id == inst.id,
                s.attempts.c.id != new_id,
                s.attempts.c.state == AttemptState.RUNNING.value,
            )
            .values(state=AttemptState.FENCED.value, error=f"superseded by attempt {new_id} (epoch {seq})")
        )
        return attempt_from_row(conn.execute(select(s.attempts).where(s.attempts.c.id == new_id)).one())

    def record_refusal(self, inst: Instance, driver_id: str | None, reason: str) -> None:
        with self.tx() as conn:
            conn.execute(
                s.refused_starts.insert().values(
                    pipeline=inst.pipeline,
                    instance_id=inst.id,
                    driver_id=driver_id,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    reason=reason,
                    created_at=time.time(),
                )
            )

    def refusals(self, pipeline: str, since: float = 0.0) -> list[dict]:
        with self.tx() as conn:
            rows = conn.execute(
                select(s.refused_starts)
                .where(s.refused_starts.c.pipeline == pipeline, s.refused_starts.c.created_at >= since)
                .order_by(s.refused_starts.c.id)
            ).all()
        return [dict(r._mapping) for r in rows]

    def check_current(self, conn: Connection, attempt: Attempt) -> Instance:
        """Step 1 of every commit: lock the instance and refuse a zombie."""
        inst = self.instance(attempt.instance_id, conn, lock=True)
        if not inst.state.live:
            raise ZombieAttemptError(
                f"instance {inst.id} is {inst.state.value} ({inst.error}); attempt "
                f"{attempt.id} must not write"
            )
        if inst.current_epoch != attempt.epoch:
            raise ZombieAttemptError(
                f"attempt {attempt.id} has epoch {attempt.epoch} but instance {inst.id} "
                f"is at epoch {inst.current_epoch}: a newer attempt took over"
            )
        return inst

    def end_attempt(self, attempt_id: int, state: AttemptState, error: str | None = None) -> None:
        with self.tx() as conn:
            conn.execute(
                s.attempts.update()
                .where(s.attempts.c.id == attempt_id)
                .values(state=state.value, ended_at=time.time(), error=error)
            )

    def heartbeat(self, attempt_id: int) -> None:
        """A live driver says so; health and the next attempt tell a dead one by a stale heartbeat."""
        with self.tx() as conn:
            conn.execute(
                s.attempts.update().where(s.attempts.c.id == attempt_id).values(heartbeat_at=time.time())
            )

    def set_attempt_app(self, attempt_id: int, app_id: str) -> None:
        with self.tx() as conn:
            conn.execute(s.attempts.update().where(s.attempts.c.id == attempt_id).values(app_id=app_id))

    def attempts(self, instance_id: int) -> list[Attempt]:
        with self.tx() as conn:
            rows = conn.execute(
                select(s.attempts).where(s.attempts.c.instance_id == instance_id).order_by(s.attempts.c.id)
            ).all()
        return [attempt_from_row(r) for r in rows]

    def productive_attempts(self, instance_id: int) -> set[int]:
        """Attempts of the instance that committed at least one batch (made progress)."""
        with self.tx() as conn:
            rows = conn.execute(
                select(s.batches.c.attempt_id).where(s.batches.c.instance_id == instance_id).distinct()
            ).all()
        return {int(r[0]) for r in rows}

    def attempt(self, attempt_id: int) -> Attempt:
        with self.tx() as conn:
            row = conn.execute(select(s.attempts).where(s.attempts.c.id == attempt_id)).first()
        if row is None:
            raise LedgerError(f"no attempt {attempt_id} in the ledger")
        return attempt_from_row(row)
