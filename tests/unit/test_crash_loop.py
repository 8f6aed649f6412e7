"""A driver gives up on its own failures, never on being killed from outside again and again.

The 10-minute chaos run of this stop: a fault every ~9 s killed the driver (its worker, its JVM)
five times before it could commit a first batch; each attempt ended ``ConnectionRefusedError`` (its
Python side lost the JVM), the sixth declared a crash loop and the instance FAILED: a person had to
redeploy. Attempts are written to a real SQLite ledger as each way of ending leaves them.
"""

from __future__ import annotations

import pytest
from driver_checks import CRASH_LOOP_ATTEMPTS, KILLED, crash_loop, jvm_gone
from relay.ledger.models import AttemptState
from relay.ledger.store import Ledger

from tests.ledger_builder import LedgerBuilder


def _attempts(ledger: Ledger, endings: list[tuple[AttemptState, str | None]]) -> int:
    """An instance whose attempts ended as listed, oldest first, then the one starting now."""
    inst = LedgerBuilder(ledger, "p", "p").instance()
    token = ledger.issue_launch_token(inst.id)
    for state, error in endings:
        attempt = ledger.start_attempt(inst.id, token, f"driver-{len(ledger.attempts(inst.id))}")
        ledger.end_attempt(attempt.id, state, error)
    ledger.start_attempt(inst.id, token, "driver-now")
    return inst.id


OWN = (AttemptState.CRASHED, "RuntimeError: version v2 was built to fail at start-up")
KILLED = (AttemptState.CRASHED, f"{KILLED}ConnectionRefusedError: [Errno 111] Connection refused")
SUPERSEDED = (AttemptState.FENCED, "superseded by attempt 7 (epoch 7)")  # killed, never recorded an end
FOUND_DEAD = (AttemptState.CRASHED, "driver gone (found by inventory)")


def test_own_failures_in_a_row_are_a_crash_loop(ledger: Ledger) -> None:
    assert crash_loop(ledger, _attempts(ledger, [OWN] * (CRASH_LOOP_ATTEMPTS - 1)))


def test_one_fewer_is_not(ledger: Ledger) -> None:
    assert not crash_loop(ledger, _attempts(ledger, [OWN] * (CRASH_LOOP_ATTEMPTS - 2)))


@pytest.mark.parametrize("ending", [KILLED, SUPERSEDED, FOUND_DEAD], ids=["jvm-gone", "superseded", "found"])
def test_kills_from_outside_never_make_a_loop(ledger: Ledger, ending) -> None:
    assert not crash_loop(ledger, _attempts(ledger, [ending] * 12))


def test_kills_between_own_failures_neither_count_nor_hide_them(ledger: Ledger) -> None:
    endings = [OWN, KILLED, OWN, SUPERSEDED, OWN, FOUND_DEAD, OWN]
    assert crash_loop(ledger, _attempts(ledger, endings))


def test_a_jvm_that_answers_is_not_gone_and_one_that_does_not_is() -> None:
    class Jvm:
        def __init__(self, alive: bool) -> None:
            self.alive = alive

        def __getattr__(self, name: str):  # noqa: ANN204 - java.lang.System.currentTimeMillis()
            if not self.alive:
                raise ConnectionRefusedError(111, "Connection refused")
            return self

        def __call__(self) -> int:
            return 1

    def session(alive: bool):  # noqa: ANN202
        ctx = type("Ctx", (), {"_jvm": Jvm(alive)})()
        return type("Spark", (), {"sparkContext": ctx})()

    assert not jvm_gone(session(True), RuntimeError("AnalysisException"))
    assert jvm_gone(session(False), RuntimeError("anything"))
    assert jvm_gone(None, ConnectionRefusedError(111, "refused"))  # the gateway never answered
    assert not jvm_gone(None, RuntimeError("failed at start-up"))
