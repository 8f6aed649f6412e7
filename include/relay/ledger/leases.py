"""Leases: the offset ranges an instance may apply, their cursors (compare-and-set), and gaps."""

from __future__ import annotations

import time

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from relay.errors import CursorConflictError, LedgerError
from relay.ledger import schema as s
from relay.ledger.base import LedgerBase, gap_from_row, instance_from_row, lease_from_row
from relay.ledger.models import Gap, Instance, Lease, Offsets, offsets_from_json, offsets_to_json

NO_END = -1  # stands for an open lease (end_offset NULL) in the compare-and-set; offsets are >= 0
_CAS_CURSOR = (
    s.leases.update()
    .where(
        s.leases.c.id == bindparam("b_id"),
        s.leases.c.next_offset == bindparam("b_next"),
        func.coalesce(s.leases.c.end_offset, NO_END) == bindparam("b_end"),
    )
    .values(next_offset=bindparam("b_new"))
)


class LeasesMixin(LedgerBase):
    """Leases of one pipeline tile its offset space; a cursor only moves from the value a commit read."""

    def leases(self, instance_id: int, conn: Connection | None = None) -> list[Lease]:
        if conn is None:
            with self.tx() as c:
                return self.leases(instance_id, c)
        rows = conn.execute(
            select(s.leases)
            .where(s.leases.c.instance_id == instance_id)
            .order_by(s.leases.c.topic, s.leases.c.partition, s.leases.c.start_offset)
        ).all()
        return [lease_from_row(r) for r in rows]

    def pipeline_leases(self, pipeline: str, conn: Connection | None = None) -> list[Lease]:
        if conn is None:
            with self.tx() as c:
                return self.pipeline_leases(pipeline, c)
        rows = conn.execute(
            select(s.leases)
            .where(s.leases.c.pipeline == pipeline)
            .order_by(s.leases.c.topic, s.leases.c.partition, s.leases.c.start_offset)
        ).all()
        return [lease_from_row(r) for r in rows]

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
        return lease_from_row(conn.execute(select(s.leases).where(s.leases.c.id == new_id)).one())

    def close_lease(self, conn: Connection, lease: Lease, end: int) -> None:
        """Close an open lease at ``end`` (never below its cursor: applied offsets stay owned).

        Compare-and-set on the cursor the caller read: if a commit moved it meanwhile (a caller that
        did not lock the instance row first), the close fails instead of handing applied offsets on.
        """
        if lease.end_offset is not None:
            raise LedgerError(f"lease {lease.id} is already closed at {lease.end_offset}")
        if end < lease.next_offset:
            raise LedgerError(f"cannot close lease {lease.id} at {end}: its cursor is at {lease.next_offset}")
        result = conn.execute(
            s.leases.update()
            .where(
                s.leases.c.id == lease.id,
                s.leases.c.next_offset == lease.next_offset,
                s.leases.c.end_offset.is_(None),
            )
            .values(end_offset=end, closed_at=time.time())
        )
        if result.rowcount != 1:
            raise CursorConflictError(
                f"lease {lease.id} ({lease.topic}[{lease.partition}]) changed while closing it at {end}"
            )

    def advance_cursor(self, conn: Connection, lease: Lease, new_offset: int) -> None:
        """Compare-and-set: move the cursor only from the value this commit read."""
        self.advance_cursors(conn, [(lease, new_offset)])

    def advance_cursors(self, conn: Connection, moves: list[tuple[Lease, int]]) -> None:
        """Compare-and-set of every ``(lease, new_offset)`` in ONE executemany statement.

        Each cursor moves only from the value this commit read and only while the lease's end is the
        one it read (a lease closed meanwhile is not moved past its end). One prepared statement for
        all leases: building a statement per lease cost ~1.4 ms each (1,024 partitions: 1.5 s per
        commit, bench/scaling.py), the database's own work is a few microseconds per row.
        A conflict names the first lease whose cursor or end moved (the caller's transaction is rolled
        back, so the cursors that did match move nowhere).
        """
        if not moves:
            return
        params = [
            {
                "b_id": lease.id,
                "b_next": lease.next_offset,
                "b_end": NO_END if lease.end_offset is None else lease.end_offset,
                "b_new": new_offset,
            }
            for lease, new_offset in moves
        ]
        if conn.dialect.supports_sane_multi_rowcount:  # SQLite: one executemany, rows summed
            matched = conn.execute(_CAS_CURSOR, params).rowcount
            if matched == len(moves):
                return
            lost = next((lease for lease, new in moves if not self._moved_to(conn, lease, new)), moves[0][0])
        else:  # psycopg2 batches an executemany and cannot tell the rows apart: one execute each
            for (lease, _), one in zip(moves, params, strict=True):
                if conn.execute(_CAS_CURSOR, one).rowcount != 1:
                    lost = lease
                    break
            else:
                return
        raise CursorConflictError(
            f"cursor of lease {lost.id} ({lost.topic}[{lost.partition}]) moved away from "
            f"{lost.next_offset}: another attempt applied this range"
        )

    @staticmethod
    def _moved_to(conn: Connection, lease: Lease, new_offset: int) -> bool:
        """Did this statement move the lease (inside the failing transaction, before its rollback)?"""
        now = conn.execute(
            select(s.leases.c.next_offset, s.leases.c.end_offset).where(s.leases.c.id == lease.id)
        ).one()
        return (now.next_offset, now.end_offset) == (new_offset, lease.end_offset)

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

    # ------------------------------------------------------------------ planned ends (issue #12)
    def lock_planned(self, instance_id: int, conn: Connection) -> tuple[Instance, Offsets]:
        """Lock the instance row (as a commit and the handoff do) and read it with its planned ends.

        One statement. On PostgreSQL a ``FOR UPDATE`` that waited returns the row as the lock holder
        committed it, so a handoff sees the ends a planner recorded just before, and vice versa.
        """
        row = self.instance_row(instance_id, conn, lock=True)
        return instance_from_row(row), offsets_from_json(row._mapping["planned_ends"] or {})

    def raise_planned_ends(
        self, conn: Connection, instance_id: int, recorded: Offsets, ends: Offsets
    ) -> bool:
        """Record ``ends`` where they pass ``recorded`` (read by :meth:`lock_planned` in this
        transaction, the row lock held); True when it wrote. The ends only grow: a replayed or
        shorter batch changes nothing, and an empty plan writes nothing."""
        merged = {topic: dict(parts) for topic, parts in recorded.items()}
        grew = False
        for topic, parts in ends.items():
            known = merged.setdefault(topic, {})
            for partition, end in parts.items():
                if end > known.get(partition, -1):
                    known[partition] = int(end)
                    grew = True
        if grew:  # not set_instance: updated_at dates state changes (green's READY time)
            conn.execute(
                s.instances.update()
                .where(s.instances.c.id == instance_id)
                .values(planned_ends=offsets_to_json(merged))
            )
        return grew

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

    def gaps(self, pipeline: str, conn: Connection | None = None) -> list[Gap]:
        if conn is None:
            with self.tx() as c:
                return self.gaps(pipeline, c)
        rows = conn.execute(select(s.gaps).where(s.gaps.c.pipeline == pipeline).order_by(s.gaps.c.id)).all()
        return [gap_from_row(r) for r in rows]
