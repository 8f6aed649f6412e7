"""``relay chaos``: a private stack, a pipeline under load, seeded faults, a deep audit, a table.

The run owns everything it starts: a supervised stack on free loopback ports under
``var/chaos/<timestamp>/``, its drivers (children of its worker), Airflow when the scheduler is a
fault kind. All of it is stopped in ``finally`` (supervisord, then by PID what any part's group
left), also on failure, Ctrl-C or SIGTERM. Results (every fault, every human
action, the audit) go to ``var/chaos/results-<timestamp>.json``.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT, RelayConfig, load_config
from relay.errors import RelayError
from relay.pipeline import load_package

from relay_dev.bench import cursors, free_port, latest_offsets, write_result
from relay_dev.chaos.faults import FaultEvent, Injector
from relay_dev.chaos.healer import HumanAction, PipelineHealer
from relay_dev.chaos.health_watch import HealthWatcher, health_during, health_now, health_summary
from relay_dev.chaos.observe import ChaosProducer, CommitWatcher, broker_check
from relay_dev.chaos.parts import StackParts
from relay_dev.chaos.plan import ChaosOptions, make_plan, next_fault_at
from relay_dev.chaos.report import audit_totals, summarize_kinds
from relay_dev.chaos.sink_under_test import SinkUnderTest
from relay_dev.postgres_local import LocalPostgres
from relay_dev.stack import Part

Progress = Callable[[str], None]
CHAOS_DIR = PROJECT_ROOT / "var" / "chaos"
PIPELINE = TOPIC = "chaos"


def chaos_config(data_dir: Path, options: ChaosOptions, host: str = "127.0.0.1") -> RelayConfig:
    """A private stack: its own data dir and free loopback ports, the chaos pipeline and topic."""
    ports = {name: free_port(host) for name in ("KAFKA", "SPARK_MASTER", "SPARK_MASTER_UI", "SPARK_REST")}
    ports |= {
        name: free_port(host) for name in ("SPARK_WORKER_UI", "SPARK_WORKER2_UI", "POSTGRES", "AIRFLOW")
    }
    env = {f"RELAY_{name}_PORT": str(port) for name, port in ports.items()}
    env |= {
        "RELAY_DATA_DIR": str(data_dir),
        "RELAY_HOST": host,
        "RELAY_WORKER_CORES": "4",
        "RELAY_WORKER_MEMORY": "2g",
        "RELAY_PIPELINE": PIPELINE,
        "RELAY_TOPIC": TOPIC,
        "RELAY_PARTITIONS": "3",
        "RELAY_MAX_OFFSETS_PER_TRIGGER": str(options.max_offsets_per_trigger),
        "RELAY_TRIGGER_SECONDS": "1",
    }
    if options.standby:
        env |= {"RELAY_SPARK_WORKERS": "2", "RELAY_STANDBY": "hot"}
    if options.postgres:
        env["RELAY_LEDGER_URL"] = LocalPostgres(data_dir, ports["POSTGRES"], host).url
    if options.pipeline_code is not None:  # the user's package: its own pipeline name and topic
        _, pipeline = load_package(options.pipeline_code)
        env |= {"RELAY_PIPELINE_CODE": str(options.pipeline_code), "RELAY_PIPELINE": pipeline.name}
        env["RELAY_TOPIC"] = pipeline.topics[0]
    return load_config(env)


def run_audit(config: RelayConfig, progress: Progress) -> tuple[dict[str, Any], bool]:
    """The deep audit (``audit(config, ledger, deep=True)``: Kafka re-read with read_committed).

    Falls back to the ledger-only audit when the installed ``relay.audit`` has no ``deep`` yet.
    """
    import inspect

    from relay.audit import audit
    from relay.ledger.store import Ledger

    ledger = Ledger(config.ledger_url)
    try:
        deep = "deep" in inspect.signature(audit).parameters
        report = (
            audit(config, ledger, deep=True, sink=True, progress=progress) if deep else audit(config, ledger)
        )
        return report.to_json(), deep
    finally:
        ledger.close()


class ChaosRun:
    """One run's state; ``run()`` is the whole story, ``teardown()`` always follows it."""

    def __init__(self, options: ChaosOptions, progress: Progress, host: str) -> None:
        self.options = options
        self.t_start = time.monotonic()
        self._say = progress
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.data_dir = CHAOS_DIR / self.stamp
        self.data_dir.mkdir(parents=True, exist_ok=False, mode=0o700)  # ledger, keys: owner only
        self.results_file = CHAOS_DIR / f"results-{self.stamp}.json"
        self.config = chaos_config(self.data_dir, options, host)
        self.plan = make_plan(options)
        self.abort = threading.Event()
        self.parts = StackParts(self.config, options.postgres, self.note)
        self.airflow = None
        if options.airflow:
            from relay_dev.airflow_local import LocalAirflow

            self.airflow = LocalAirflow(self.config, progress=self.note)
        self.injector = Injector(
            self.config, self.parts, self.airflow, options.lock_seconds, self.abort, self.note
        )
        self.watcher = CommitWatcher(self.config)
        self.health = HealthWatcher(self.config)
        self.producer = ChaosProducer(
            self.config, options.rate, options.poison_every, self.note, options.workload
        )
        self.sink = SinkUnderTest(self.config, options.workload, self.note)
        self.healer = PipelineHealer(
            self.config,
            self.watcher,
            lambda: self.parts.pid(Part.SPARK_WORKER),
            lambda: self.injector.busy,
            options.stall_s,
            self.note,
        )
        self.events: list[FaultEvent] = []
        self.threads: list[threading.Thread] = []
        self.result: dict[str, Any] = {
            "schema": 1,
            "started": self.stamp,
            "data_dir": str(self.data_dir),
            "results_file": str(self.results_file),
            "options": options.to_json(),
            "plan": self.plan.to_json(),
            "ok": False,
            "verdict": "did not finish",
        }

    # ------------------------------------------------------------------------------------ output
    def note(self, msg: str) -> None:
        self._say(f"[chaos {time.monotonic() - self.t_start:6.1f}s] {msg}")

    # ---------------------------------------------------------------------------------- the run
    def run(self) -> None:
        o = self.options
        kinds = ", ".join(f"{k} x{len(self.plan.of_kind(k))}" for k in o.kinds)
        self.note(f"data in {self.data_dir}; {o.seconds:g}s of faults ({kinds}), seed {o.seed}")
        self.note("starting the private stack (noida-db, Spark master + worker) on free loopback ports")
        self.parts.up()
        if self.airflow is not None:
            self.airflow.start()
        self.watcher.start()
        self.sink.prepare()
        from relay.operations.deploy import deploy

        info = deploy(self.config, version="v1", wait_s=600, progress=self.note)
        self.result["deploy"] = {k: info[k] for k in ("instance_id", "first_commit_s", "total_s")}
        # The load starts once the pipeline runs: no start-up backlog, the faults hit a steady state.
        self.producer.start()
        self.note(f"pipeline running; producing {o.rate:g} msg/s, {o.warmup_s:g}s before the first fault")
        self.abort.wait(o.warmup_s)
        self.healer.start()
        self.health.start()
        t0 = time.time()
        self.result["window"] = {"start": t0}
        for kind in o.kinds:
            rng = random.Random(f"{o.seed}:{kind}:targets")
            thread = threading.Thread(
                target=self._kind_loop, args=(kind, t0, rng), name=f"chaos-{kind}", daemon=True
            )
            self.threads.append(thread)
            thread.start()
        while not self.abort.is_set() and time.time() < t0 + o.seconds:
            self.abort.wait(min(15.0, max(0.1, t0 + o.seconds - time.time())))
            self._status_line(t0)
        self.note(
            f"fault window over: finishing the faults in progress (a kind not injected yet gets up to "
            f"{o.grace_s:g}s more to find its target)"
        )
        for thread in self.threads:
            thread.join(timeout=o.grace_s + o.lock_seconds + 300)
        self.result["window"]["end"] = time.time()
        self.result["producer"] = self.producer.stop()
        self.note(f"load stopped: {self.result['producer']['sent']:,} records sent; waiting until caught up")
        self._repair()
        self.result["caught_up_s"] = self._wait_caught_up()
        self.healer.stop()
        self.health.stop()
        # caught up: health must be OK again
        self.result["health_final"] = health_now(self.config, detail=True)
        self.note(f"health after catching up: {self.result['health_final']}")
        self._final_check()
        self.note("deep audit (relay audit --deep: the ledger, Kafka and the sink)")
        report, deep = run_audit(self.config, self.note)
        self.result["audit"] = report
        self.result["audit_deep"] = deep
        self.result["audit_totals"] = audit_totals(report)
        outside = self.sink.count(self.producer.acked)
        if outside is not None:
            self.note(f"outside count ({outside.client}): {outside.to_json()}")
            self.result["outside"] = outside.to_json()
        self.note("checking what the broker kept against what it acknowledged")
        self.result["broker"] = broker_check(self.config, self.producer.acked)

    def _kind_loop(self, kind: str, t0: float, rng: random.Random) -> None:
        """One kind's faults in order; a fault waits until the previous one of its kind is healed."""
        end = t0 + self.options.seconds
        injected = False
        healed_at: float | None = None
        for fault in self.plan.of_kind(kind):
            delay = next_fault_at(t0 + fault.at, healed_at, self.options.min_up_s) - time.time()
            if (delay > 0 and self.abort.wait(delay)) or self.abort.is_set():
                return
            # Every kind is exercised at least once: until it was, its target (a driver or executor
            # that a master restart or a worker kill took away) may be awaited past the window.
            until = end if injected else end + self.options.grace_s
            if time.time() >= until:  # the previous one of its kind took too long to heal
                late = FaultEvent(kind, fault.index, fault.at, fault.target)
                late.skipped = "fault window over before the previous fault of its kind was healed"
                self.events.append(late)
                continue
            event = self.injector.inject(fault, rng, until)
            injected = injected or event.at is not None
            if event.at is not None:  # a stack part is back by then; a driver or executor just killed
                healed_at = event.ended_at
            self.events.append(event)

    def _status_line(self, t0: float) -> None:
        done = len([e for e in self.events if e.at is not None])
        last = self.watcher.last_commit_at
        ago = f"{time.time() - last:.0f}s ago" if last else "never"
        self.note(
            f"{time.time() - t0:.0f}/{self.options.seconds:g}s: {done}/{len(self.plan.faults)} faults, "
            f"{len(self.watcher.commits)} batches (last {ago}), {self.producer.sent:,} sent, "
            f"{len(self.healer.actions)} redeploy(s)"
        )

    def _wait_caught_up(self) -> float | None:
        """Seconds until every cursor reached the end of the topic (None: not within the timeout)."""
        t0 = time.monotonic()
        last_note = t0
        while not self.abort.is_set() and time.monotonic() - t0 < self.options.catch_up_timeout_s:
            try:
                latest, cur = latest_offsets(self.config), cursors(self.config)
                if latest and all(cur.get(p, -1) >= off for p, off in latest.items()):
                    return round(time.monotonic() - t0, 1)
            except RelayError as exc:
                latest, cur = {}, {}
                self.note(f"catch-up check: {exc}")
            if time.monotonic() - last_note > 15:
                self.note(f"catching up: cursors {cur}, latest {latest}")
                last_note = time.monotonic()
            self.abort.wait(1.0)
        self.note(f"NOT caught up within {self.options.catch_up_timeout_s:g}s")
        return None

    def _repair(self) -> None:
        """A part supervision did not bring back (supervisord gave up on it) is still dead: start
        it before catching up, as the person on call would, and count it."""
        for part in self.parts.parts:
            if self.parts.status_of(part)["healthy"]:
                continue
            action = HumanAction(part.value, "still dead after the fault window", time.time())
            try:
                action.seconds = self.parts.restart(part, "repair")
                action.ok = True
            except RelayError as exc:
                action.error = f"{type(exc).__name__}: {exc}"[:500]
                self.note(f"repair of {part.value} failed: {action.error}")
            self.healer.actions.append(action)

    def _final_check(self) -> None:
        """What stayed dead: parts of the stack and the pipeline, as they are after the run."""
        status = self.parts.status()
        dead = [p["name"] for p in status["parts"] if not p["healthy"]]
        states = self.watcher.instance_states()
        live = [st for st in states if st[1] in ("STARTING", "ACTIVE", "DRAINING")]
        self.result["final"] = {"dead_parts": dead, "live_instances": [st[0] for st in live]}
        if dead:
            self.note(f"still dead after the run: {dead}")

    # ---------------------------------------------------------------------------------- results
    def finish(self) -> dict[str, Any]:
        """Figures per kind, human actions, the verdict; written to the results file."""
        w = self.watcher
        events = []
        for e in self.events:
            row = e.to_json()
            row["next_commit_s"] = w.next_commit_after(e.at) if e.at else None
            events.append(row)
        actions = []
        for a in self.healer.actions:
            row = a.to_json()
            row["next_commit_s"] = w.next_commit_after(a.at)
            before = sorted((e for e in events if e.get("at") and e["at"] < a.at), key=lambda e: e["at"])
            row["faults_before"] = [
                f"{e['kind']} #{e['index']} {a.at - e['at']:.0f}s before" for e in before[-3:]
            ]
            actions.append(row)
        health_during(events, self.health.samples)
        self.result["events"] = sorted(events, key=lambda r: r.get("at") or 0)
        self.result["health"] = health_summary(events, self.result.get("health_final"))
        self.result["human_actions"] = actions
        self.result["kinds"] = summarize_kinds(events, actions, self.options.kinds)
        self.result["human_actions_total"] = sum(r["human_actions"] for r in self.result["kinds"])
        self.result["commits_summary"] = {
            "batches": len(w.commits),
            "attempts": sorted({c.attempt_id for c in w.commits}),
            "instances": sorted({c.instance_id for c in w.commits}),
        }
        totals = dict(self.result.get("audit_totals") or {})
        outside = self.result.get("outside")
        if outside is not None and totals.get("duplicates") is not None:  # the sink, counted from outside
            totals["duplicates"] = int(totals["duplicates"] or 0) + outside["duplicates"]
            totals["missing"] = int(totals.get("missing") or 0) + outside["missing"] + outside["wrong"]
        dups, missing = totals.get("duplicates"), totals.get("missing")
        problems = []
        if self.result.get("error"):
            problems.append(self.result["error"])
        if "caught_up_s" in self.result and self.result["caught_up_s"] is None:
            problems.append(f"not caught up {self.options.catch_up_timeout_s:g}s after the load stopped")
        if dups is None or missing is None:
            problems.append("no audit")
        elif self.result["audit"].get("ok") is False and not (dups or missing):
            problems.append(
                "audit NOT OK: " + "; ".join(self.result["audit"].get("notes") or ["see results"])
            )
        else:
            if dups:
                problems.append(f"{dups} duplicate(s)")
            if missing:
                problems.append(f"{missing} missing")
        self.result["ok"] = not problems
        self.result["verdict"] = "; ".join(problems) or "0 duplicates, 0 missing"
        self.result["finished"] = time.strftime("%Y%m%d-%H%M%S")
        self.result["seconds"] = round(time.monotonic() - self.t_start, 1)
        write_result(self.result, self.results_file)
        return self.result

    def teardown(self) -> None:
        """Stop everything this run started, by PID; record what had to be swept."""
        self.abort.set()
        for thread in self.threads:
            thread.join(timeout=30)
        self.healer.stop(timeout_s=15)  # on Ctrl-C a redeploy's wait must not hold the teardown
        self.producer.stop()
        self.watcher.stop()
        self.health.stop()
        self.sink.restore()
        if self.airflow is not None:
            with contextlib.suppress(RelayError):
                self.airflow.stop()
        self.note("stopping the private stack (every program, then supervisord)")
        errors, swept = self.parts.down()
        if errors:
            self.result["stack_down_error"] = "; ".join(errors)
            self.note(f"stopping the stack: {self.result['stack_down_error']}")
        leftovers = sorted(pid for pids in swept.values() for pid in pids)
        if leftovers:
            self.note(f"stopped {len(leftovers)} leftover process(es) of the parts' groups: {swept}")
        self.result["leftovers_killed"] = leftovers
        self.result["supervisor_restarts"] = self.parts.restarts


def run_chaos(
    options: ChaosOptions, progress: Progress | None = None, host: str = "127.0.0.1"
) -> dict[str, Any]:
    """Run a chaos experiment on a private stack; always stop it; return (and write) the result."""
    run = ChaosRun(options, progress or (lambda _m: None), host)
    main = threading.current_thread() is threading.main_thread()
    previous = {}
    if main:  # SIGTERM ends the run like Ctrl-C: through the finally below

        def interrupt(signum: int, _frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, interrupt)
    try:
        run.run()
    except KeyboardInterrupt:
        run.result["error"] = "interrupted"
        run.note("interrupted: stopping everything")
    except Exception as exc:  # noqa: BLE001 - recorded, then the stack is stopped all the same
        run.result["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        run.note(f"FAILED: {run.result['error']}")
    finally:
        if main:  # a second Ctrl-C must not cut the teardown short
            previous.setdefault(signal.SIGINT, signal.signal(signal.SIGINT, signal.SIG_IGN))
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            run.teardown()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    result = run.finish()
    run.note(f"done in {result['seconds']}s: {result['verdict']}; results in {run.results_file}")
    return result
