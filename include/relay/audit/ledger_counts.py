"""The audit's questions to the ledger, as SQL aggregates over offset ranges (SQLite and PostgreSQL).

Nothing here loops over every offset in Python: counts come from ``count(DISTINCT offset)`` over
the ``(pipeline, topic, partition, offset)`` index of the counter's ``messages`` (its sink's table,
``relay.sinks.ledger_messages_tables``; a ``GROUP BY offset`` only when some offset has several
rows), examples from bounded queries (``HAVING count(*) > 1 ... LIMIT``,
bisection by distinct-offset counts), and the deep audit gets the applied offsets as one ordered
stream. Dead letters are few and have no such index: they are counted per range and merged in.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Subquery, Table, case, distinct, func, select
from sqlalchemy.engine import Connection

from relay.audit.segments import Span
from relay.ledger import schema as s
from relay.sinks import ledger_messages_tables as counter
from relay.sinks.ledger_messages_tables import messages

STREAM_ROWS = 10_000  # rows fetched at a time by the ordered streams (bounded memory)
SCAN_OFFSETS = 4096  # ranges this small are checked offset by offset when listing missing ranges


@dataclass(frozen=True)
class Key:
    pipeline: str
    topic: str
    partition: int


@dataclass(frozen=True)
class Counts:
    """Distinct offsets of one range by how often they were applied (rows + dead letters)."""

    handled: int  # offsets with at least one row or dead letter
    once: int  # exactly one
    duplicates: int  # more than one
    dead_once: int  # exactly one, and it is a dead letter


def _in(table: Table, key: Key, a: int, b: int) -> list[ColumnElement[bool]]:
    return [
        table.c.pipeline == key.pipeline,
        table.c.topic == key.topic,
        table.c.partition == key.partition,
        table.c.offset >= a,
        table.c.offset < b,
    ]


def spans(conn: Connection, pipeline: str, topic: str) -> dict[int, tuple[list[Span], list[Span]]]:
    """Per partition, (leases, gaps) of the pipeline on ``topic``. Read first: it fixes the snapshot."""
    out: dict[int, tuple[list[Span], list[Span]]] = {}
    le, g = s.leases, s.gaps
    for row in conn.execute(
        select(le.c.partition, le.c.start_offset, le.c.end_offset, le.c.next_offset).where(
            le.c.pipeline == pipeline, le.c.topic == topic
        )
    ):
        out.setdefault(row.partition, ([], []))[0].append(
            Span(row.start_offset, row.end_offset, row.next_offset)
        )
    for row in conn.execute(
        select(g.c.partition, g.c.start_offset, g.c.end_offset).where(
            g.c.pipeline == pipeline, g.c.topic == topic
        )
    ):
        out.setdefault(row.partition, ([], []))[1].append(Span(row.start_offset, row.end_offset))
    return out


def _dead_per_offset(key: Key, a: int, b: int) -> Subquery:
    """Per dead-lettered offset of ``[a, b)``: ``dn`` dead letters and ``mn`` sink rows there too."""
    m, d = messages, s.dead_letters
    per_d = (
        select(d.c.offset, func.count().label("dn")).where(*_in(d, key, a, b)).group_by(d.c.offset).subquery()
    )
    rows_there = (
        select(func.count())
        .select_from(m)
        .where(
            m.c.pipeline == key.pipeline,
            m.c.topic == key.topic,
            m.c.partition == key.partition,
            m.c.offset == per_d.c.offset,
        )
        .scalar_subquery()
    )
    return select(per_d.c.offset, per_d.c.dn, rows_there.label("mn")).subquery()


def _n_where(cond: ColumnElement[bool]) -> ColumnElement[int]:
    return func.coalesce(func.sum(case((cond, 1), else_=0)), 0)


def counts(conn: Connection, key: Key, a: int, b: int) -> Counts:
    """How the offsets of ``[a, b)`` were applied, in two aggregate queries."""
    m = messages
    n_rows, m_offsets = conn.execute(
        select(func.count(), func.count(distinct(m.c.offset))).where(*_in(m, key, a, b))
    ).one()
    m_dups = 0
    if n_rows != m_offsets:  # some offset has several rows: count those offsets (a GROUP BY, slower)
        per = select(m.c.offset, func.count().label("n")).where(*_in(m, key, a, b)).group_by(m.c.offset)
        per = per.subquery()
        m_dups = conn.execute(select(_n_where(per.c.n > 1))).scalar_one()
    both = _dead_per_offset(key, a, b)
    dead_only, dead_once, dead_dup, row_and_dead = conn.execute(
        select(
            _n_where(both.c.mn == 0),
            _n_where((both.c.mn == 0) & (both.c.dn == 1)),
            _n_where((both.c.mn == 0) & (both.c.dn > 1)),
            _n_where(both.c.mn == 1),  # one row plus a dead letter: applied twice (mn > 1 is in m_dups)
        )
    ).one()
    n_handled = int(m_offsets) + int(dead_only)
    dups = int(m_dups) + int(dead_dup) + int(row_and_dead)
    return Counts(n_handled, n_handled - dups, dups, int(dead_once))


def duplicate_offsets(conn: Connection, key: Key, a: int, b: int, limit: int) -> list[int]:
    """The first ``limit`` offsets of ``[a, b)`` applied more than once."""
    m = messages
    rows = select(m.c.offset).where(*_in(m, key, a, b)).group_by(m.c.offset).having(func.count() > 1)
    found = set(conn.execute(rows.order_by(m.c.offset).limit(limit)).scalars())
    both = _dead_per_offset(key, a, b)
    dead = select(both.c.offset).where((both.c.dn > 1) | (both.c.mn > 0)).order_by(both.c.offset).limit(limit)
    found.update(conn.execute(dead).scalars())
    return sorted(found)[:limit]


def row_offsets(conn: Connection, key: Key, a: int, b: int, limit: int) -> list[int]:
    """The first ``limit`` offsets of ``[a, b)`` with a row or a dead letter."""
    m, d = messages, s.dead_letters
    found = set()
    for table in (m, d):
        q = select(table.c.offset).where(*_in(table, key, a, b)).distinct()
        found.update(conn.execute(q.order_by(table.c.offset).limit(limit)).scalars())
    return sorted(found)[:limit]


def handled(conn: Connection, key: Key, a: int, b: int) -> int:
    """Offsets of ``[a, b)`` with a row or a dead letter (index-only counts)."""
    m = messages
    rows = conn.execute(select(func.count(distinct(m.c.offset))).where(*_in(m, key, a, b))).scalar_one()
    both = _dead_per_offset(key, a, b)
    dead_only = conn.execute(select(func.count()).select_from(both).where(both.c.mn == 0)).scalar_one()
    return int(rows) + int(dead_only)


def _scan(conn: Connection, key: Key, a: int, b: int) -> list[tuple[int, int]]:
    """Ranges of ``[a, b)`` without a row or a dead letter, from the offsets themselves (small ranges)."""
    seen: set[int] = set()
    for table in (messages, s.dead_letters):
        seen.update(conn.execute(select(table.c.offset).where(*_in(table, key, a, b)).distinct()).scalars())
    out: list[tuple[int, int]] = []
    for offset in range(a, b):
        if offset not in seen:
            _append(out, offset, offset + 1)
    return out


def _append(ranges: list[tuple[int, int]], a: int, b: int) -> None:
    if ranges and ranges[-1][1] == a:
        ranges[-1] = (ranges[-1][0], b)
    else:
        ranges.append((a, b))


def missing_ranges(
    conn: Connection, key: Key, a: int, b: int, limit: int, empty: int
) -> list[tuple[int, int]]:
    """The first ``limit`` ranges of ``[a, b)`` with neither a row nor a dead letter.

    ``empty`` is how many offsets of ``[a, b)`` have none (from ``counts``). Bisection by counts: a
    half whose distinct offsets fill it is skipped whole, only halves with something missing are
    split further, and ranges of at most SCAN_OFFSETS offsets are read directly. Counting distinct
    offsets over the index is the cheapest full pass SQLite has (a ``LAG()`` window over 10^6 rows
    was ~10x slower there), and the left-first walk stops once ``limit`` ranges are found.
    """
    out: list[tuple[int, int]] = []

    def visit(lo: int, hi: int, none: int) -> None:
        if none == 0 or len(out) > limit:
            return
        if none == hi - lo:
            _append(out, lo, hi)
        elif hi - lo <= SCAN_OFFSETS:
            for x, y in _scan(conn, key, lo, hi):
                _append(out, x, y)
        else:
            mid = (lo + hi) // 2
            left = (mid - lo) - handled(conn, key, lo, mid)
            visit(lo, mid, left)
            visit(mid, hi, none - left)

    visit(a, b, empty)
    return out[:limit]  # the range after the limit-th may have been cut short: never reported


def _ordered(conn: Connection, table: Table, key: Key, a: int, b: int) -> Iterator[int]:
    """Distinct offsets of ``table`` in ``[a, b)``, ascending, fetched STREAM_ROWS at a time."""
    q = select(table.c.offset).where(*_in(table, key, a, b)).group_by(table.c.offset).order_by(table.c.offset)
    for chunk in conn.execute(q, execution_options={"yield_per": STREAM_ROWS}).scalars().partitions():
        yield from chunk


def applied_stream(conn: Connection, key: Key, a: int, b: int) -> Iterator[int]:
    """Every offset of ``[a, b)`` with a row or a dead letter, ascending, each once, streamed."""
    d = s.dead_letters
    rows = _ordered(conn, messages, key, a, b) if counter.tables_exist(conn) else iter(())
    if not conn.execute(select(d.c.offset).where(*_in(d, key, a, b)).limit(1)).first():
        yield from rows  # the usual case: no dead letter to merge in
        return
    previous = None
    for offset in heapq.merge(rows, _ordered(conn, d, key, a, b)):
        if offset != previous:
            yield offset
            previous = offset


def sink_totals(conn: Connection, pipeline: str) -> tuple[int, int]:
    """(the counter's running count, the rows in its table): its sink keeps them equal; (0, 0) for a
    pipeline whose sink is not the counter's."""
    return counter.totals(conn, pipeline)


def has_counter_tables(conn: Connection) -> bool:
    """True when the counter's sink created its tables in this ledger's database (``SqlRows`` reads them)."""
    return counter.tables_exist(conn)


def has_message_ranges(conn: Connection, pipeline: str) -> bool:
    """True when ``LedgerMessagesSink`` wrote for ``pipeline``: its rows are in this ledger, count them."""
    return counter.has_ranges(conn, pipeline)
