"""The chaos run's private stack, one ``LocalStack`` per part, so parts restart independently.

Why not one ``LocalStack``: its ``up()`` restarts parts in order and waits for each to be healthy,
and a worker cannot become healthy while the master is dead. With one stack, a broker killed while
a worker restart waits for a dead master stayed down for minutes behind it; a platform restarts each
unit on its own. One state file per part also means two restarts at once never overwrite each
other's PID, so ``down`` always finds every process to stop.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.config import RelayConfig
from relay.errors import RelayError

from relay_dev.chaos import procs
from relay_dev.stack import LocalStack, Part

Progress = Callable[[str], None]
# PostgreSQL first: every ``up`` ends by making sure the ledger exists, so the ledger's server must be up.
START_ORDER = (Part.POSTGRES, Part.KAFKA, Part.SPARK_MASTER, Part.SPARK_WORKER)
STOP_ORDER = (Part.SPARK_WORKER, Part.SPARK_MASTER, Part.KAFKA, Part.POSTGRES)


class PartStack(LocalStack):
    """A ``LocalStack`` that owns exactly one part, with its own state file."""

    def __init__(self, config: RelayConfig, part: Part, progress: Progress) -> None:
        super().__init__(config, progress=progress)
        self.part = part

    def restart(self) -> None:
        """Bring the part's process back and wait until it is healthy, as a platform's supervisor
        would: only the part, without the rest of ``up`` (which also opens the ledger, and would
        block for as long as the chaos run holds the ledger's lock, charging the lock's duration to
        every restart under way). ``_up_one`` is the stack's own per-part start."""
        self._up_one(self.part)

    @property
    def state_file(self) -> Path:
        return self.config.data_dir / f"stack-{self.part.value}.json"

    def parts(self, with_postgres: bool | None = None) -> list[Part]:
        return [self.part]


class StackParts:
    """Start, restart, inspect and stop the parts of the private stack, each on its own."""

    def __init__(self, config: RelayConfig, with_postgres: bool, progress: Progress) -> None:
        self.progress = progress
        wanted = [p for p in START_ORDER if p is not Part.POSTGRES or with_postgres]
        self.stacks = {part: PartStack(config, part, self._note) for part in wanted}
        self.locks = {part: threading.Lock() for part in wanted}  # one restart of a part at a time
        self.sessions: dict[int, int | None] = {}  # session -> leader start time, swept at the end

    def _note(self, msg: str) -> None:
        if not msg.startswith("ledger: found"):  # every part's ``up`` checks the ledger: say it once
            self.progress(msg)

    def up(self) -> None:
        """First start, in dependency order (the worker registers with the master)."""
        for part, stack in self.stacks.items():
            with self.locks[part]:
                stack.up()
            self._remember(part)

    def pid(self, part: Part) -> int | None:
        """The part's current PID as its state file records it (it changes at every restart)."""
        try:
            entry = json.loads(self.stacks[part].state_file.read_text()).get(part.value, {})
        except (OSError, ValueError):
            return None
        return int(entry["pid"]) if entry.get("pid") else None

    def _remember(self, part: Part) -> None:
        pid = self.pid(part)
        if pid and pid not in self.sessions:
            self.sessions[pid] = procs.start_time(pid)

    def restarting(self, *parts: Part) -> bool:
        """A restart of one of ``parts`` (of any part when none is named) is under way."""
        return any(lock.locked() for part, lock in self.locks.items() if not parts or part in parts)

    def restart(self, part: Part, why: str, stop: threading.Event, tries: int = 3) -> float:
        """Bring ``part`` back as ``relay stack up`` would; retried when another fault breaks it
        half way (the person would run it again too: still one human action). Returns seconds."""
        t0 = time.monotonic()
        for attempt in range(1, tries + 1):
            try:
                with self.locks[part]:
                    self.stacks[part].restart()
                    self._remember(part)
                break
            except RelayError as exc:
                if attempt == tries or stop.is_set():
                    raise
                self.progress(f"{why}: restarting {part.value} failed ({exc}); again")
        seconds = round(time.monotonic() - t0, 2)
        self.progress(
            f"{why}: {part.value} up again in {seconds}s (a human action until the stack heals itself)"
        )
        return seconds

    def status_of(self, part: Part) -> dict[str, Any]:
        """name, pid, healthy, detail of one part (from the outside, as a client sees it)."""
        return self.stacks[part].status()["parts"][0]

    def status(self) -> dict[str, Any]:
        parts = [p for stack in self.stacks.values() for p in stack.status()["parts"]]
        return {"healthy": all(p["healthy"] for p in parts), "parts": parts}

    def down(self, timeout_s: float = 300) -> list[str]:
        """Stop every part (worker first) by PID once no restart is under way; returns errors."""
        errors = []
        for part in STOP_ORDER:
            stack = self.stacks.get(part)
            if stack is None or not stack.state_file.exists():
                continue
            got = self.locks[part].acquire(timeout=timeout_s)  # a restart half way must end first
            try:
                stack.down()
            except RelayError as exc:
                errors.append(f"{part.value}: {exc}")
            finally:
                if got:
                    self.locks[part].release()
        return errors
