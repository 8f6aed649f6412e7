"""Records kept beside the protocol: dead letters, batches, reports, and persisted operations."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from relay.errors import LedgerError, OperationInProgressError
from relay.ledger import schema as s
from relay.ledger.base import LedgerBase


class RecordsMixin(LedgerBase):
    """Batches and reports for health and audit; upgrade/recovery state machines (``operations``)."""

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

    def move_operation(
        self, op_id: int, state: str, error: str | None = None, conn: Connection | None = None, **data: Any
    ) -> dict:
        """Persist a state transition (with its time) and merge ``data``.

        Pass ``conn`` to make the move part of the transaction that did the step's work, so a crash
        can never leave the work done but the state unmoved (or the reverse).
        """
        if conn is None:
            with self.tx() as c:
                return self.move_operation(op_id, state, error, c, **data)
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
        op.update(state=state, data=merged, history=history, updated_at=now, error=error or op["error"])
        return op
