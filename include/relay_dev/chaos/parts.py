"""The chaos run's private stack: one supervised ``LocalStack``; the run waits for its heals.

Why the run no longer restarts parts: supervisord brings back whatever the run kills, each part on
its own (a broker killed while the master restarts is back in about a second). The run only
watches: how long until the part is back healthy, and whether supervision brought it back at all.
What the run still has to start itself is a human action, counted by the caller.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from relay.config import RelayConfig
from relay.errors import RelayError, StackError

from relay_dev.stack import LocalStack, Part

Progress = Callable[[str], None]
HEAL_TIMEOUT_S = 180.0  # supervisord's own give-up (startretries with backoff) comes well before


class StackParts:
    """Start, watch and stop the parts of the private stack."""

    def __init__(self, config: RelayConfig, with_postgres: bool, progress: Progress) -> None:
        self.progress = progress
        self.with_postgres = with_postgres
        self.stack = LocalStack(config, progress=progress)
        wanted = self.stack.parts(with_postgres)
        self.locks = {part: threading.Lock() for part in wanted}  # held while a part is healing
        self.restarts: dict[str, int] = {}  # supervisord's restarts per part, read before `down`

    @property
    def parts(self) -> list[Part]:
        return list(self.locks)

    def up(self) -> None:
        """First start, in dependency order (the worker registers with the master)."""
        self.stack.up(with_postgres=self.with_postgres)

    def pid(self, part: Part) -> int | None:
        """The part's current PID as supervisord reports it (it changes at every restart)."""
        return self.stack.pid(part)

    def restarting(self, *parts: Part) -> bool:
        """One of ``parts`` (any part when none is named) was killed and is not back healthy yet."""
        return any(lock.locked() for part, lock in self.locks.items() if not parts or part in parts)

    def wait_healed(self, part: Part, old_pid: int, stop: threading.Event) -> float:
        """Seconds until supervisord runs ``part`` again under a new PID and its probe is healthy.

        StackError when it did not come back by itself (FATAL, or not within HEAL_TIMEOUT_S).
        """
        t0 = time.monotonic()
        with self.locks[part]:
            deadline = t0 + HEAL_TIMEOUT_S
            while not stop.is_set():
                info = self.stack.supervisor.info(part.value)
                if info is not None and info.state == "FATAL":
                    raise StackError(f"{part.value} is FATAL: supervisord gave up restarting it")
                pid = self.pid(part)
                if pid and pid != old_pid and self.stack.probe(part)[0]:
                    return round(time.monotonic() - t0, 2)
                if time.monotonic() > deadline:
                    raise StackError(f"{part.value} not back healthy {HEAL_TIMEOUT_S:.0f}s after the kill")
                stop.wait(0.3)
        raise StackError(f"{part.value}: the run stopped before it was back")

    def restart(self, part: Part, why: str) -> float:
        """What a person would do for a part supervision did not bring back: ``relay stack up``
        for that part (it resets the crash-loop budget); a human action. Returns seconds."""
        t0 = time.monotonic()
        with self.locks[part]:
            self.stack.up_part(part)
        seconds = round(time.monotonic() - t0, 2)
        self.progress(f"{why}: {part.value} started again by hand in {seconds}s (a human action)")
        return seconds

    def status_of(self, part: Part) -> dict[str, Any]:
        """name, state, pid, healthy, detail, restarts of one part (from the outside)."""
        return next(p for p in self.stack.status(self.with_postgres)["parts"] if p["name"] == part.value)

    def status(self) -> dict[str, Any]:
        return self.stack.status(self.with_postgres)

    def down(self) -> tuple[list[str], dict[str, list[int]]]:
        """Stop every program and supervisord, verify no process of any part is left.

        Returns (errors, PIDs stopped by hand per part); the restart counts are kept first.
        """
        with contextlib.suppress(RelayError):
            self.restarts = {p["name"]: p["restarts"] for p in self.status()["parts"]}
        try:
            return [], self.stack.down()["swept"]
        except RelayError as exc:
            return [str(exc)], {}
