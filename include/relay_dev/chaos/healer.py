"""Notice when the pipeline will not come back by itself, and do what a person would: stop, deploy.

Why this exists: some faults may leave nothing running that Spark would relaunch (a crash loop
makes the driver give up on purpose). First it runs what the relay_health DAG runs on its schedule
(``relay health --heal``: relaunches an ACTIVE instance whose driver the master ended for good); only
if nothing runs long after that does it do what a person would. Stack parts are not its business:
supervisord restarts them and the master recovers its drivers from its recovery directory. Each
redeploy done here is counted as a human action, with the reason it was needed, so the table says
what a self-healing platform still has to learn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from relay.config import RelayConfig
from relay.errors import RelayError
from relay.spark.rest import DriverState

from relay_dev.chaos import procs
from relay_dev.chaos.observe import CommitWatcher

Progress = Callable[[str], None]
LIVE_STATES = ("STARTING", "ACTIVE", "DRAINING")
SELF_HEAL_AFTER_S = 20.0  # no driver this long: run what the relay_health DAG runs (relay health --heal)
NO_DRIVER_S = 120.0  # and still none this long after: nothing will relaunch it, a person must
STANDBY_EVERY_S = 10.0  # with a hot standby: how often a missing one is started (see standby_heal)


@dataclass
class HumanAction:
    """One thing the tool did that a self-healing stack should have done by itself, or (kind
    ``self_heal``, not a human action) the health check's own relaunch, as its DAG would run it."""

    kind: str
    reason: str
    at: float
    seconds: float | None = None
    ok: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PipelineHealer:
    """Watches the pipeline from the outside every ``interval_s``; redeploys it when it is dead."""

    def __init__(
        self,
        config: RelayConfig,
        watcher: CommitWatcher,
        worker_pid: Callable[[], int | None],
        busy: Callable[[], bool],
        stall_s: float,
        progress: Progress,
        interval_s: float = 2.0,
    ) -> None:
        self.config = config
        self.watcher = watcher
        self.worker_pid = worker_pid
        self.busy = busy
        self.stall_s = stall_s
        self.progress = progress
        self.interval_s = interval_s
        self.actions: list[HumanAction] = []
        self._last_look = time.time()
        self._no_driver_s = 0.0  # seconds of a whole stack with no driver running or waiting to run
        self._healed_at_s = 0.0  # _no_driver_s when the health check last tried to relaunch
        self._quiet_s = 0.0  # seconds of a whole stack without a new commit
        self._seen_commit = 0.0
        self._standby_next = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-healer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 600) -> None:
        """Stop watching; a redeploy in progress may finish within ``timeout_s`` (bounded by its waits)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=timeout_s)

    def _driver_somewhere(self) -> bool | None:
        """A driver JVM runs in the worker's process group, or the master holds one to (re)launch.

        None when the master cannot be asked (it may be restarting): no decision then. RELAUNCHING is
        not counted: after a worker dies the old driver id stays RELAUNCHING forever while the master
        relaunches it under a new id (which is SUBMITTED, then RUNNING).
        """
        worker = self.worker_pid()
        if worker and procs.driver_jvms(worker):
            return True
        from relay.spark.launcher import spark_client

        client = spark_client(self.config)  # signs REST requests when the master requires it
        try:
            state = client.master_state()
        except RelayError:
            return None
        finally:
            client.close()
        if not state.alive:
            return None
        return any(d.state in (DriverState.SUBMITTED, DriverState.RUNNING) for d in state.active_drivers)

    def diagnose(self) -> str | None:
        """Why the pipeline needs a person now, or None when it is running or will recover by itself.

        Only time while the stack is whole counts: while the master or the worker is restarting or
        the ledger is locked, nothing could relaunch a driver, so those seconds neither count nor
        reset the clocks (under a fault every few seconds, the stack is rarely whole for long).
        """
        now = time.time()
        dt = min(now - self._last_look, 5 * self.interval_s)
        self._last_look = now
        if self.busy():
            return None
        states = self.watcher.instance_states()
        if not states:
            return None
        live = [st for st in states if st[1] in LIVE_STATES]
        if not live:
            last = states[-1]
            return f"instance {last[0]} is {last[1]}: {(last[2] or '')[:160]}"
        alive = self._driver_somewhere()
        if alive is None or alive:
            self._no_driver_s = self._healed_at_s = 0.0
        else:
            self._no_driver_s += dt
            if self._no_driver_s >= self._healed_at_s + SELF_HEAL_AFTER_S:
                self._healed_at_s = self._no_driver_s
                self.health_heal()
            if self._no_driver_s >= NO_DRIVER_S:
                return (
                    f"instance {live[-1][0]} is {live[-1][1]} in the ledger but no driver runs or waits "
                    f"to run ({self._no_driver_s:.0f}s of a whole stack)"
                )
        committed = self.watcher.last_commit_at or 0.0
        if committed > self._seen_commit:
            self._seen_commit, self._quiet_s = committed, 0.0
        else:
            self._quiet_s += dt
            if self._quiet_s > self.stall_s:
                return f"no batch committed for {self._quiet_s:.0f}s of a whole stack"
        return None

    def health_heal(self) -> None:
        """``relay health --heal``, as the relay_health DAG runs it on its schedule: recorded (as
        ``self_heal``) when it relaunched an instance, never counted as a human action."""
        from relay.health import run_health

        at = time.time()
        try:
            report = run_health(self.config, heal=True)
        except RelayError as exc:
            self.progress(f"health --heal: {type(exc).__name__}: {exc}")
            return
        check = next((c for c in report.checks if c.name == "self_heal"), None)
        if check is None:
            return
        self.progress(f"health --heal: {check.message}")
        relaunched = [r for r in check.data["instances"] if r["relaunched"]]
        if relaunched:
            action = HumanAction("self_heal", check.message, at, round(time.time() - at, 2), ok=True)
            self.actions.append(action)

    def redeploy(self, reason: str) -> HumanAction:
        """``relay stop`` then ``relay deploy``: what the runbook says to do with a dead pipeline."""
        from relay.operations.deploy import deploy
        from relay.operations.stop import stop

        action = HumanAction("pipeline", reason, time.time())
        self.progress(f"pipeline needs a human: {reason}; running stop + deploy")
        try:
            try:
                stop(self.config, timeout_s=20, progress=self.progress)
            except RelayError as exc:
                self.progress(f"stop before redeploy: {exc}")
            info = deploy(self.config, version="v1", wait_s=300, progress=self.progress)
            action.ok = True
            self.progress(
                f"redeployed: instance {info['instance_id']} committed after {info['first_commit_s']}s"
            )
        except RelayError as exc:
            action.error = f"{type(exc).__name__}: {exc}"[:500]
            self.progress(f"redeploy failed (will look again): {action.error}")
        action.seconds = round(time.time() - action.at, 2)
        self._no_driver_s = self._quiet_s = self._healed_at_s = 0.0
        self._last_look = time.time()
        self.actions.append(action)
        return action

    def standby_heal(self) -> None:
        """With ``standby = "hot"``: a new standby once the last one took over (what ``relay standby``
        and the relay_health DAG's self-heal do; here every STANDBY_EVERY_S, not every 5 minutes, so
        each worker fault of a short run meets a waiting standby). Never a human action."""
        from relay.ledger.store import Ledger
        from relay.operations.standby import ensure_standby

        if self.config.standby != "hot" or time.monotonic() < self._standby_next or self.busy():
            return
        self._standby_next = time.monotonic() + STANDBY_EVERY_S
        ledger = Ledger(self.config.ledger_url)
        try:
            done = ensure_standby(self.config, ledger)
        except RelayError as exc:
            self.progress(f"standby: {type(exc).__name__}: {exc}")
            return
        finally:
            ledger.close()
        if done.get("started"):
            self.progress(f"standby: instance {done['instance']} started")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                reason = self.diagnose()
                if reason is not None:
                    self.redeploy(reason)
                self.standby_heal()
            except Exception as exc:  # noqa: BLE001 - the watchdog itself must keep watching
                self.progress(f"healer: {type(exc).__name__}: {exc}")
            self._stop.wait(self.interval_s)
