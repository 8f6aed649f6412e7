"""The ledger: instances, attempts with epochs, offset-range leases, gaps, on SQLite or PostgreSQL.

Every write that decides correctness happens in one transaction that first locks the instance row
(``SELECT ... FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so fencing, epochs and
cursor moves are serialised per instance.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import SQLAlchemyError

from relay.errors import ConfigError, LedgerError, OperationInProgressError, ZombieAttemptError
from relay.ledger import schema as s
from relay.ledger.models import (
    Attempt,
    AttemptState,
    Color,
    Gap,
    Instance,
    InstanceState,
    Lease,
    Offsets,
)


def make_engine(url: str) -> Engine:
    """An engine tuned for many short transactions from several processes."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 60, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Take the write lock up front: no deadlock when a reader later writes.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql"):
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)
    raise ConfigError(f"unsupported ledger URL {url!r}: use sqlite:///path or postgresql+psycopg2://...")


def _instance(row: Row) -> Instance:
    m = row._mapping
    return Instance(
        id=m["id"],
        pipeline=m["pipeline"],
        version=m["version"],
        color=Color(m["color"]),
        state=InstanceState(m["state"]),
        checkpoint_dir=m["checkpoint_dir"],
        current_epoch=m["current_epoch"],
        stop_requested=bool(m["stop_requested"]),
        submission_id=m["submission_id"],
        app_name=m["app_name"],
        error=m["error"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
    )


def _attempt(row: Row) -> Attempt:
    m = row._mapping
    return Attempt(
        id=m["id"],
        instance_id=m["instance_id"],
        epoch=m["epoch"],
        state=AttemptState(m["state"]),
        app_id=m["app_id"],
        host=m["host"],
        pid=m["pid"],
        started_at=m["started_at"],
        heartbeat_at=m["heartbeat_at"],
        ended_at=m["ended_at"],
        error=m["error"],
    )


def _lease(row: Row) -> Lease:
    return Lease(**dict(row._mapping))


def _gap(row: Row) -> Gap:
    return Gap(**dict(row._mapping))


class Ledger:
    """Access to one ledger database. Cheap to create; connects lazily through a pooled engine."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = make_engine(self.url)
            try:
                with self._engine.begin() as conn:
                    found = s.migrate(conn)
            except SQLAlchemyError as exc:
                raise LedgerError(f"cannot open the ledger at {self.safe_url}: {exc}") from exc
            if found > s.SCHEMA_VERSION:
                raise LedgerError(
                    f"ledger schema version {found} is newer than this code ({s.SCHEMA_VERSION}): "
                    "upgrade Relay"
                )
        return self._engine

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages."""
        if "@" in self.url and "://" in self.url:
            scheme, rest = self.url.split("://", 1)
            return f"{scheme}://***@{rest.split('@', 1)[1]}"
        return self.url

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """One transaction; vendor errors surface as LedgerError, Relay's own errors unchanged."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise LedgerError(f"ledger transaction failed ({self.safe_url}): {exc}") from exc

    # ----------------------------------------------------------------- pipelines and instances
    def ensure_pipeline(self, name: str, conn: Connection | None = None) -> None:
        if conn is None:
            with self.tx() as c:
                return self.ensure_pipeline(name, c)
        if conn.execute(select(s.pipelines.c.name).where(s.pipelines.c.name == name)).first() is None:
            conn.execute(
                s.pipelines.insert().values(name=name, epoch_seq=0, message_count=0, created_at=time.time())
            )

    def create_instance(
        self,
        conn: Connection,
        pipeline: str,
        version: str,
        color: Color,
        checkpoint_dir: str,
        app_name: str,
    ) -> Instance:
        self.ensure_pipeline(pipeline, conn)
        now = time.time()
        new_id = conn.execute(
            s.instances.insert().values(
                pipeline=pipeline,
                version=version,
                color=color.value,
                state=InstanceState.STARTING.value,
                checkpoint_dir=checkpoint_dir,
                current_epoch=0,
                stop_requested=False,
                app_name=app_name,
                created_at=now,
                updated_at=now,
            )
        ).inserted_primary_key[0]
        return self.instance(new_id, conn)

    def instance(self, instance_id: int, conn: Connection | None = None, lock: bool = False) -> Instance:
        if conn is None:
            with self.tx() as c:
                return self.instance(instance_id, c)
        q = select(s.instances).where(s.instances.c.id == instance_id)
        row = conn.execute(q.with_for_update() if lock else q).first()
        if row is None:
            raise LedgerError(f"no instance {instance_id} in the ledger")
        return _instance(row)

    def instances(
        self, pipeline: str, live_only: bool = False, conn: Connection | None = None
    ) -> list[Instance]:
        if conn is None:
            with self.tx() as c:
                return self.instances(pipeline, live_only, c)
        rows = conn.execute(
            select(s.instances).where(s.instances.c.pipeline == pipeline).order_by(s.instances.c.id)
        ).all()
        found = [_instance(r) for r in rows]
        return [i for i in found if i.state.live] if live_only else found

    def set_instance(self, instance_id: int, conn: Connection | None = None, **values: Any) -> None:
        if conn is None:
            with self.tx() as c:
                return self.set_instance(instance_id, c, **values)
        for key in ("state", "color"):
            if key in values and hasattr(values[key], "value"):
                values[key] = values[key].value
        values["updated_at"] = time.time()
        conn.execute(s.instances.update().where(s.instances.c.id == instance_id).values(**values))

    def request_stop(self, instance_id: int) -> None:
        """Ask the instance's drivers to stop between batches (read by the source and the driver)."""
        self.set_instance(instance_id, stop_requested=True)

    def fence(self, instance_id: int, reason: str) -> None:
        """Make every attempt of the instance a zombie: none of them can commit again."""
        self.set_instance(instance_id, state=InstanceState.FENCED, error=reason)

    # ---------------------------------------------------------------------------- attempts
    def start_attempt(self, instance_id: int, app_id: str | None = None) -> Attempt:
        """Take a new epoch (pipeline-wide, monotonic) and make it the instance's current one."""
        with self.tx() as conn:
            inst = self.instance(instance_id, conn, lock=True)
            if not inst.state.live:
                raise ZombieAttemptError(
                    f"instance {instance_id} is {inst.state.value}: a new attempt may not start"
                )
            seq = (
                conn.execute(
                    select(s.pipelines.c.epoch_seq)
                    .where(s.pipelines.c.name == inst.pipeline)
                    .with_for_update()
                ).scalar_one()
                + 1
            )
            conn.execute(
                s.pipelines.update().where(s.pipelines.c.name == inst.pipeline).values(epoch_seq=seq)
            )
            self.set_instance(instance_id, conn, current_epoch=seq)
            now = time.time()
            new_id = conn.execute(
                s.attempts.insert().values(
                    instance_id=instance_id,
                    epoch=seq,
                    state=AttemptState.RUNNING.value,
                    app_id=app_id,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    started_at=now,
                    heartbeat_at=now,
                )
            ).inserted_primary_key[0]
            return _attempt(conn.execute(select(s.attempts).where(s.attempts.c.id == new_id)).one())

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
        return [_attempt(r) for r in rows]

    def attempt(self, attempt_id: int) -> Attempt:
        with self.tx() as conn:
            row = conn.execute(select(s.attempts).where(s.attempts.c.id == attempt_id)).first()
        if row is None:
            raise LedgerError(f"no attempt {attempt_id} in the ledger")
        return _attempt(row)

    # ------------------------------------------------------------------------------ leases
    def leases(self, instance_id: int, conn: Connection | None = None) -> list[Lease]:
        if conn is None:
            with self.tx() as c:
                return self.leases(instance_id, c)
        rows = conn.execute(
            select(s.leases)
            .where(s.leases.c.instance_id == instance_id)
            .order_by(s.leases.c.topic, s.leases.c.partition, s.leases.c.start_offset)
        ).all()
        return [_lease(r) for r in rows]

    def pipeline_leases(self, pipeline: str, conn: Connection | None = None) -> list[Lease]:
        if conn is None:
            with self.tx() as c:
                return self.pipeline_leases(pipeline, c)
        rows = conn.execute(
            select(s.leases)
            .where(s.leases.c.pipeline == pipeline)
            .order_by(s.leases.c.topic, s.leases.c.partition, s.leases.c.start_offset)
        ).all()
        return [_lease(r) for r in rows]

    def open_lease(
        self,
        conn: Connection,
        instance: Instance,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        allow_overlap: bool = False,
    ) -> Lease:
        """Open ``[start, end)`` for the instance; refuse an overlap with any other lease.

        ``allow_overlap`` is for a deliberate reprocessing (recovery with allow_reprocess): the
        overlapped records are applied again and the sink must be idempotent.
        """
        for other in [] if allow_overlap else self.pipeline_leases(instance.pipeline, conn):
            if other.topic != topic or other.partition != partition:
                continue
            other_end = other.end_offset if other.end_offset is not None else float("inf")
            new_end = end if end is not None else float("inf")
            if start < other_end and other.start_offset < new_end and not (start == new_end):
                raise LedgerError(
                    f"lease [{start}, {end if end is not None else '...'}) on {topic}[{partition}] overlaps "
                    f"lease {other.id} [{other.start_offset}, {other.end_offset or '...'}) of instance "
                    f"{other.instance_id}"
                )
        new_id = conn.execute(
            s.leases.insert().values(
                pipeline=instance.pipeline,
                instance_id=instance.id,
                topic=topic,
                partition=partition,
                start_offset=start,
                end_offset=end,
                next_offset=start,
                opened_at=time.time(),
            )
        ).inserted_primary_key[0]
        return _lease(conn.execute(select(s.leases).where(s.leases.c.id == new_id)).one())

    def close_lease(self, conn: Connection, lease: Lease, end: int) -> None:
        """Close an open lease at ``end`` (never below its cursor: applied offsets stay owned)."""
        if lease.end_offset is not None:
            raise LedgerError(f"lease {lease.id} is already closed at {lease.end_offset}")
        if end < lease.next_offset:
            raise LedgerError(f"cannot close lease {lease.id} at {end}: its cursor is at {lease.next_offset}")
        conn.execute(
            s.leases.update().where(s.leases.c.id == lease.id).values(end_offset=end, closed_at=time.time())
        )

    def reopen_lease(self, conn: Connection, lease: Lease) -> None:
        conn.execute(
            s.leases.update().where(s.leases.c.id == lease.id).values(end_offset=None, closed_at=None)
        )

    def delete_lease(self, conn: Connection, lease: Lease) -> None:
        if lease.next_offset != lease.start_offset:
            raise LedgerError(f"lease {lease.id} has applied offsets and cannot be deleted")
        conn.execute(s.leases.delete().where(s.leases.c.id == lease.id))

    def advance_cursor(self, conn: Connection, lease: Lease, new_offset: int) -> None:
        """Compare-and-set: move the cursor only from the value this commit read."""
        from relay.errors import CursorConflictError

        result = conn.execute(
            s.leases.update()
            .where(s.leases.c.id == lease.id, s.leases.c.next_offset == lease.next_offset)
            .values(next_offset=new_offset)
        )
        if result.rowcount != 1:
            raise CursorConflictError(
                f"cursor of lease {lease.id} ({lease.topic}[{lease.partition}]) moved away from "
                f"{lease.next_offset}: another attempt applied this range"
            )

    def take_over(self, conn: Connection, pipeline: str, to: Instance) -> list[Lease]:
        """Hand every unfinished range of non-live instances to ``to``.

        An open lease is closed at its cursor and continued by ``to`` from there; a closed but
        undrained lease (an instance that died mid-upgrade) gives its rest ``[cursor, end)`` to ``to``.
        """
        live = {i.id for i in self.instances(pipeline, conn=conn) if i.state.live and i.id != to.id}
        taken: list[Lease] = []
        for lease in self.pipeline_leases(pipeline, conn):
            if lease.instance_id == to.id or lease.instance_id in live or lease.drained:
                continue
            end = lease.end_offset
            conn.execute(
                s.leases.update()
                .where(s.leases.c.id == lease.id)
                .values(end_offset=lease.next_offset, closed_at=time.time())
            )
            if end is None or lease.next_offset < end:
                taken.append(self.open_lease(conn, to, lease.topic, lease.partition, lease.next_offset, end))
        return taken

    def frontier(self, pipeline: str) -> Offsets:
        """Per partition, the highest offset any lease of the pipeline reaches (end or cursor)."""
        out: Offsets = {}
        for lease in self.pipeline_leases(pipeline):
            reach = lease.end_offset if lease.end_offset is not None else lease.next_offset
            part = out.setdefault(lease.topic, {})
            part[lease.partition] = max(part.get(lease.partition, 0), reach)
        return out

    # ------------------------------------------------------------------------ gaps, results
    def record_gap(
        self,
        conn: Connection,
        pipeline: str,
        topic: str,
        partition: int,
        start: int,
        end: int,
        kind: str,
        reason: str,
    ) -> None:
        if end <= start:
            return
        conn.execute(
            s.gaps.insert().values(
                pipeline=pipeline,
                topic=topic,
                partition=partition,
                start_offset=start,
                end_offset=end,
                kind=kind,
                reason=reason,
                created_at=time.time(),
            )
        )

    def gaps(self, pipeline: str) -> list[Gap]:
        with self.tx() as conn:
            rows = conn.execute(
                select(s.gaps).where(s.gaps.c.pipeline == pipeline).order_by(s.gaps.c.id)
            ).all()
        return [_gap(r) for r in rows]

    def message_count(self, pipeline: str) -> int:
        with self.tx() as conn:
            value = conn.execute(
                select(s.pipelines.c.message_count).where(s.pipelines.c.name == pipeline)
            ).scalar()
        return int(value or 0)

    def dead_letter_count(self, pipeline: str) -> int:
        with self.tx() as conn:
            return int(
                conn.execute(
                    select(func.count())
                    .select_from(s.dead_letters)
                    .where(s.dead_letters.c.pipeline == pipeline)
                ).scalar_one()
            )

    def recent_batches(self, pipeline: str, limit: int = 50, instance_id: int | None = None) -> list[dict]:
        q = select(s.batches).where(s.batches.c.pipeline == pipeline)
        if instance_id is not None:
            q = q.where(s.batches.c.instance_id == instance_id)
        with self.tx() as conn:
            rows = conn.execute(q.order_by(s.batches.c.id.desc()).limit(limit)).all()
        return [dict(r._mapping) for r in rows]

    def save_report(self, pipeline: str, kind: str, status: str, body: dict) -> int:
        with self.tx() as conn:
            return int(
                conn.execute(
                    s.reports.insert().values(
                        pipeline=pipeline,
                        kind=kind,
                        status=status,
                        body=body,
                        created_at=time.time(),
                    )
                ).inserted_primary_key[0]
            )

    def reports(self, pipeline: str, kind: str, limit: int = 10) -> list[dict]:
        with self.tx() as conn:
            rows = conn.execute(
                select(s.reports)
                .where(s.reports.c.pipeline == pipeline, s.reports.c.kind == kind)
                .order_by(s.reports.c.id.desc())
                .limit(limit)
            ).all()
        return [dict(r._mapping) for r in rows]

    # ---------------------------------------------------------- operations (upgrade, recovery)
    def open_operation(
        self, pipeline: str, kind: str, state: str, params: dict, data: dict, terminal: tuple[str, ...]
    ) -> dict:
        """Start an operation unless one of any kind is still in progress for the pipeline."""
        with self.tx() as conn:
            self.ensure_pipeline(pipeline, conn)
            conn.execute(select(s.pipelines).where(s.pipelines.c.name == pipeline).with_for_update())
            busy = [
                dict(r._mapping)
                for r in conn.execute(
                    select(s.operations).where(
                        s.operations.c.pipeline == pipeline, s.operations.c.state.not_in(terminal)
                    )
                ).all()
            ]
            if busy:
                op = busy[0]
                raise OperationInProgressError(
                    f"{op['kind']} {op['id']} of pipeline {pipeline} is in progress (state {op['state']}): "
                    "resume or finish it first",
                    op,
                )
            now = time.time()
            op_id = conn.execute(
                s.operations.insert().values(
                    pipeline=pipeline,
                    kind=kind,
                    state=state,
                    params=params,
                    data=data,
                    history=[{"state": state, "at": now}],
                    created_at=now,
                    updated_at=now,
                )
            ).inserted_primary_key[0]
            return dict(conn.execute(select(s.operations).where(s.operations.c.id == op_id)).one()._mapping)

    def operation(self, op_id: int) -> dict:
        with self.tx() as conn:
            row = conn.execute(select(s.operations).where(s.operations.c.id == op_id)).first()
        if row is None:
            raise LedgerError(f"no operation {op_id}")
        return dict(row._mapping)

    def operations(self, pipeline: str, kind: str | None = None, limit: int = 10) -> list[dict]:
        q = select(s.operations).where(s.operations.c.pipeline == pipeline)
        if kind:
            q = q.where(s.operations.c.kind == kind)
        with self.tx() as conn:
            return [
                dict(r._mapping)
                for r in conn.execute(q.order_by(s.operations.c.id.desc()).limit(limit)).all()
            ]

    def in_progress(self, pipeline: str, terminal: tuple[str, ...]) -> list[dict]:
        with self.tx() as conn:
            return [
                dict(r._mapping)
                for r in conn.execute(
                    select(s.operations).where(
                        s.operations.c.pipeline == pipeline, s.operations.c.state.not_in(terminal)
                    )
                ).all()
            ]

    def move_operation(self, op_id: int, state: str, error: str | None = None, **data: Any) -> dict:
        """Persist a state transition (with its time) and merge ``data``."""
        with self.tx() as conn:
            op = dict(
                conn.execute(select(s.operations).where(s.operations.c.id == op_id).with_for_update())
                .one()
                ._mapping
            )
            now = time.time()
            history = list(op["history"])
            if history[-1]["state"] != state:
                history.append({"state": state, "at": now})
            merged = {**op["data"], **data}
            conn.execute(
                s.operations.update()
                .where(s.operations.c.id == op_id)
                .values(
                    state=state,
                    data=merged,
                    history=history,
                    error=error if error else op["error"],
                    updated_at=now,
                )
            )
            op.update(state=state, data=merged, history=history, updated_at=now)
            return op
