"""Riding out a ledger that is briefly away (a PostgreSQL restart, a SQLite file locked a while).

Why: every ledger step a driver takes is safe to repeat. Reads are reads; the batch's commit is one
transaction that either landed or did not (the caller checks which before repeating it); fencing
never depends on the driver reaching the ledger (a commit checks the epoch itself). So a driver that
meets ``LedgerUnavailableError`` waits and tries again, within ``LEDGER_OUTAGE_S``, instead of
failing its query and paying a full relaunch (a minute or more). Past the bound the error stands:
the driver crashes and its supervisor relaunches it, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from relay.errors import LedgerUnavailableError

LEDGER_OUTAGE_S = 120.0
"""How long a driver rides out an unreachable ledger before it gives up and is relaunched."""

log = logging.getLogger("relay.ledger")
_T = TypeVar("_T")


def ride_out(fn: Callable[[], _T], what: str, bound_s: float = LEDGER_OUTAGE_S) -> _T:
    """``fn()``, repeated while it raises ``LedgerUnavailableError``, for ``bound_s`` at most
    (waits 0.1 s doubling to 2 s); the last error is raised past the bound."""

    def note(state: object) -> None:
        exc = state.outcome.exception()  # type: ignore[attr-defined]
        log.warning("%s: the ledger is unavailable (%s); retrying for up to %.0fs", what, exc, bound_s)

    retrying = Retrying(
        retry=retry_if_exception_type(LedgerUnavailableError),
        stop=stop_after_delay(bound_s),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        before_sleep=note,
        reraise=True,
    )
    return retrying(fn)


class Outage:
    """Tracks one stretch of failures in a loop that keeps going (a driver's supervision loop):
    ``failed`` says whether the loop may go on, ``ok`` ends the stretch."""

    def __init__(self, what: str, bound_s: float = LEDGER_OUTAGE_S) -> None:
        self.what = what
        self.bound_s = bound_s
        self.since: float | None = None

    def failed(self, exc: Exception) -> bool:
        """True while the stretch is within the bound (the first failure is logged)."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning(
                "%s: the ledger is unavailable (%s); riding it out for up to %.0fs",
                self.what,
                exc,
                self.bound_s,
            )
        return now - self.since <= self.bound_s

    def ok(self) -> None:
        if self.since is not None:
            log.info("%s: the ledger is back after %.1fs", self.what, time.monotonic() - self.since)
        self.since = None
