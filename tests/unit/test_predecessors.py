"""Predecessors of a lease (relay.protocol.predecessors) on a real SQLite ledger, and the driver's fence step.

Each ledger state is what the operations leave behind: ``take_over`` (deploy after a death),
a recovery's lease at other offsets, an upgrade's handoff with blue still draining.
"""

from __future__ import annotations

from typing import Any

import pytest
from relay.ledger.models import Attempt, Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.pipeline.tasks import take_over_once
from relay.protocol import commit_cursors, prepare_batch, prepare_tasks
from relay.protocol.predecessors import PredecessorCache
from relay.sinks.base import FencedWriteError, TaskResult

from tests.ledger_builder import LedgerBuilder

T = "events"


@pytest.fixture()
def ledger(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=True)
    yield led
    led.close()


def deploy(ledger: Ledger, starts: dict[int, int] | None = None) -> tuple[Instance, Attempt]:
    """What ``relay deploy`` does: a new instance takes every unfinished range of dead ones."""
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", "v1", Color.BLUE, "/nonexistent", "relay-p")
        if not ledger.take_over(conn, "p", inst):
            for part, off in (starts or {}).items():
                ledger.open_lease(conn, inst, T, part, off)
    return inst, ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))


def die(ledger: Ledger, inst: Instance, state: InstanceState = InstanceState.FAILED) -> None:
    ledger.set_instance(inst.id, state=state)


def commit(ledger: Ledger, att: Attempt, batch: int, end: dict[int, int]) -> None:
    prepare_batch(ledger, att, None, {T: end})
    commit_cursors(ledger, att, batch, None, {T: end}, TaskResult())


def preds(ledger: Ledger, att: Attempt, end: dict[int, int], cache: PredecessorCache | None = None) -> Any:
    return prepare_tasks(ledger, att, None, {T: end}, cache or PredecessorCache())[1]


def test_a_dead_instance_is_the_predecessor_of_the_lease_continuing_its_cursor(ledger) -> None:
    a, a_att = deploy(ledger, {0: 0, 1: 0})
    commit(ledger, a_att, 0, {0: 5, 1: 3})
    die(ledger, a)  # its tasks may have committed [5, ...) and [3, ...) in the sink
    b, b_att = deploy(ledger)
    assert preds(ledger, b_att, {0: 9, 1: 9}) == {(T, 0): (a.id,), (T, 1): (a.id,)}
    # Only partitions the batch writes: partition 1 has nothing planned here.
    assert preds(ledger, b_att, {0: 9}) == {(T, 0): (a.id,)}
    # prepare_batch: the ranges only.
    assert prepare_batch(ledger, b_att, None, {T: {0: 9}}) == {(T, 0): (5, 9)}


def test_a_chain_through_an_instance_that_never_wrote_names_both(ledger) -> None:
    a, a_att = deploy(ledger, {0: 0})
    commit(ledger, a_att, 0, {0: 5})
    die(ledger, a)
    b, _ = deploy(ledger)  # took [5, ...), died before its first commit
    die(ledger, b)
    c, c_att = deploy(ledger)
    assert preds(ledger, c_att, {0: 9}) == {(T, 0): (a.id, b.id)}


def test_after_the_successor_committed_only_it_is_the_predecessor(ledger) -> None:
    """B moved the cursor from 5 to 7 and died: C continues at 7, where only B's lease ends (A's
    end, carried in B's sink marker by B's take-over, reaches C through B)."""
    a, a_att = deploy(ledger, {0: 0})
    commit(ledger, a_att, 0, {0: 5})
    die(ledger, a)
    b, b_att = deploy(ledger)
    commit(ledger, b_att, 0, {0: 7})
    die(ledger, b, InstanceState.FENCED)
    c, c_att = deploy(ledger)
    assert preds(ledger, c_att, {0: 9}) == {(T, 0): (b.id,)}


def test_a_restarted_driver_after_the_first_commit_takes_nothing_over_again(ledger) -> None:
    a, a_att = deploy(ledger, {0: 0})
    commit(ledger, a_att, 0, {0: 5})
    die(ledger, a)
    b, b_att = deploy(ledger)
    assert preds(ledger, b_att, {0: 7}) == {(T, 0): (a.id,)}
    commit_cursors(ledger, b_att, 0, None, {T: {0: 7}}, TaskResult())  # after the take-over
    b_att2 = ledger.start_attempt(b.id, ledger.issue_launch_token(b.id))  # the driver restarts
    assert preds(ledger, b_att2, {0: 9}) == {}


def test_a_live_predecessor_is_never_one(ledger) -> None:
    """An upgrade's handoff: blue drains [3, 6) (DRAINING, live) while green starts at 6."""
    build = LedgerBuilder(ledger, "p", T)
    blue = build.instance("v1")
    build.lease(blue, 0, 0, 3, end=6)
    ledger.set_instance(blue.id, state=InstanceState.DRAINING)
    green = build.instance("v2")
    build.lease(green, 0, 6, 6)
    ledger.set_instance(green.id, state=InstanceState.ACTIVE)
    g_att = ledger.start_attempt(green.id, ledger.issue_launch_token(green.id))
    assert preds(ledger, g_att, {0: 9}) == {}
    for state in (InstanceState.STANDBY, InstanceState.READY, InstanceState.STARTING, InstanceState.ACTIVE):
        ledger.set_instance(blue.id, state=state)
        assert preds(ledger, g_att, {0: 9}) == {}, state
    ledger.set_instance(blue.id, state=InstanceState.STOPPED)  # drained and gone: it is one now
    assert preds(ledger, g_att, {0: 9}) == {(T, 0): (blue.id,)}


def test_a_recovery_that_reset_the_offsets_elsewhere_has_no_predecessor(ledger) -> None:
    build = LedgerBuilder(ledger, "p", T)
    a = build.instance()
    build.lease(a, 0, 0, 5)
    with ledger.tx() as conn:  # what a recovery does: close at the cursor, open at the target
        ledger.close_lease(conn, ledger.leases(a.id, conn)[0], 5)
    die(ledger, a)
    for target in (20, 2):  # reset ahead with no gap declared, or reprocessing (overlapping)
        r = build.instance()
        build.lease(r, 0, target, target)
        r_att = ledger.start_attempt(r.id, ledger.issue_launch_token(r.id))
        assert preds(ledger, r_att, {0: 30}) == {}, target
        die(ledger, r)


def test_a_recovery_past_the_cursor_names_the_old_instance_through_its_gap(ledger) -> None:
    """The model's finding RECOVERY_SKIP_DUP (issue #29): a recovery closes the old lease at its
    cursor 5, declares [5, 20) lost and opens the new lease at 20; the old instance's tasks may have
    written past 20 before it died, so it is a predecessor through the gap (split in two here)."""
    build = LedgerBuilder(ledger, "p", T)
    a = build.instance()
    build.lease(a, 0, 0, 5)
    with ledger.tx() as conn:
        ledger.close_lease(conn, ledger.leases(a.id, conn)[0], 5)
    build.gap(0, 5, 12)
    build.gap(0, 12, 20)
    build.gap(1, 0, 20)  # another partition's gap leads nowhere here
    die(ledger, a)
    r = build.instance()
    build.lease(r, 0, 20, 20)
    r_att = ledger.start_attempt(r.id, ledger.issue_launch_token(r.id))
    assert preds(ledger, r_att, {0: 30}) == {(T, 0): (a.id,)}


def test_an_own_earlier_lease_is_not_a_predecessor(ledger) -> None:
    """Green holds blue's rest [3, 6) and its own [6, ...): only blue (dead) precedes, once."""
    blue, blue_att = deploy(ledger, {0: 0})
    commit(ledger, blue_att, 0, {0: 3})
    with ledger.tx() as conn:
        ledger.close_lease(conn, ledger.leases(blue.id, conn)[0], 6)
        ledger.set_instance(blue.id, conn, state=InstanceState.FAILED)
        green = ledger.create_instance(conn, "p", "v2", Color.GREEN, "/nonexistent", "relay-p2")
        ledger.take_over(conn, "p", green)
        ledger.open_lease(conn, green, T, 0, 6)
    g_att = ledger.start_attempt(green.id, ledger.issue_launch_token(green.id))
    assert preds(ledger, g_att, {0: 9}) == {(T, 0): (blue.id,)}


def test_predecessors_are_computed_once_per_lease(ledger, monkeypatch) -> None:
    a, a_att = deploy(ledger, {0: 0})
    commit(ledger, a_att, 0, {0: 5})
    die(ledger, a)
    b, b_att = deploy(ledger)
    cache = PredecessorCache()
    assert preds(ledger, b_att, {0: 7}, cache) == {(T, 0): (a.id,)}
    commit_cursors(ledger, b_att, 0, None, {T: {0: 7}}, TaskResult())

    def no_query(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(ledger, "instances", no_query)  # read only for leases not seen yet
    assert preds(ledger, b_att, {0: 9}, cache) == {(T, 0): (a.id,)}  # same lease: no query


class RecordingSink:
    """Stands in for a sink on the driver: records the take-over calls."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[Any] = []
        self.refuse = refuse

    def take_over(self, pipeline: str, instance_id: int, epoch: int, predecessors: Any) -> None:
        if self.refuse:
            raise FencedWriteError("newer epoch in the sink")
        self.calls.append((pipeline, instance_id, epoch, dict(predecessors)))


class FenceOnlySink:
    """A user's ExecutorSink without ``take_over``: each predecessor gets ``fence_instance``."""

    def __init__(self) -> None:
        self.fenced: list[int] = []

    def fence_instance(self, pipeline: str, instance_id: int) -> None:
        self.fenced.append(instance_id)


def test_the_driver_fences_each_predecessor_once_before_the_tasks() -> None:
    sink, done = RecordingSink(), set()
    first = {(T, 0): (1, 2), (T, 1): (1,)}
    assert take_over_once(sink, "p", 3, 4, first, done) == first  # type: ignore[arg-type]
    assert sink.calls == [("p", 3, 4, first)]
    assert take_over_once(sink, "p", 3, 4, first, done) == {}  # type: ignore[arg-type]
    later = {(T, 0): (1, 2), (T, 2): (5,)}  # a lease taken over later in the driver's life
    assert take_over_once(sink, "p", 3, 4, later, done) == {(T, 2): (5,)}  # type: ignore[arg-type]
    assert len(sink.calls) == 2
    plain = FenceOnlySink()
    take_over_once(plain, "p", 3, 4, first, set())  # type: ignore[arg-type]
    assert plain.fenced == [1, 2]
    refusing, none_done = RecordingSink(refuse=True), set()
    with pytest.raises(FencedWriteError):
        take_over_once(refusing, "p", 3, 4, first, none_done)  # type: ignore[arg-type]
    assert none_done == set()  # not marked: the next attempt fences again
