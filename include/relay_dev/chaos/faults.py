"""Inject one fault of each kind and measure how the stack heals it.

Stack parts (worker, master, broker, the Airflow scheduler) are programs of the stack's supervisord:
each kill is healed by supervision and the tool only measures how long until the part is back. Only
when a part does not come back by itself (supervisord gave up: FATAL) does the tool start it, as a
person would, and count a human action. Driver and executor kills are healed by Spark (supervised
relaunch, executor replacement).
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from relay.config import RelayConfig
from relay.errors import RelayError

from relay_dev.airflow_api import heartbeat
from relay_dev.airflow_local import LocalAirflow
from relay_dev.chaos import procs, targets
from relay_dev.chaos.parts import StackParts
from relay_dev.chaos.plan import PlannedFault
from relay_dev.stack import WORKERS, Part

Progress = Callable[[str], None]
TARGET_WAIT_S = 60.0  # without a fault window: how long to wait for a driver or executor to kill
PART_OF_KIND = {
    "master": Part.SPARK_MASTER,
    "broker": Part.KAFKA,
    "ledger": Part.POSTGRES,  # the PostgreSQL ledger's server (and every sink table on it)
}


@dataclass
class FaultEvent:
    """What one injection did; ``at`` is wall-clock time, comparable with the ledger's batch times."""

    kind: str
    index: int
    planned_at: float
    target: str = ""
    at: float | None = None
    pids: list[int] = field(default_factory=list)
    swept: list[int] = field(default_factory=list)
    healed_by: str = ""
    human_actions: int = 0
    restart_s: float | None = None
    held_s: float | None = None
    ended_at: float | None = None
    skipped: str | None = None
    error: str | None = None
    standby: str | None = None  # the hot standby's state at the kill (READY: a failover is expected)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Injector:
    """Performs faults on the private stack; one instance shared by the per-kind threads."""

    def __init__(
        self,
        config: RelayConfig,
        parts: StackParts,
        airflow: LocalAirflow | None,
        lock_seconds: float,
        stop: threading.Event,
        progress: Progress,
    ) -> None:
        self.config = config
        self.parts = parts
        self.airflow = airflow
        self.lock_seconds = lock_seconds
        self.stop = stop
        self.progress = progress
        self.lock_held = threading.Event()  # the ledger is locked on purpose (the healer waits)

    @property
    def busy(self) -> bool:
        """The master or the worker is being restarted, or the ledger is locked: nothing could run or
        relaunch a driver now, so the pipeline cannot be judged. (A broker or scheduler restart does
        not stop Spark from relaunching a driver.)"""
        return self.parts.restarting(Part.SPARK_MASTER, *WORKERS) or self.lock_held.is_set()

    def _worker(self) -> int:
        """The PID of the worker running the active's driver (of the only worker, with one)."""
        return self.parts.pid(targets.active_worker(self.config, self.parts.stack)) or 0

    def _wait_for(self, find: Callable[[], list[procs.Proc]], until: float | None) -> list[procs.Proc]:
        """Targets as soon as there are some (a driver may be relaunching); [] at ``until`` (the end of
        the fault window) or when the run stops."""
        deadline = until or time.time() + TARGET_WAIT_S
        while not self.stop.is_set():
            found = find()
            if found or time.time() > deadline:
                return found
            self.stop.wait(0.5)
        return []

    # ----------------------------------------------------------------------------------- dispatch
    def inject(self, fault: PlannedFault, rng: random.Random, until: float | None = None) -> FaultEvent:
        """Inject ``fault`` now; a driver or executor to kill is awaited until ``until`` at most."""
        event = FaultEvent(fault.kind, fault.index, fault.at, fault.target)
        if fault.kind in ("driver", "worker"):
            event.standby = targets.standby_state(self.config)
        try:
            if fault.kind == "driver":
                self._driver(event, until)
            elif fault.kind == "executor":
                self._executor(event, rng, until)
            elif fault.kind == "worker":
                self._stack_part(event, targets.active_worker(self.config, self.parts.stack))
            elif fault.kind in PART_OF_KIND:
                self._stack_part(event, PART_OF_KIND[fault.kind])
            elif fault.kind == "scheduler":
                self._scheduler(event)
            elif fault.kind == "ledger-lock":
                self._ledger_lock(event)
            else:
                event.error = f"unknown kind {fault.kind}"
        except (RelayError, OSError, sqlite3.Error) as exc:
            event.error = f"{type(exc).__name__}: {exc}"[:500]
            self.progress(f"{fault.kind} #{fault.index}: {event.error}")
        except Exception as exc:  # noqa: BLE001 - one broken injection must not end the run
            event.error = f"{type(exc).__name__}: {exc}"[:500]
            self.progress(f"{fault.kind} #{fault.index}: unexpected {event.error}")
        event.ended_at = time.time()
        return event

    # -------------------------------------------------------------------------------- the kinds
    def _driver(self, event: FaultEvent, until: float | None) -> None:
        # The worker's PID is read at every look: a worker restarted meanwhile runs the relaunched driver.
        jvms = self._wait_for(lambda: procs.driver_jvms(self._worker()), until)
        if not jvms:
            event.skipped = "no driver JVM in the worker's process group until the window ended"
            return
        jvm = targets.driver_jvm_of(jvms, targets.active_submission(self.config)) or jvms[0]
        pythons = [p.pid for p in procs.driver_pythons(jvm.pgid, jvm.pid)]
        if event.target == "python" and pythons:
            pids = pythons
        elif event.target == "both":
            pids = [*pythons, jvm.pid]  # the Python driver first: the JVM sees its child die
        else:
            pids = [jvm.pid]  # "jvm", or "python" before the JVM started its Python child
        event.at = time.time()
        event.pids = [p for p in pids if procs.sigkill(p)]
        event.healed_by = (
            "hot standby (failover)" if event.standby == "READY" else "spark (supervised relaunch)"
        )
        what = event.target if (event.target != "python" or pythons) else "jvm (no Python child yet)"
        self.progress(f"driver #{event.index}: SIGKILL {what} pid(s) {event.pids}")

    def _executor(self, event: FaultEvent, rng: random.Random, until: float | None) -> None:
        found = self._wait_for(lambda: procs.executor_jvms(self._worker()), until)
        if not found:
            event.skipped = "no executor JVM in the worker's process group until the window ended"
            return
        victim = rng.choice(found)
        event.at = time.time()
        event.pids = [victim.pid] if procs.sigkill(victim.pid) else []
        event.healed_by = "spark (new executor)"
        self.progress(f"executor #{event.index}: SIGKILL pid {victim.pid}")

    def _stack_part(self, event: FaultEvent, part: Part) -> None:
        """SIGKILL the part's main process only; supervisord restarts it (its wrapper first stops
        what the dead part left in its group). A part not back by itself is started by hand."""
        pid = self.parts.pid(part)
        if not pid or not procs.read_proc(pid):
            event.skipped = f"{part.value} not running"
            return
        event.at = time.time()
        event.pids = [pid] if procs.sigkill(pid) else []
        self.progress(f"{event.kind} #{event.index}: SIGKILL pid {pid}")
        try:
            event.restart_s = self.parts.wait_healed(part, pid, self.stop)
            event.healed_by = "supervisord (autorestart)"
            self.progress(f"{event.kind} #{event.index}: {part.value} back in {event.restart_s}s by itself")
        except RelayError as exc:
            if self.stop.is_set():
                raise
            self.progress(f"{event.kind} #{event.index}: {exc}; starting it by hand")
            event.restart_s = self.parts.restart(part, f"{event.kind} #{event.index}")
            event.healed_by = "chaos tool (relay stack up)"
            event.human_actions = 1

    def _scheduler(self, event: FaultEvent) -> None:
        """SIGKILL the scheduler's main process only: its LocalExecutor workers live on until the
        restarted program's wrapper stops them. Healed when the new scheduler heartbeats."""
        if self.airflow is None:
            event.skipped = "Airflow is not part of this run"
            return
        pid = self.airflow.pid("scheduler")
        if not pid or not procs.read_proc(pid):
            event.skipped = "scheduler not running"
            return
        event.at = time.time()
        event.pids = [pid] if procs.sigkill(pid) else []
        self.progress(f"scheduler #{event.index}: SIGKILL pid {pid}")
        t0 = time.monotonic()
        deadline = t0 + 180
        while not self.stop.is_set() and time.monotonic() < deadline:
            beat = self._scheduler_heartbeat()
            if beat is not None and beat > event.at:  # the new scheduler's own heartbeat
                event.restart_s = round(time.monotonic() - t0, 2)
                break
            self.stop.wait(1)
        if event.restart_s is not None:
            event.healed_by = "supervisord (autorestart)"
        elif not self.stop.is_set():
            self.progress(f"scheduler #{event.index}: no new heartbeat in 180s; `relay airflow up` by hand")
            self.airflow.start()
            event.restart_s = round(time.monotonic() - t0, 2)
            event.healed_by = "chaos tool (relay airflow up)"
            event.human_actions = 1
        self.progress(f"scheduler #{event.index}: new heartbeat {event.restart_s}s after the kill")

    def _scheduler_heartbeat(self) -> float | None:
        """The scheduler's latest heartbeat (epoch seconds) as the API reports it.

        Not the API's ``healthy``: it stays healthy for a while on the dead scheduler's last beat.
        """
        return heartbeat(self.config, "scheduler")

    def _ledger_lock(self, event: FaultEvent) -> None:
        """Hold the ledger's write lock the way a stuck writer would, then let go."""
        url = self.config.ledger_url
        t0 = time.monotonic()
        if url.startswith("sqlite"):
            conn = sqlite3.connect(url.split("///", 1)[1], timeout=30, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                self._hold(event, t0)
                conn.execute("ROLLBACK")
            finally:
                conn.close()
        else:
            import psycopg2

            conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1))
            try:
                with conn.cursor() as cur:
                    cur.execute("SET lock_timeout = '30s'")
                    # EXCLUSIVE blocks every writer and SELECT ... FOR UPDATE, not plain readers.
                    cur.execute("LOCK TABLE instances, leases, batches IN EXCLUSIVE MODE")
                    self._hold(event, t0)
                conn.rollback()
            finally:
                conn.close()
        event.healed_by = "itself (lock released)"

    def _hold(self, event: FaultEvent, t0: float) -> None:
        event.at = time.time()
        waited = time.monotonic() - t0
        self.lock_held.set()
        self.progress(f"ledger-lock #{event.index}: holding the ledger for {self.lock_seconds:g}s")
        try:
            self.stop.wait(self.lock_seconds)  # released early only when the run is interrupted
        finally:
            self.lock_held.clear()
        event.held_s = round(time.time() - event.at, 2)
        self.progress(f"ledger-lock #{event.index}: released after {event.held_s}s (waited {waited:.1f}s)")
