"""The audit's SQL aggregates and its deep comparison on real SQLite ledgers, without a broker.

Ledgers are built by hand (leases, cursors, gaps, sink rows, dead letters) so that each test states
exactly the situation it judges; Kafka's offsets and record offsets are given as plain values.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
from relay.audit import audit_ledger, render
from relay.audit.report import AuditReport
from relay.errors import LedgerError
from relay.ledger import schema as s
from relay.ledger.snapshot import read_snapshot
from relay.ledger.store import Ledger
from relay.sinks import ledger_messages_tables as counter
from sqlalchemy import func, select

from tests.counter_batches import counted
from tests.ledger_builder import LedgerBuilder

P, T = "p", "t"


@pytest.fixture()
def b(ledger: Ledger) -> LedgerBuilder:
    return LedgerBuilder(ledger, P, T)


def run(
    ledger: Ledger,
    latest: dict[int, int],
    earliest: dict[int, int] | None = None,
    records: dict[int, list[int]] | None = None,
    **kw,
) -> AuditReport:
    """Audit with Kafka's offsets given; ``records`` (deep mode) lists each partition's record offsets."""
    first = earliest or dict.fromkeys(latest, 0)
    source = None
    if records is not None:

        def source(partition: int, start: int, end: int) -> Iterable[int]:
            return (o for o in records[partition] if start <= o < end)

    report = audit_ledger(ledger, P, T, lambda: (first, latest), records=source, **kw)
    data = report.to_json()
    for p in data["partitions"]:  # every audited offset lands in exactly one bucket
        buckets = ("applied_once", "duplicates", "declared_lost", "unread", "not_applied_below_cursor")
        assert sum(p[b] for b in buckets) + p["applied_unread"] == p["audited_to"] - p["audited_from"], p
    return report


def test_caught_up_pipeline_with_every_offset_applied_once_is_ok(ledger, b):
    inst = b.instance()
    for p in (0, 1):
        b.lease(inst, p, 0, 100)
        b.rows(inst, p, range(100))
    report = run(ledger, {0: 100, 1: 100})
    assert report.ok and report.mode == "shallow"
    assert report.totals["applied_once"] == 200 and report.totals["missing"] == 0
    assert [p.frontier for p in report.partitions] == [100, 100]
    assert report.message_count == report.applied_rows == 200


def test_stopped_pipeline_with_unread_records_is_ok_and_reports_them_unread(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 60)
    b.rows(inst, 0, range(60))
    report = run(ledger, {0: 100})
    p0 = report.partitions[0]
    assert report.ok, report.to_json()
    assert (p0.applied_once, p0.unread, p0.missing, p0.frontier) == (60, 40, 0, 60)
    assert "40 offset(s) at or after the cursors are not read yet" in report.notes[0]
    assert "OK" in render(report.to_json()).splitlines()[-1]


def test_offset_applied_twice_is_a_duplicate_and_listed(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 100)
    b.rows(inst, 0, range(100))
    b.rows(inst, 0, [5, 7, 7])
    report = run(ledger, {0: 100})
    p0 = report.partitions[0]
    assert not report.ok
    assert (p0.duplicates, p0.applied_twice_or_more, p0.applied_once) == (2, 2, 98)
    assert p0.examples["duplicates"] == [5, 7]
    assert report.to_json()["partitions"][0]["applied_twice_or_more"] == 2


def test_offsets_below_the_cursor_without_row_are_missing_in_shallow_mode(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 100)
    b.rows(inst, 0, [o for o in range(100) if o not in (0, 10, 11, 12, 50, 99)])
    report = run(ledger, {0: 120})
    p0 = report.partitions[0]
    assert not report.ok
    assert (p0.missing, p0.not_applied_below_cursor, p0.holes, p0.unread) == (6, 6, None, 20)
    assert p0.examples["missing"] == [[0, 1], [10, 13], [50, 51], [99, 100]]
    assert any("relay audit --deep" in n for n in report.notes)
    assert "partition 0 missing: [0, 1), [10, 13), [50, 51), [99, 100)" in render(report.to_json())


def test_declared_gap_is_lost_not_missing_and_the_rest_is_unread(ledger, b):
    old, new = b.instance(), b.instance()
    b.lease(old, 0, 0, 30, end=30)  # closed at its cursor by the recovery
    b.gap(0, 30, 50)  # deleted by retention before it was applied
    b.lease(new, 0, 50, 80)
    b.rows(old, 0, range(30))
    b.rows(new, 0, range(50, 80))
    report = run(ledger, {0: 90}, earliest={0: 50})
    p0 = report.partitions[0]
    assert report.ok, report.to_json()
    assert (p0.applied_once, p0.declared_lost, p0.unread, p0.missing) == (60, 20, 10, 0)


def test_dead_letter_counts_as_applied_once_and_with_a_row_as_a_duplicate(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 20)
    b.rows(inst, 0, [o for o in range(20) if o not in (3, 4, 5)])
    b.dead(inst, 0, [3, 4, 4, 9])  # 4 dead-lettered twice, 9 has a row too
    report = run(ledger, {0: 20})
    p0 = report.partitions[0]
    assert (p0.applied_once, p0.dead_letters, p0.duplicates, p0.missing) == (17, 1, 2, 1)
    assert p0.examples["duplicates"] == [4, 9] and p0.examples["missing"] == [[5, 6]]


def test_several_leases_per_partition_mid_upgrade_count_each_unread_rest(ledger, b):
    blue, green = b.instance(), b.instance("v2")
    b.lease(blue, 0, 0, 40, end=50)  # blue drains towards the handoff at 50
    b.lease(green, 0, 50, 70)
    b.rows(blue, 0, range(40))
    b.rows(green, 0, range(50, 70))
    report = run(ledger, {0: 80})
    p0 = report.partitions[0]
    assert report.ok, report.to_json()
    assert (p0.applied_once, p0.unread, p0.frontier) == (60, 20, 70)
    # the audit the upgrade's DONE step runs: only below green's cursor
    assert run(ledger, {0: 80}, until={0: 70}).partitions[0].unread == 10


def test_offsets_in_no_lease_below_the_frontier_are_missing(ledger, b):
    first, second = b.instance(), b.instance()
    b.lease(first, 0, 0, 40, end=40)
    b.lease(second, 0, 60, 80)  # [40, 60) was never leased nor declared lost
    b.rows(first, 0, range(40))
    b.rows(second, 0, range(60, 80))
    p0 = run(ledger, {0: 80}).partitions[0]
    assert (p0.missing, p0.examples["missing"]) == (20, [[40, 60]])


def test_row_beyond_the_cursor_was_written_outside_the_protocol(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 60)
    b.rows(inst, 0, [*range(60), 70])
    report = run(ledger, {0: 100})
    p0 = report.partitions[0]
    assert not report.ok
    assert (p0.applied_unread, p0.unread, p0.examples["applied_unread"]) == (1, 39, [70])


def test_since_and_until_limit_the_audit_to_a_window(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 100)
    b.rows(inst, 0, [o for o in range(100) if o != 5])
    assert run(ledger, {0: 100}).partitions[0].missing == 1
    window = run(ledger, {0: 100}, since={0: 10}, until={0: 50})
    p0 = window.partitions[0]
    assert window.ok and (p0.audited_from, p0.audited_to, p0.applied_once) == (10, 50, 40)


def test_offsets_before_the_first_lease_are_not_the_pipelines(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 1000, 1010)  # started at "latest": [0, 1000) was never its business
    b.rows(inst, 0, range(1000, 1010))
    report = run(ledger, {0: 1010})
    assert report.ok and report.partitions[0].audited_from == 1000


def test_sink_count_different_from_its_rows_is_not_ok(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 3)
    b.rows(inst, 0, range(3))
    with ledger.tx() as conn:
        conn.execute(counter.counter_totals.update().values(message_count=4))
    report = run(ledger, {0: 3})
    assert not report.ok and "differs from its rows" in report.notes[-1]


def test_a_ledger_where_the_counter_never_ran_has_none_of_its_tables_and_audits_all_the_same(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 0)  # another sink's pipeline, nothing committed yet
    with ledger.tx() as conn:
        assert not counter.tables_exist(conn)
    for records in (None, {0: list(range(5))}):
        report = run(ledger, {0: 5}, records=records)
        assert report.ok and report.totals["unread"] == 5, report.to_json()
        assert report.message_count == report.applied_rows == 0


def test_deep_tells_offsets_without_a_record_from_missing_records(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 16)
    # 5 and 15 are commit markers, 6-8 an aborted transaction, 9 its abort marker; 12 was never applied
    visible = [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    b.rows(inst, 0, [o for o in visible if o != 12])
    shallow = run(ledger, {0: 16})
    assert (shallow.partitions[0].missing, shallow.ok) == (7, False)
    report = run(ledger, {0: 16}, records={0: visible})
    p0 = report.partitions[0]
    assert report.mode == "deep" and not report.ok
    assert (p0.not_applied_below_cursor, p0.holes, p0.missing) == (7, 6, 1)
    assert p0.examples["missing"] == [[12, 13]]
    assert p0.examples["holes"] == [[5, 10], [15, 16]]
    b.rows(inst, 0, [12])
    assert run(ledger, {0: 16}, records={0: visible}).ok


def test_deep_below_the_earliest_offset_only_a_gap_excuses_an_unapplied_offset(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 30)
    b.rows(inst, 0, [*range(10), *range(20, 30)])  # [10, 20) deleted before it was applied
    records = {0: list(range(20, 30))}
    p0 = run(ledger, {0: 30}, earliest={0: 20}, records=records).partitions[0]
    assert (p0.missing, p0.holes, p0.examples["missing"]) == (10, 0, [[10, 20]])
    b.gap(0, 10, 20)
    report = run(ledger, {0: 30}, earliest={0: 20}, records=records)
    assert report.ok and report.partitions[0].declared_lost == 10


def test_deep_reports_rows_at_offsets_without_a_record(ledger, b):
    inst = b.instance()
    b.lease(inst, 0, 0, 10)
    b.rows(inst, 0, range(10))
    report = run(ledger, {0: 10}, records={0: [0, 1, 2, 3, 4, 6, 7, 8, 9]})  # 5 compacted since
    p0 = report.partitions[0]
    assert report.ok and (p0.applied_without_record, p0.examples["applied_without_record"]) == (1, [5])


def test_audit_snapshot_neither_blocks_nor_sees_a_concurrent_commit(ledger, b):
    """A long audit must not stall the pipeline's commits, nor mix two states of the ledger."""
    inst = b.instance()
    b.lease(inst, 0, 0, 3)
    b.rows(inst, 0, range(3))
    count = select(func.count()).select_from(counter.messages)
    with read_snapshot(ledger) as conn:
        before = conn.execute(count).scalar_one()
        b.rows(inst, 0, [3])  # a commit while the audit reads (would wait 60 s on a held write lock)
        during = conn.execute(count).scalar_one()
    assert (before, during, counted(ledger, P)) == (3, 3, 4)
    with pytest.raises(LedgerError, match="readonly"), read_snapshot(ledger) as conn:
        conn.execute(s.gaps.delete())


def test_shallow_audit_of_a_million_offsets_takes_seconds(ledger, b):
    """Scale check: the counts are SQL aggregates (the old audit looped in Python per offset)."""
    inst = b.instance()
    n = 1_000_000
    b.lease(inst, 0, 0, n)
    b.rows(inst, 0, [])  # the counter's tables, as its sink creates them
    with ledger.tx() as conn:  # 10^6 sink rows in one statement, minus a missing range, plus a duplicate
        conn.exec_driver_sql(
            "INSERT INTO message_ranges (pipeline, topic, partition, start_offset, end_offset, instance_id, "
            "epoch, batch_id, created_at) VALUES (?, ?, 0, 0, ?, ?, 1, 0, 0)",
            (P, T, n, inst.id),
        )
        conn.exec_driver_sql(
            'INSERT INTO messages (pipeline, topic, partition, "offset", key, value, instance_id, version, '
            "batch_id) WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c WHERE x < ?) "
            "SELECT ?, ?, 0, x, NULL, NULL, ?, 'v1', 0 FROM c WHERE x NOT BETWEEN 500000 AND 500009",
            (n - 1, P, T, inst.id),
        )
        conn.exec_driver_sql(
            'INSERT INTO messages (pipeline, topic, partition, "offset", instance_id, version, batch_id) '
            "VALUES (?, ?, 0, 777777, ?, 'v1', 0)",
            (P, T, inst.id),
        )
    t0 = time.perf_counter()
    report = run(ledger, {0: n + 1000})
    shallow_s = time.perf_counter() - t0
    p0 = report.partitions[0]
    assert (p0.applied_once, p0.duplicates, p0.missing, p0.unread) == (n - 11, 1, 10, 1000)
    assert p0.examples == {"duplicates": [777777], "missing": [[500000, 500010]]}
    records = {0: [o for o in range(n) if not 500000 <= o < 500005]}  # half the missing range: holes
    t0 = time.perf_counter()
    deep = run(ledger, {0: n + 1000}, records=records).partitions[0]
    deep_s = time.perf_counter() - t0
    assert (deep.holes, deep.missing) == (5, 5)
    print(f"\naudit of 10^6 offsets: shallow {shallow_s:.2f}s, deep walk (records in memory) {deep_s:.2f}s")
