"""Section ``failover``: the pause a dead driver costs with a hot standby, beside the master's relaunch.

The counter (examples/counter, ``standby = "hot"``) under a steady 1,000 msg/s, once on a SQLite and
once on a PostgreSQL ledger, on two workers (the stack's second worker part is added: two hosts, the
standby placed on the other one). In one run: steady state with the standby waiting; SIGKILL of the
active's Python driver (the standby takes over); a new standby; SIGKILL of the active's driver JVM;
a new standby; SIGKILL of the active's whole worker host (its process group: worker, driver JVM and
Python, executors; :mod:`.failover_faults`), its worker back by supervisord before the next standby;
the standby stopped and steady state without one; SIGKILL of the Python driver again, which Spark's
supervision now relaunches. Per record the production -> application latency (``pause``); a fault's
pause is its window's longest latency minus steady state's longest (goal: 5 s). The standby's cost:
its processes' CPU and memory while it waits, and the active's steady latency with and without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from relay.config import RelayConfig
from relay.errors import OperationError, RelayError
from relay.polling import poll

from relay_dev.chaos.procs import read_proc

from .cluster import latest_offsets, wait_caught_up
from .context import Context
from .failover_faults import add_second_worker, check_replaced, lose_host
from .pause import (
    application_times,
    exactly_once_counts,
    in_flight,
    join_samples,
    latency_summary,
    pause_s,
    read_applications,
    read_production_times,
)
from .results import figure
from .upgrade import RateProducer, wait_applied

RATE = 1000.0
GOAL_S = 5.0
RECOVERED_S = 120.0  # a fault's window ends at the first commit after it, at most this late
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------- processes (by PID, /proc)
def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def _stat(pid: int) -> tuple[float, int] | None:
    """(CPU seconds used, resident bytes) of one process; None when it is gone."""
    try:
        fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
        rss = int(_read(f"/proc/{pid}/statm").split()[1]) * PAGE
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK, rss


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return [int(c) for t in tasks for c in _read(f"/proc/{pid}/task/{t}/children").split()]
    except OSError:
        return []


def instance_pids(ledger: Any, instance_id: int) -> tuple[int, int]:
    """(Python driver, driver JVM) of the instance's running attempt, from the ledger and /proc."""
    from relay.ledger.models import AttemptState

    running = [a for a in ledger.attempts(instance_id) if a.state is AttemptState.RUNNING]
    if not running or not running[-1].pid:
        raise OperationError(f"instance {instance_id} has no running attempt")
    python = int(running[-1].pid)
    proc = read_proc(python)
    if proc is None:
        raise OperationError(f"instance {instance_id}'s Python driver (pid {python}) is gone")
    return python, proc.ppid


def app_pids(ledger: Any, instance_id: int) -> list[int]:
    """Every process of the instance: its driver (JVM, Python) and its executors (found by app id),
    with their children (Python workers)."""
    from relay.ledger.models import AttemptState

    python, jvm = instance_pids(ledger, instance_id)
    app = next(a.app_id for a in reversed(ledger.attempts(instance_id)) if a.state is AttemptState.RUNNING)
    executors = (read_proc(int(e)) for e in os.listdir("/proc") if e.isdigit())
    roots = [jvm, *(p.pid for p in executors if p is not None and app and app in p.text)]
    seen: set[int] = set()
    while roots:
        pid = roots.pop()
        if pid not in seen:
            seen.add(pid)
            roots += _children(pid)
    return sorted(seen | {python})


def cost(pids: list[int], seconds: float) -> dict[str, float]:
    """CPU (percent of one core) and resident memory (MB) of ``pids`` over ``seconds``."""
    before = {p: s for p in pids if (s := _stat(p)) is not None}
    time.sleep(seconds)
    after = {p: s for p in pids if (s := _stat(p)) is not None}
    cpu = sum(after[p][0] - before[p][0] for p in after if p in before)
    return {
        "cpu_pct": round(100 * cpu / seconds, 1),
        "rss_mb": round(sum(s[1] for s in after.values()) / 2**20, 1),
    }


# --------------------------------------------------------------------------------- the faults
def first_commit_after(cfg: RelayConfig, ledger: Any, t: float) -> float:
    """The first batch committed after ``t`` that moved a cursor (the pipeline applies again)."""
    from relay.ledger import schema as s
    from sqlalchemy import select

    def first_commit() -> float | None:
        with ledger.tx() as conn:
            rows = conn.execute(
                select(s.batches.c.committed_at, s.batches.c.ranges)
                .where(s.batches.c.pipeline == cfg.pipeline, s.batches.c.committed_at > t)
                .order_by(s.batches.c.committed_at)
            ).all()
        moved = [float(r[0]) for r in rows if r[1]]
        return moved[0] if moved else None

    at = poll(
        first_commit,
        RECOVERED_S,
        0.2,
        on_timeout=lambda: OperationError(f"no commit within {RECOVERED_S:.0f}s of the fault at {t:.1f}"),
    )
    assert at is not None
    return at


def _ready_standby(cfg: RelayConfig, ledger: Any, say: Any, timeout_s: float = 300.0) -> int:
    from relay.operations.standby import ensure_standby, hot_standbys

    t0 = time.monotonic()
    ensure_standby(cfg, ledger, progress=say)

    def ready() -> int | None:
        found = [
            i.id
            for i in hot_standbys(ledger.instances(cfg.pipeline, live_only=True))
            if i.state.value == "READY"
        ]
        return found[0] if found else None

    standby = poll(
        ready, timeout_s, on_timeout=lambda: OperationError(f"no READY hot standby within {timeout_s:.0f}s")
    )
    assert standby is not None
    say(f"failover: hot standby instance {standby} READY after {time.monotonic() - t0:.0f}s")
    return standby


def _active(cfg: RelayConfig, ledger: Any) -> int:
    live = ledger.instances(cfg.pipeline, live_only=True)
    return next(i.id for i in live if i.state.value in ("ACTIVE", "STARTING"))


def _kill(cfg: RelayConfig, ledger: Any, target: str, progress: Any) -> tuple[float, float]:
    """SIGKILL the active's Python driver or its JVM; (kill time, first commit after it)."""
    python, jvm = instance_pids(ledger, _active(cfg, ledger))
    at = time.time()
    os.kill(python if target == "python" else jvm, signal.SIGKILL)
    back = first_commit_after(cfg, ledger, at)
    progress(f"failover: SIGKILL {target}: first commit {back - at:.1f}s later")
    return at, back


def run_one(ctx: Context, stack: Any, cfg: RelayConfig, settle: float, steady: float) -> dict[str, Any]:
    """One ledger's run (see the module): windows, costs, per-record exactness."""
    from relay.kafka.offsets import KafkaOffsets
    from relay.ledger.store import Ledger
    from relay.operations.deploy import deploy
    from relay.operations.standby import failovers, stop_standbys
    from relay.operations.stop import stop

    ledger, say = Ledger(cfg.ledger_url), ctx.progress
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    start, t_begin = latest_offsets(cfg), time.time()
    deploy(cfg, version="v1", wait_s=600, progress=say)
    windows: dict[str, tuple[float, float]] = {}
    costs: dict[str, Any] = {}
    host: dict[str, Any] = {}
    producer = RateProducer(cfg, RATE)
    producer.start()
    try:
        standby = _ready_standby(cfg, ledger, say)
        wait_applied(cfg, latest_offsets(cfg), 300)  # under load the cursors never equal the latest
        time.sleep(settle)
        s0 = time.time()
        costs["standby waiting"] = cost(app_pids(ledger, standby), steady)
        costs["active, standby waiting"] = cost(app_pids(ledger, _active(cfg, ledger)), 1.0)
        windows["steady, standby waiting"] = (s0, time.time())
        time.sleep(settle)  # the window's last records applied before any fault (in flight = in it)
        for target in ("python", "jvm"):
            at, back = _kill(cfg, ledger, target, say)
            time.sleep(settle)
            windows[f"SIGKILL {target}, hot standby"] = (at, back + settle)
            standby = _ready_standby(cfg, ledger, say)
            time.sleep(settle)
        at, back, host = lose_host(
            cfg,
            stack,
            ledger,
            _active(cfg, ledger),
            standby,
            lambda t: first_commit_after(cfg, ledger, t),
            say,
        )
        windows["SIGKILL worker host, hot standby"] = (at, back + settle)
        time.sleep(max(0.0, back + settle - time.time()))  # the worker is usually back later
        standby = _ready_standby(cfg, ledger, say)  # after the worker is back: placed on it
        check_replaced(cfg, stack, ledger, _active(cfg, ledger), standby, host)
        say(f"failover: host loss: {host}")
        time.sleep(settle)
        stop_standbys(cfg, ledger, say)
        time.sleep(settle)
        s0 = time.time()
        time.sleep(steady)
        windows["steady, no standby"] = (s0, time.time())
        time.sleep(settle)
        at, back = _kill(cfg, ledger, "python", say)
        time.sleep(settle)
        windows["SIGKILL python, relaunch (no standby)"] = (at, back + settle)
    finally:
        producer.stop()
    wait_caught_up(cfg, say, 300, "failover (the last records)")
    end = latest_offsets(cfg)
    with contextlib.suppress(RelayError):
        stop(cfg, timeout_s=120, progress=say)
    produced, _ = read_production_times(cfg.kafka_bootstrap, cfg.topic, start, end)
    messages, batches = read_applications(cfg.ledger_url, cfg.pipeline, cfg.topic, start, t_begin)
    applied, unmatched = application_times(messages, batches, cfg.topic)
    samples = join_samples(produced, applied)
    lat = {name: latency_summary(in_flight(samples, *win)) for name, win in windows.items()}
    return {
        "latency": lat,
        "windows": windows,
        "costs": costs,
        "exactly_once": exactly_once_counts(produced, applied),
        "unmatched": unmatched,
        "failovers": failovers(ledger, cfg.pipeline),
        "host_loss": host,
    }


def section_failover(ctx: Context) -> dict[str, Any]:
    from relay.ledger.engine import create_ledger

    from relay_dev.postgres_local import LocalPostgres

    base = ctx.config.with_(standby="hot", max_offsets_per_trigger=None, trigger_seconds=0.1)
    settle, steady = (5.0, 15.0) if ctx.options.quick else (10.0, 30.0)
    runs: dict[str, Any] = {}
    stack = add_second_worker(ctx.config, ctx.progress)  # the standby's host; stopped with the stack
    sqlite_url = f"sqlite:///{ctx.work_dir / 'failover.db'}"
    create_ledger(sqlite_url)
    runs["sqlite"] = run_one(
        ctx, stack, base.with_(pipeline="fo_sqlite", topic="fo_sqlite", ledger_url=sqlite_url), settle, steady
    )
    pg = LocalPostgres(ctx.config.data_dir, ctx.config.ports.postgres, ctx.config.host)
    try:
        url = pg.start()
        create_ledger(url)
        runs["postgres"] = run_one(
            ctx, stack, base.with_(pipeline="fo_pg", topic="fo_pg", ledger_url=url), settle, steady
        )
    finally:
        with contextlib.suppress(RelayError):
            pg.stop()
    figures, bad = [], []
    for ledger_kind, run in runs.items():
        lat, eo = run["latency"], run["exactly_once"]
        quiet = lat["steady, standby waiting"]
        for name, window in lat.items():
            if name.startswith("steady"):
                figures += [
                    figure(f"{ledger_kind}: {name}: latency p50", window["p50_s"], "s"),
                    figure(f"{ledger_kind}: {name}: latency p99", window["p99_s"], "s"),
                ]
                continue
            goal = ("goal", GOAL_S) if "hot standby" in name else ()
            figures.append(figure(f"{ledger_kind}: {name}: pause", pause_s(window, quiet), "s", *goal))
        for who, c in run["costs"].items():
            figures += [
                figure(f"{ledger_kind}: {who}: CPU", c["cpu_pct"], "% of a core"),
                figure(f"{ledger_kind}: {who}: memory", c["rss_mb"], "MB"),
            ]
        if run["host_loss"]:
            back = run["host_loss"]["worker_back_s"]
            figures.append(figure(f"{ledger_kind}: lost worker host back at the master", back, "s"))
        figures += [
            figure(f"{ledger_kind}: records applied twice (must be 0)", eo["duplicates"], "records"),
            figure(f"{ledger_kind}: records never applied (must be 0)", eo["gaps"], "records"),
        ]
        if eo["duplicates"] or eo["gaps"] or run["unmatched"]:
            counts = f"{eo['duplicates']} duplicate(s), {eo['gaps']} gap(s), {run['unmatched']} unmatched"
            bad.append(f"{ledger_kind}: {counts}")
    for f in figures:
        ctx.progress(f"failover: {f['name']} = {f['value']} {f['unit']}")
    if bad:
        raise OperationError("; ".join(bad))
    return {"figures": figures, "details": {"rate": RATE, "settle_s": settle, "steady_s": steady, **runs}}
