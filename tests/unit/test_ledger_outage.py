"""A driver rides out a ledger that is briefly away: a commit cut off is repeated, never applied twice."""

from __future__ import annotations

import time

import pytest
from relay.errors import LedgerError, LedgerUnavailableError
from relay.ledger import schema as s
from relay.ledger.models import Color
from relay.ledger.outage import Outage, ride_out
from relay.ledger.store import Ledger
from relay.protocol import commit as commit_module
from relay.protocol.commit import commit_riding_out
from relay.sinks.base import TaskResult
from sqlalchemy import func, select

T = "users"


def started(ledger: Ledger):
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", "v1", Color.BLUE, "/nonexistent", "relay-p")
        ledger.open_lease(conn, inst, T, 0, 0)
    return inst, ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))


def batch_rows(ledger: Ledger) -> int:
    with ledger.tx() as conn:
        return conn.execute(select(func.count()).select_from(s.batches)).scalar_one()


@pytest.mark.parametrize("lost", ["before COMMIT", "after COMMIT (the answer lost)"])
def test_a_commit_cut_off_by_the_ledger_lands_exactly_once(ledger, monkeypatch, lost) -> None:
    inst, att = started(ledger)
    real = commit_module.commit_cursors
    calls = []

    def cut_off_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            if lost.startswith("after"):
                real(*args, **kwargs)
            raise LedgerUnavailableError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(commit_module, "commit_cursors", cut_off_once)
    result = commit_riding_out(ledger, att, 0, None, {T: {0: 5}}, TaskResult(5, 5, 0, 0))

    assert result.rows_applied == 5 and [(r["from"], r["to"]) for r in result.ranges] == [(0, 5)]
    assert batch_rows(ledger) == 1, "the batch was recorded twice"
    assert [le.next_offset for le in ledger.leases(inst.id)] == [5]
    assert len(calls) == (1 if lost.startswith("after") else 2)


def test_ride_out_gives_up_past_its_bound_and_leaves_other_errors_alone() -> None:
    def away():
        raise LedgerUnavailableError("connection refused")

    t0 = time.monotonic()
    with pytest.raises(LedgerUnavailableError):
        ride_out(away, "test", bound_s=0.5)
    assert 0.5 <= time.monotonic() - t0 < 5

    tries = []

    def broken():
        tries.append(1)
        raise LedgerError("no such table: leases")

    with pytest.raises(LedgerError):
        ride_out(broken, "test", bound_s=30)
    assert len(tries) == 1, "a non-transient error was retried"

    flaky = iter([LedgerUnavailableError("starting up"), LedgerUnavailableError("starting up"), None])

    def back_soon() -> str:
        exc = next(flaky)
        if exc:
            raise exc
        return "done"

    assert ride_out(back_soon, "test", bound_s=30) == "done"


def test_an_outage_lets_a_loop_go_on_within_its_bound_only() -> None:
    outage = Outage("test", bound_s=0.2)
    assert outage.failed(LedgerUnavailableError("x"))
    time.sleep(0.3)  # the bound is a duration: nothing to wait for but time itself
    assert not outage.failed(LedgerUnavailableError("x"))
    outage.ok()
    assert outage.failed(LedgerUnavailableError("x")), "a new stretch starts after the ledger was back"
