"""Section ``failover-hosts``: the active's whole host lost under a steady 1,000 msg/s, on the
namespace cluster (relay_dev.hosts), with the hot standby waiting on the other worker host.

Why a section of its own: ``failover`` loses a worker's process group on one machine; here each host
is a network namespace with its own address and folders, the ledger is PostgreSQL on a host of its
own, and every process of the active's host is SIGKILLed (its supervisord, worker, driver JVM and
Python, executors). The counter (``standby = "hot"``, trigger 0.1 s) as in ``failover``; per record
the production -> application latency; the pause is the fault window's longest latency minus the
steady window's longest (goal: 5 s). Needs root and namespace rights: skipped without them.
It does not use the bench's embedded stack (the cluster is its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from relay.config import PROJECT_ROOT
from relay.errors import OperationError
from relay.polling import poll

from .cluster import latest_offsets, wait_caught_up
from .context import Context
from .failover import GOAL_S, RATE, first_commit_after
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

PIPELINES_FILE = """\
[pipelines.experience]
topic = "experience"
partitions = 3
standby = "hot"
trigger_seconds = 0.1
"""


class _Client:
    """Relay as a user on the cluster's client host: its CLI, and calls on its network."""

    def __init__(self, cluster: Any, env: dict[str, str]) -> None:
        from relay.config import load_config
        from relay.ledger.store import Ledger

        self.cluster, self.env = cluster, env
        self.cfg = load_config(env)
        self.ledger = Ledger(self.cfg.ledger_url)  # connects on first use: inside ``call`` only

    def relay(self, *args: str, timeout: float = 600) -> dict[str, Any]:
        relay = str(PROJECT_ROOT / ".venv" / "bin" / "relay")
        done = self.cluster.run_on("client", [relay, "--json", *args], env=self.env, timeout=timeout)
        if done.returncode != 0:
            raise OperationError(f"relay {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
        return json.loads(done.stdout)

    def call(self, fn: Callable[[], Any]) -> Any:
        return self.cluster.call_in("client", fn)

    def instances(self) -> list[dict[str, Any]]:
        """Live instances with their driver's host address (the ledger and the master's view)."""
        from relay.spark.launcher import spark_client

        def look() -> list[dict[str, Any]]:
            live = self.ledger.instances(self.cfg.pipeline, live_only=True)
            with contextlib.closing(spark_client(self.cfg)) as client:
                state = client.master_state()
            hosts = {w.id: w.host for w in state.workers}
            out = []
            for i in live:
                driver = state.driver(i.submission_id or "")
                host = hosts.get(driver.worker) if driver else None
                out.append({"id": i.id, "state": i.state.value, "role": i.role, "host": host})
            return out

        return self.call(look)


def _ready_pair(client: _Client, timeout_s: float = 300) -> tuple[dict[str, Any], dict[str, Any]]:
    """(active, READY hot standby), once both are placed."""

    def look() -> tuple[dict[str, Any], dict[str, Any]] | None:
        live = client.instances()
        active = [i for i in live if i["role"] is None and i["state"] == "ACTIVE" and i["host"]]
        ready = [i for i in live if i["role"] == "hot-standby" and i["state"] == "READY" and i["host"]]
        return (active[0], ready[0]) if active and ready else None

    pair = poll(look, timeout_s, 1.0, on_timeout=lambda: OperationError("no READY hot standby"))
    assert pair is not None
    return pair


def _measure(ctx: Context, cluster: Any, info: Any, settle: float, steady: float) -> dict[str, Any]:
    from relay.operations.standby import failovers

    from relay_dev.hosts import netns

    say = ctx.progress
    client = _Client(cluster, info.client_env)
    cfg, ledger = client.cfg, client.ledger
    client.relay("ledger", "init")
    client.relay("deploy", "--version", "v1", "--wait", "400")
    active, standby = _ready_pair(client)
    say(
        f"failover-hosts: active {active['id']} on {active['host']}, standby {standby['id']} "
        f"on {standby['host']}"
    )
    if active["host"] == standby["host"]:
        raise OperationError(f"the standby waits on the active's host {active['host']}")
    host = next(h for h, a in info.addresses.items() if a == active["host"])
    start, t_begin = client.call(lambda: latest_offsets(cfg)), time.time()
    producer = client.call(lambda: _started(RateProducer(cfg, RATE)))  # its thread on the client's network
    windows: dict[str, tuple[float, float]] = {}
    try:
        client.call(lambda: wait_applied(cfg, latest_offsets(cfg), 300))
        time.sleep(settle)
        s0 = time.time()
        time.sleep(steady)
        windows["steady, standby waiting"] = (s0, time.time())
        time.sleep(settle)
        victims = netns.pids(cluster.layout.ns(host))
        at = time.time()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        back = client.call(lambda: first_commit_after(cfg, ledger, at))
        say(f"failover-hosts: {host} lost ({len(victims)} processes): first commit {back - at:.1f}s later")
        time.sleep(settle)
        windows["SIGKILL worker host, hot standby"] = (at, back + settle)
    finally:
        producer.stop()
    client.call(lambda: wait_caught_up(cfg, say, 300, "failover-hosts (the last records)"))
    end = client.call(lambda: latest_offsets(cfg))
    produced, _ = client.call(lambda: read_production_times(cfg.kafka_bootstrap, cfg.topic, start, end))
    messages, batches = client.call(
        lambda: read_applications(cfg.ledger_url, cfg.pipeline, cfg.topic, start, t_begin)
    )
    applied, unmatched = application_times(messages, batches, cfg.topic)
    samples = join_samples(produced, applied)
    taken = client.call(lambda: failovers(ledger, cfg.pipeline))
    ledger.close()
    client.relay("stop", timeout=300)
    return {
        "host_lost": host,
        "processes_killed": len(victims),
        "first_commit_s": round(back - at, 2),
        "latency": {name: latency_summary(in_flight(samples, *win)) for name, win in windows.items()},
        "windows": windows,
        "exactly_once": exactly_once_counts(produced, applied),
        "unmatched": unmatched,
        "producer_errors": [repr(e) for e in producer.errors[:3]],
        "failovers": taken,
    }


def _started(producer: RateProducer) -> RateProducer:
    producer.start()
    return producer


def section_failover_hosts(ctx: Context) -> dict[str, Any]:
    from relay_dev.hosts import NamespaceCluster, netns
    from relay_dev.hosts.cluster import cleanup, cleanup_stale, new_run_dir, remove_run_dir

    if not netns.available():
        return {"figures": [], "details": {"skipped": "needs root, iproute2 and namespace rights"}}
    settle, steady = (5.0, 15.0) if ctx.options.quick else (10.0, 30.0)
    cleanup_stale()
    run_dir = new_run_dir()
    cluster = NamespaceCluster(run_dir, progress=ctx.progress, worker_cores=3, worker_memory="2g")
    try:
        with cluster:
            info = cluster.up()
            (run_dir / "client" / "pipelines.toml").write_text(PIPELINES_FILE)
            run = _measure(ctx, cluster, info, settle, steady)
    finally:
        with contextlib.suppress(Exception):
            cleanup(run_dir)
    remove_run_dir(run_dir)
    lat, eo = run["latency"], run["exactly_once"]
    quiet = lat["steady, standby waiting"]
    figures = [
        figure("postgres: steady, standby waiting: latency p50", quiet["p50_s"], "s"),
        figure("postgres: steady, standby waiting: latency p99", quiet["p99_s"], "s"),
        figure(
            "postgres: SIGKILL worker host (namespace), hot standby: pause",
            pause_s(lat["SIGKILL worker host, hot standby"], quiet),
            "s",
            "goal",
            GOAL_S,
        ),
        figure("postgres: records applied twice (must be 0)", eo["duplicates"], "records"),
        figure("postgres: records never applied (must be 0)", eo["gaps"], "records"),
    ]
    for f in figures:
        ctx.progress(f"failover-hosts: {f['name']} = {f['value']} {f['unit']}")
    if eo["duplicates"] or eo["gaps"] or run["unmatched"]:
        raise OperationError(
            f"{eo['duplicates']} duplicate(s), {eo['gaps']} gap(s), {run['unmatched']} unmatched"
        )
    return {"figures": figures, "details": {"rate": RATE, "settle_s": settle, "steady_s": steady, **run}}
