"""The ledger's base: connection, transactions, row conversion, pipelines and instances.

The other parts of ``Ledger`` (attempts, leases, records) are mixins over this base, one domain each.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from relay.errors import (
    LedgerError,
    LedgerUnavailableError,
)
from relay.ledger import schema as s
from relay.ledger.engine import open_engine, safe_url
from relay.ledger.models import (
    Attempt,
    AttemptState,
    Color,
    Gap,
    Instance,
    InstanceState,
    Lease,
)


def ledger_error(exc: SQLAlchemyError, what: str) -> LedgerError:
    """Wrap a vendor error: unreachable or locked databases are transient, the rest are not."""
    transient = isinstance(exc, PoolTimeoutError) or (
        isinstance(exc, DBAPIError)
        and (exc.connection_invalidated or type(exc).__name__ in ("OperationalError", "InterfaceError"))
    )
    return (LedgerUnavailableError if transient else LedgerError)(f"{what}: {exc}")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def instance_from_row(row: Row) -> Instance:
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
        role=m["role"],
        resources=m["resources"],
    )


def attempt_from_row(row: Row) -> Attempt:
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
        driver_id=m["driver_id"],
    )


def lease_from_row(row: Row) -> Lease:
    return Lease(**dict(row._mapping))


def gap_from_row(row: Row) -> Gap:
    return Gap(**dict(row._mapping))


class LedgerBase:
    """Access to one ledger database. Cheap to create; connects lazily through a pooled engine."""

    def __init__(self, url: str, create: bool = False) -> None:
        """``create``: make the ledger now when it does not exist; without it, a URL that names no
        ledger is refused on first use (LedgerNotFoundError) and nothing is created."""
        self.url = url
        self.create = create
        self._engine: Engine | None = None
        if create:
            self.engine  # noqa: B018 - an explicit create happens now, not at some later first use

    @property
    def engine(self) -> Engine:
        """Connects on first use; an existing ledger of an older schema is migrated (see engine.py)."""
        if self._engine is None:
            try:
                self._engine = open_engine(self.url, create=self.create)
            except SQLAlchemyError as exc:
                raise ledger_error(exc, f"cannot open the ledger at {self.safe_url}") from exc
        return self._engine

    @property
    def safe_url(self) -> str:
        """The URL without any part of its password, for messages."""
        return safe_url(self.url)

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
            raise ledger_error(exc, f"ledger transaction failed ({self.safe_url})") from exc

    # ----------------------------------------------------------------- pipelines and instances
    def ensure_pipeline(self, name: str, conn: Connection | None = None) -> None:
        if conn is None:
            with self.tx() as c:
                return self.ensure_pipeline(name, c)
        if conn.execute(select(s.pipelines.c.name).where(s.pipelines.c.name == name)).first() is None:
            conn.execute(s.pipelines.insert().values(name=name, epoch_seq=0, created_at=time.time()))

    def create_instance(
        self,
        conn: Connection,
        pipeline: str,
        version: str,
        color: Color,
        checkpoint_dir: str,
        app_name: str,
        state: InstanceState = InstanceState.STARTING,
        role: str | None = None,
        resources: dict[str, Any] | None = None,
    ) -> Instance:
        self.ensure_pipeline(pipeline, conn)
        now = time.time()
        new_id = conn.execute(
            s.instances.insert().values(
                pipeline=pipeline,
                version=version,
                color=color.value,
                state=state.value,
                checkpoint_dir=checkpoint_dir,
                current_epoch=0,
                stop_requested=False,
                app_name=app_name,
                created_at=now,
                updated_at=now,
                role=role,
                resources=resources,
            )
        ).inserted_primary_key[0]
        return self.instance(new_id, conn)

    def instance(self, instance_id: int, conn: Connection | None = None, lock: bool = False) -> Instance:
        if conn is None:
            with self.tx() as c:
                return self.instance(instance_id, c)
        return instance_from_row(self.instance_row(instance_id, conn, lock))

    def instance_row(self, instance_id: int, conn: Connection, lock: bool = False) -> Row:
        """The instance's row (locked FOR UPDATE with ``lock``); LedgerError when there is none."""
        q = select(s.instances).where(s.instances.c.id == instance_id)
        row = conn.execute(q.with_for_update() if lock else q).first()
        if row is None:
            raise LedgerError(f"no instance {instance_id} in the ledger")
        return row

    def instances(
        self, pipeline: str, live_only: bool = False, conn: Connection | None = None
    ) -> list[Instance]:
        if conn is None:
            with self.tx() as c:
                return self.instances(pipeline, live_only, c)
        rows = conn.execute(
            select(s.instances).where(s.instances.c.pipeline == pipeline).order_by(s.instances.c.id)
        ).all()
        found = [instance_from_row(r) for r in rows]
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

    def mark_ready(self, instance_id: int) -> bool:
        """STANDBY -> READY, only from STANDBY (never undoes a handoff that already started it)."""
        with self.tx() as conn:
            done = conn.execute(
                s.instances.update()
                .where(s.instances.c.id == instance_id, s.instances.c.state == InstanceState.STANDBY.value)
                .values(state=InstanceState.READY.value, updated_at=time.time())
            ).rowcount
        return done == 1

    def request_stop(self, instance_id: int) -> None:
        """Ask the instance's drivers to stop between batches (read by the source and the driver)."""
        self.set_instance(instance_id, stop_requested=True)

    def fence(self, instance_id: int, reason: str, conn: Connection | None = None) -> None:
        """Make every attempt of the instance a zombie: none of them can commit again."""
        self.set_instance(instance_id, conn, state=InstanceState.FENCED, error=reason)

    # ---------------------------------------------------------------------------- attempts
