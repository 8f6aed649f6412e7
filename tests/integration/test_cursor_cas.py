"""The cursors' compare-and-set over many leases at once, on both ledgers: one lease that moved (its
cursor or its end) fails the whole commit, names that lease, and no cursor moves."""

from __future__ import annotations

import pytest
from relay.errors import CursorConflictError
from relay.ledger import schema as s
from relay.ledger.models import Color
from relay.ledger.store import Ledger

T = "cas"


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path) -> Ledger:
    if request.param == "sqlite":
        led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=True)
    else:
        led = Ledger(request.getfixturevalue("postgres_url"))
    yield led
    led.close()


def _leases(ledger: Ledger, n: int, pipeline: str) -> list:
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, pipeline, "v1", Color.BLUE, "/nonexistent", f"relay-{pipeline}")
        for p in range(n):
            ledger.open_lease(conn, inst, T, p, 10, 500 if p % 2 else None)
    return ledger.leases(inst.id)


@pytest.mark.parametrize("change", ["cursor", "end"])
def test_one_moved_lease_fails_the_commit_names_it_and_moves_nothing(ledger: Ledger, change: str) -> None:
    pipeline = f"cas-{change}-{id(ledger) % 10**6}"
    leases = _leases(ledger, 40, pipeline)
    with ledger.tx() as conn:  # all 40 match: every cursor moves in one statement
        ledger.advance_cursors(conn, [(lease, 20) for lease in leases])
    read = ledger.leases(leases[0].instance_id)
    assert {lease.next_offset for lease in read} == {20}
    victim = read[17]
    with ledger.tx() as conn:  # another commit moved lease 17 (or closed it) after `read` was taken
        values = {"next_offset": 25} if change == "cursor" else {"end_offset": 30}
        conn.execute(s.leases.update().where(s.leases.c.id == victim.id).values(**values))
    with pytest.raises(CursorConflictError, match=f"lease {victim.id} "), ledger.tx() as conn:
        ledger.advance_cursors(conn, [(lease, 40) for lease in read])
    after = {lease.id: lease.next_offset for lease in ledger.leases(read[0].instance_id)}
    expected = 25 if change == "cursor" else 20
    assert after.pop(victim.id) == expected and set(after.values()) == {20}, "the whole commit rolled back"
