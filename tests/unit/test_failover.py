"""Hot standby failover in the ledger: when a standby judges the active dead, and the one-transaction
takeover (fence, leases at the cursors, standby STARTING), including the races a false alarm meets."""

from __future__ import annotations

import pytest
from relay.errors import ZombieAttemptError
from relay.ledger import schema as s
from relay.ledger.models import AttemptState, Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations.upgrade_state import ALL_TERMINAL
from relay.protocol import commit_cursors, prepare_batch
from relay.protocol.failover import HOT_STANDBY, DeathWatch, Seen, fail_over, look_at_active
from relay.sinks.base import TaskResult

T = "events"


def running(ledger: Ledger, cursors: dict[int, int]):
    """An ACTIVE instance with an attempt and open leases at ``cursors``, and a READY hot standby."""
    with ledger.tx() as conn:
        active = ledger.create_instance(conn, "p", "v1", Color.BLUE, "/nonexistent", "relay-p-1")
        for part, off in cursors.items():
            ledger.open_lease(conn, active, T, part, off)
        standby = ledger.create_instance(
            conn, "p", "v1", Color.GREEN, "/nonexistent", "relay-p-2", InstanceState.READY, role=HOT_STANDBY
        )
    attempt = ledger.start_attempt(active.id, ledger.issue_launch_token(active.id))
    ledger.set_instance(active.id, state=InstanceState.ACTIVE)
    return active, attempt, standby


# ---------------------------------------------------------------------- what counts as dead
def seen(epoch: int = 1, beat: float = 100.0, state: AttemptState | None = AttemptState.RUNNING) -> Seen:
    return Seen(1, epoch, state, beat)


def test_a_heartbeat_that_stops_moving_for_the_bound_is_death_and_one_that_moves_is_not() -> None:
    watch = DeathWatch(after_s=3.0)
    assert watch.dead(seen(beat=100.0), now=0.0) is None
    assert watch.dead(seen(beat=101.0), now=2.9) is None  # it moved: the count starts again
    assert watch.dead(seen(beat=101.0), now=5.8) is None
    assert "no heartbeat of instance 1 for 3.0s" in (watch.dead(seen(beat=101.0), now=5.9) or "")


def test_a_relaunch_or_an_ended_attempt_is_death_at_once() -> None:
    watch = DeathWatch(after_s=3.0)
    watch.dead(seen(epoch=1), now=0.0)
    assert "relaunched (epoch 1 -> 2)" in (watch.dead(seen(epoch=2), now=0.5) or "")
    watch = DeathWatch(after_s=3.0)
    watch.dead(seen(), now=0.0)
    assert "ended CRASHED" in (watch.dead(seen(state=AttemptState.CRASHED), now=0.5) or "")


def test_nothing_to_watch_or_a_reset_starts_the_count_again() -> None:
    watch = DeathWatch(after_s=3.0)
    watch.dead(seen(), now=0.0)
    assert watch.dead(None, now=2.0) is None  # stopping, or an upgrade owns the pipeline
    assert watch.dead(seen(), now=4.0) is None  # first look again
    watch.reset()  # the ledger was away for both
    assert watch.dead(seen(), now=8.0) is None
    assert watch.dead(seen(), now=10.9) is None
    assert watch.dead(seen(), now=11.0) is not None
    watch.dead(Seen(7, 1, AttemptState.RUNNING, 100.0), now=12.0)  # another active: a new count
    assert watch.dead(Seen(7, 1, AttemptState.RUNNING, 100.0), now=14.0) is None


# ---------------------------------------------------------------------------- the takeover
def test_the_takeover_fences_the_active_and_opens_the_standby_at_its_cursors(ledger) -> None:
    active, attempt, standby = running(ledger, {0: 10, 1: 20})
    look = look_at_active(ledger, "p", standby.id)
    assert look is not None and (look.instance_id, look.epoch) == (active.id, attempt.epoch)
    done = fail_over(ledger, standby.id, look, "no heartbeat", ALL_TERMINAL)
    assert done is not None and (done["from_instance"], done["to_instance"]) == (active.id, standby.id)
    assert ledger.instance(active.id).state is InstanceState.FENCED
    assert ledger.instance(standby.id).state is InstanceState.STARTING
    assert ledger.instance(standby.id).role is None  # the active now, no longer a standby
    old = {le.partition: (le.start_offset, le.end_offset) for le in ledger.leases(active.id)}
    new = {le.partition: (le.start_offset, le.end_offset) for le in ledger.leases(standby.id)}
    assert old == {0: (10, 10), 1: (20, 20)} and new == {0: (10, None), 1: (20, None)}
    assert [op["state"] for op in ledger.operations("p", "failover")] == ["DONE"]
    # The old active is a zombie now: neither a batch nor a commit of it goes through.
    with pytest.raises(ZombieAttemptError):
        prepare_batch(ledger, attempt, None, {T: {0: 15}})
    with pytest.raises(ZombieAttemptError):
        commit_cursors(ledger, attempt, 0, None, {T: {0: 15}}, TaskResult())
    assert look_at_active(ledger, "p", standby.id) is None  # nothing left to take over


def test_a_commit_after_the_look_is_a_heartbeat_and_the_takeover_starts_past_it(ledger) -> None:
    """A commit beats (the active is alive: no takeover); the takeover that follows a later look
    reads the cursors in its own transaction, under the active's row lock, so the committed batch is
    never applied again (the model's mutant FAILOVER_STALE_CURSOR reads them before)."""
    active, attempt, standby = running(ledger, {0: 10})
    look = look_at_active(ledger, "p", standby.id)
    commit_cursors(ledger, attempt, 0, {T: {0: 10}}, {T: {0: 14}}, TaskResult())
    assert fail_over(ledger, standby.id, look, "no heartbeat", ALL_TERMINAL) is None
    later = look_at_active(ledger, "p", standby.id)
    assert later is not None and later.heartbeat_at > look.heartbeat_at
    assert fail_over(ledger, standby.id, later, "no heartbeat", ALL_TERMINAL) is not None
    assert [(le.start_offset, le.end_offset) for le in ledger.leases(standby.id)] == [(14, None)]
    assert [(le.start_offset, le.end_offset) for le in ledger.leases(active.id)] == [(10, 14)]


def test_an_active_that_beat_after_the_look_is_not_taken_over(ledger) -> None:
    active, attempt, standby = running(ledger, {0: 10})
    look = look_at_active(ledger, "p", standby.id)
    with ledger.tx() as conn:  # the heartbeat a paused driver writes once it runs again
        conn.execute(s.attempts.update().values(heartbeat_at=look.heartbeat_at + 1))
    assert fail_over(ledger, standby.id, look, "no heartbeat", ALL_TERMINAL) is None
    assert ledger.instance(active.id).state is InstanceState.ACTIVE
    assert ledger.instance(standby.id).state is InstanceState.READY and ledger.leases(standby.id) == []


@pytest.mark.parametrize("situation", ["stop asked", "upgrade in progress", "standby stopping"])
def test_no_takeover_while_a_person_or_an_operation_owns_the_pipeline(ledger, situation: str) -> None:
    active, _, standby = running(ledger, {0: 10})
    look = look_at_active(ledger, "p", standby.id)
    if situation == "stop asked":
        ledger.request_stop(active.id)
        assert look_at_active(ledger, "p", standby.id) is None
    elif situation == "upgrade in progress":
        ledger.open_operation("p", "upgrade", "GREEN_WARMING", {}, {}, ALL_TERMINAL)
    else:
        ledger.request_stop(standby.id)
    assert fail_over(ledger, standby.id, look, "no heartbeat", ALL_TERMINAL) is None
    assert ledger.instance(active.id).state is InstanceState.ACTIVE
    assert [le.end_offset for le in ledger.leases(active.id)] == [None]
