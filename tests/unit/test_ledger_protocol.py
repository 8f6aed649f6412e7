"""The commit protocol against a real SQLite ledger, through the counter's sink as the pipeline
driver runs it (``tests/counter_batches.py``): zombies, replays, holes, leases that tile."""

from __future__ import annotations

import pytest
from relay.errors import LedgerError, SourceGapError, ZombieAttemptError
from relay.ledger import schema as s
from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.protocol.guard import read_source_guard
from sqlalchemy import func, select

from tests.counter_batches import applied, counted, counter_batch, row

T = "experience"


def new_instance(ledger: Ledger, starts: dict[int, int] | None = None, version: str = "v1", color=Color.BLUE):
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", version, color, "/nonexistent", "relay-p")
        taken = ledger.take_over(conn, "p", inst)
        if not taken and starts:
            for part, off in starts.items():
                ledger.open_lease(conn, inst, T, part, off)
    return inst


def recs(partition: int, offsets, key=None) -> list[dict]:
    return [row(T, partition, o, (key or str(o)).encode()) for o in offsets]


def test_batch_applies_rows_and_moves_cursor_to_planned_end(ledger):
    inst = new_instance(ledger, {0: 0})
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    # offset 3 is a hole (transaction marker): the cursor still reaches the planned end 5
    res = counter_batch(ledger, att, 0, None, {T: {0: 5}}, recs(0, [0, 1, 2, 4]))
    assert res.rows_applied == 4
    assert ledger.leases(inst.id)[0].next_offset == 5
    assert counted(ledger, "p") == 4
    assert ledger.instance(inst.id).state is InstanceState.ACTIVE


def test_replayed_batch_is_a_no_op(ledger):
    inst = new_instance(ledger, {0: 0})
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    counter_batch(ledger, att, 0, None, {T: {0: 3}}, recs(0, range(3)))
    again = ledger.start_attempt(
        inst.id, ledger.issue_launch_token(inst.id)
    )  # the driver was killed after the ledger commit
    res = counter_batch(ledger, again, 0, None, {T: {0: 3}}, recs(0, range(3)))
    assert res.rows_applied == 0 and res.rows_skipped == 3  # outside every range: the cursor is at 3
    assert applied(ledger, "p") == [(0, 0), (0, 1), (0, 2)]


def test_stale_epoch_is_fenced_and_writes_nothing(ledger):
    inst = new_instance(ledger, {0: 0})
    old = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    with pytest.raises(ZombieAttemptError):
        counter_batch(ledger, old, 0, None, {T: {0: 3}}, recs(0, range(3)))
    assert applied(ledger, "p") == [] and ledger.leases(inst.id)[0].next_offset == 0


def test_fenced_instance_cannot_commit(ledger):
    inst = new_instance(ledger, {0: 0})
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    ledger.fence(inst.id, "test")
    with pytest.raises(ZombieAttemptError):
        counter_batch(ledger, att, 0, None, {T: {0: 1}}, recs(0, [0]))
    assert applied(ledger, "p") == []


def test_batch_starting_past_cursor_is_refused(ledger):
    inst = new_instance(ledger, {0: 0})
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    with pytest.raises(SourceGapError):
        counter_batch(ledger, att, 1, {T: {0: 5}}, {T: {0: 8}}, recs(0, range(5, 8)))
    assert applied(ledger, "p") == []


def test_rows_outside_leases_are_skipped_and_closed_lease_stops_at_end(ledger):
    blue = new_instance(ledger, {0: 0})
    with ledger.tx() as conn:
        lease = ledger.leases(blue.id, conn)[0]
        ledger.close_lease(conn, lease, 4)
        green = ledger.create_instance(conn, "p", "v2", Color.GREEN, "/x", "relay-p-g")
        ledger.open_lease(conn, green, T, 0, 4)
    b, g = (
        ledger.start_attempt(blue.id, ledger.issue_launch_token(blue.id)),
        ledger.start_attempt(green.id, ledger.issue_launch_token(green.id)),
    )
    counter_batch(ledger, b, 0, None, {T: {0: 6}}, recs(0, range(6)))
    counter_batch(ledger, g, 0, None, {T: {0: 6}}, recs(0, range(4, 6)))
    assert applied(ledger, "p") == [(0, o) for o in range(6)]
    assert [(lease.start_offset, lease.next_offset) for lease in ledger.pipeline_leases("p")] == [
        (0, 4),
        (4, 6),
    ]
    assert read_source_guard(ledger.url, blue.id).caps == {T: {0: 4}}


def test_overlapping_lease_is_refused(ledger):
    inst = new_instance(ledger, {0: 0})
    with ledger.tx() as conn, pytest.raises(LedgerError, match="overlaps"):
        ledger.open_lease(conn, inst, T, 0, 10)


def test_take_over_continues_from_cursor_and_undrained_rest(ledger):
    blue = new_instance(ledger, {0: 0})
    att = ledger.start_attempt(blue.id, ledger.issue_launch_token(blue.id))
    counter_batch(ledger, att, 0, None, {T: {0: 3}}, recs(0, range(3)))
    with ledger.tx() as conn:
        ledger.close_lease(conn, ledger.leases(blue.id, conn)[0], 10)  # upgrade handoff at 10
        green = ledger.create_instance(conn, "p", "v2", Color.GREEN, "/x", "g")
        ledger.open_lease(conn, green, T, 0, 10)
    ledger.set_instance(blue.id, state=InstanceState.FAILED)  # blue died while draining
    ledger.set_instance(green.id, state=InstanceState.STOPPED)
    nxt = new_instance(ledger)
    ranges = sorted((lease.start_offset, lease.end_offset) for lease in ledger.leases(nxt.id))
    assert ranges == [(3, 10), (10, None)]


def test_poison_goes_to_dead_letters_and_cursor_moves_on(ledger):
    inst = new_instance(ledger, {0: 0})
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    rows = recs(0, [0, 1]) + [row(T, 0, 2, b"-1", b"poison")] + recs(0, [3])
    res = counter_batch(ledger, att, 0, None, {T: {0: 4}}, rows)
    assert (res.rows_read, res.rows_applied) == (4, 3)
    assert ledger.dead_letter_count("p") == 1 and counted(ledger, "p") == 3
    with ledger.tx() as conn:
        assert conn.execute(select(func.max(s.leases.c.next_offset))).scalar() == 4


def test_new_partition_is_adopted_by_the_active_instance(ledger):
    inst = new_instance(ledger, {0: 0})
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    counter_batch(ledger, att, 0, None, {T: {0: 1, 1: 2}}, recs(0, [0]) + recs(1, [0, 1]))
    assert applied(ledger, "p") == [(0, 0), (1, 0), (1, 1)]


def test_stop_request_reaches_the_source_guard(ledger):
    inst = new_instance(ledger, {0: 0})
    assert read_source_guard(ledger.url, inst.id).stop_requested is False
    ledger.request_stop(inst.id)
    assert read_source_guard(ledger.url, inst.id).stop_requested is True
