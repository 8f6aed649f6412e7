"""The cursor-only commit of executor-side sinks, the tasks' ranges and counts, and the range audit."""

from __future__ import annotations

import pyarrow as pa
import pytest
from relay.audit import audit_ledger
from relay.audit.coverage import RangeCoverage
from relay.errors import SourceGapError, ZombieAttemptError
from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.pipeline.tasks import counts_from, partition_writer, sum_results
from relay.protocol import commit_cursors, prepare_batch
from relay.sinks.base import FencedWriteError, TaskContext, TaskResult

T = "users"


def started(ledger: Ledger, starts: dict[int, int]):
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", "v1", Color.BLUE, "/nonexistent", "relay-p")
        if not ledger.take_over(conn, "p", inst):
            for part, off in starts.items():
                ledger.open_lease(conn, inst, T, part, off)
    return inst, ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))


def test_cursors_move_to_the_planned_end_and_a_replay_is_a_no_op(ledger) -> None:
    inst, att = started(ledger, {0: 0, 1: 10})
    end = {T: {0: 5, 1: 12}}
    assert prepare_batch(ledger, att, None, end) == {(T, 0): (0, 5), (T, 1): (10, 12)}
    res = commit_cursors(ledger, att, 0, None, end, TaskResult(7, 6, 1, 0))
    assert (res.rows_read, res.rows_applied, res.rows_skipped, res.dead_letters) == (7, 6, 1, 0)
    assert {r["sink"] for r in res.ranges} == {"executor"}
    assert sorted(le.next_offset for le in ledger.leases(inst.id)) == [5, 12]
    assert ledger.instance(inst.id).state is InstanceState.ACTIVE
    # The driver died after the commit: the replayed batch has nothing left to apply or move.
    assert prepare_batch(ledger, att, None, end) == {}
    assert commit_cursors(ledger, att, 0, None, end, TaskResult()).ranges == []


def test_a_superseded_attempt_can_neither_prepare_nor_commit(ledger) -> None:
    inst, old = started(ledger, {0: 0})
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    with pytest.raises(ZombieAttemptError):
        prepare_batch(ledger, old, None, {T: {0: 5}})
    with pytest.raises(ZombieAttemptError):
        commit_cursors(ledger, old, 0, None, {T: {0: 5}}, TaskResult())
    assert ledger.leases(inst.id)[0].next_offset == 0


def test_a_batch_starting_past_a_cursor_is_refused(ledger) -> None:
    _, att = started(ledger, {0: 0})
    with pytest.raises(SourceGapError):
        commit_cursors(ledger, att, 3, {T: {0: 4}}, {T: {0: 9}}, TaskResult())


def test_ranges_span_an_undrained_lease_and_the_next_one(ledger) -> None:
    blue, blue_attempt = started(ledger, {0: 0})
    commit_cursors(ledger, blue_attempt, 0, None, {T: {0: 3}}, TaskResult())
    with ledger.tx() as conn:
        ledger.close_lease(conn, ledger.leases(blue.id, conn)[0], 6)
        ledger.set_instance(blue.id, conn, state=InstanceState.FAILED)  # blue died mid-upgrade
        green = ledger.create_instance(conn, "p", "v2", Color.GREEN, "/nonexistent", "relay-p2")
        ledger.take_over(conn, "p", green)  # blue's rest [3, 6)
        ledger.open_lease(conn, green, T, 0, 6)
    att = ledger.start_attempt(green.id, ledger.issue_launch_token(green.id))
    assert prepare_batch(ledger, att, None, {T: {0: 9}}) == {(T, 0): (3, 9)}
    commit_cursors(ledger, att, 0, None, {T: {0: 9}}, TaskResult())
    report = audit_ledger(ledger, "p", T, lambda: ({0: 0}, {0: 9}))
    assert report.ok and report.partitions[0].applied_once == 9, report.to_json()


def test_the_range_audit_sees_a_double_commit_and_an_unapplied_offset() -> None:
    cov = RangeCoverage([(0, 5), (5, 8), (4, 6), (10, 12)])
    c = cov.counts(0, 12)
    assert (c.handled, c.once, c.duplicates) == (10, 8, 2)
    assert cov.duplicate_offsets(0, 12, 10) == [4, 5]
    assert cov.missing_ranges(0, 12, 10, 2) == [(8, 10)]


class ListSink:
    def __init__(self, fenced: bool = False) -> None:
        self.fenced = fenced

    def write_task(self, ctx, rows):  # noqa: ANN001, ANN201
        rows = list(rows)
        if self.fenced:
            raise FencedWriteError("epoch 3 is current")
        kept = [r for r in rows if ctx.allows(r["topic"], r["partition"], r["offset"])]
        return TaskResult(rows_in=len(rows), rows_written=len(kept), rows_skipped=len(rows) - len(kept))


def test_a_task_returns_one_row_of_counts_and_reports_a_fence_as_data() -> None:
    ctx = TaskContext("p", 1, 2, 0, {(T, 0): (1, 3)})
    batch = pa.RecordBatch.from_pylist([{"topic": T, "partition": 0, "offset": o, "v": o} for o in range(4)])
    out = list(partition_writer(ListSink(), ctx)(iter([batch])))
    assert [b.to_pylist() for b in out] == [
        [{"rows_in": 4, "rows_written": 2, "rows_skipped": 2, "rows_unchanged": 0, "fenced": ""}]
    ]
    fenced = list(partition_writer(ListSink(fenced=True), ctx)(iter([batch])))[0].to_pylist()
    total, why = sum_results([*out[0].to_pylist(), *fenced])
    assert total == TaskResult(4, 2, 2, 0) and why == ["epoch 3 is current"]
    empty = list(partition_writer(ListSink(fenced=True), ctx)(iter([])))[0].to_pylist()
    assert empty[0]["fenced"] == ""  # an empty partition opens no sink transaction
    assert counts_from(5) == TaskResult(5, 5) and counts_from(None) == TaskResult()
