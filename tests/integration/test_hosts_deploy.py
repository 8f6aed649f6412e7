"""Relay deploys and stops its reference job on the namespace cluster, nothing read from the submitter's disk.

From the client host, with the cluster's settings, a PostgreSQL ledger, artifacts in the ledger
(``RELAY_ARTIFACT_STORE=ledger``) and checkpoints on the shared root (``RELAY_CHECKPOINT_ROOT``):
produce, ``relay deploy``, check the driver runs on a worker (never the client) from the artifact
the ledger holds (the client's ``artifacts/`` folder is invisible to the workers), ``relay audit
--deep`` clean; then the loss of the driver's worker host (every process SIGKILLed): the master
relaunches the driver on the other worker under a new id, Relay follows it, audit clean, ``relay
stop`` graceful. A second test upgrades blue-green (v1 -> v2) on the cluster. Needs root
(``ip netns``, mounts); ~3.5 + ~3 min.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from typing import Any

import pytest
import requests
from relay.config import PROJECT_ROOT
from relay.errors import SparkError
from relay_dev.hosts import NamespaceCluster, cleanup, cleanup_stale, new_run_dir, remove_run_dir
from relay_dev.hosts.netns import pids
from relay_dev.hosts.smoke import executor_hosts

pytestmark = [
    pytest.mark.integration,
    pytest.mark.multihost,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]

RELAY = str(PROJECT_ROOT / ".venv" / "bin" / "relay")
MESSAGES = 300


def relay(cluster: NamespaceCluster, env: dict[str, str], *args: str, timeout: float = 600) -> dict[str, Any]:
    """One Relay command on the client host; its JSON result (fails the test on a non-zero exit)."""
    t0 = time.monotonic()
    done = cluster.run_on("client", [RELAY, "--json", *args], env=env, timeout=timeout)
    print(f"relay {' '.join(args)}: exit {done.returncode} in {time.monotonic() - t0:.1f}s", flush=True)
    assert done.returncode == 0, f"relay {args} failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout)


def cluster_env(cluster: NamespaceCluster) -> dict[str, str]:
    info = cluster.info()
    return {
        **info.client_env,
        "RELAY_ARTIFACT_STORE": "ledger",
        "RELAY_CHECKPOINT_ROOT": info.checkpoint_root.as_uri(),
        "RELAY_WORKER_SPARK_DIR": str(info.host_local / "spark"),
        "RELAY_PARTITIONS": "3",
        "RELAY_TRIGGER_SECONDS": "1",
    }


def driver_placement(cluster: NamespaceCluster, env: dict[str, str]) -> dict[str, Any]:
    """The instance's driver as the ledger and the master see it, read on the client's network."""
    from relay.config import load_config
    from relay.launcher import spark_client
    from relay.ledger.store import Ledger

    def look() -> dict[str, Any]:
        cfg = load_config(env)
        ledger = Ledger(cfg.ledger_url)
        try:
            inst = ledger.instances(cfg.pipeline)[-1]
            attempts = ledger.attempts(inst.id)
        finally:
            ledger.close()
        client = spark_client(cfg)
        try:
            state = client.master_state()
            driver = state.driver(inst.submission_id or "")
            worker = next((w for w in state.workers if driver and w.id == driver.worker), None)
            try:
                stdout = client.driver_log_tail(inst.submission_id or "", 65536, "stdout")
            except (SparkError, requests.RequestException):  # its worker is gone (host loss)
                stdout = ""
            app = attempts[-1].app_id if attempts else None
            try:
                executors = executor_hosts(state, app) if app and inst.state.live else []
            except requests.RequestException:  # a lost worker the master still lists
                executors = ["?"]
        finally:
            client.close()
        return {
            "instance": inst.id,
            "state": inst.state.value,
            "submission": inst.submission_id,
            "checkpoint_dir": inst.checkpoint_dir,
            "attempt_drivers": [a.driver_id for a in attempts],
            "driver_state": driver.state.value if driver else None,
            "driver_host": worker.host if worker else None,
            "executor_hosts": executors,
            "bootstrap_lines": [line for line in stdout.splitlines() if "relay artifact bootstrap" in line],
        }

    return cluster.call_in("client", look)


def test_deploy_and_stop_on_the_namespace_cluster() -> None:
    phases: dict[str, float] = {}
    stale = cleanup_stale()
    if stale:
        print(f"cleaned up stale runs: {stale}")
    run_dir = new_run_dir()
    cluster = NamespaceCluster(run_dir, progress=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True))

    @contextlib.contextmanager
    def phase(name: str) -> Any:
        t0 = time.monotonic()
        yield
        phases[name] = round(time.monotonic() - t0, 2)
        print(f"phase {name}: {phases[name]}s", flush=True)

    try:
        with cluster:
            with phase("up"):
                info = cluster.up()
            env = cluster_env(cluster)
            workers = {info.addresses["worker1"], info.addresses["worker2"]}
            client_dir = run_dir / "client"

            with phase("ledger init + produce"):
                relay(cluster, env, "ledger", "init")
                produced = relay(cluster, env, "produce", "--count", str(MESSAGES))
            print(f"produced: {produced}")

            with phase("deploy v1 (first commit)"):
                deployed = relay(cluster, env, "deploy", "--version", "v1", "--wait", "400")
            print(f"deploy: {deployed}")

            placed = driver_placement(cluster, env)
            print(f"driver: {placed}")
            assert placed["driver_host"] in workers, placed
            assert placed["submission"] in placed["attempt_drivers"], placed
            assert placed["checkpoint_dir"].startswith(str(info.checkpoint_root)), placed
            assert any("from the ledger" in line for line in placed["bootstrap_lines"]), placed
            # The artifact the client built is on the client's disk, which no worker sees.
            built = client_dir / "artifacts" / "v1"
            assert (built / "relay_job.zip").is_file()
            for worker in ("worker1", "worker2"):
                seen = cluster.run_on(worker, ["ls", "-A", str(client_dir)])
                assert seen.stdout.split() == [], (worker, seen.stdout)

            with phase("wait until every message is applied"):
                wait_applied(cluster, env, MESSAGES)

            with phase("host loss: driver relaunched on the other worker"):
                lost = lose_driver_host(cluster, env, placed)
            print(f"after host loss: {lost}")
            assert lost["driver_host"] in workers - {placed["driver_host"]}, lost
            assert lost["submission"] != placed["submission"], lost  # Relay follows the new driver
            assert lost["attempt_drivers"][-1] == lost["submission"], lost

            with phase("wait until the new messages are applied"):
                wait_applied(cluster, env, 2 * MESSAGES)

            with phase("stop"):
                stopped = relay(cluster, env, "stop", timeout=300)
            print(f"stop: {stopped}")
            final = driver_placement(cluster, env)
            assert final["state"] == "STOPPED", final

            with phase("audit --deep after stop"):
                audit = relay(cluster, env, "audit", "--deep", timeout=300)
            assert audit["ok"], audit
            with phase("down"):
                cluster.down()
        print("\n".join(f"  {k:<40} {v:>7.2f}s" for k, v in phases.items()), flush=True)
    finally:
        with contextlib.suppress(Exception):
            cleanup(run_dir)
    remove_run_dir(run_dir)


def wait_applied(cluster: NamespaceCluster, env: dict[str, str], count: int, timeout_s: float = 300) -> None:
    """``relay audit --deep`` until it is clean with ``count`` records applied exactly once."""
    deadline = time.monotonic() + timeout_s
    while True:
        audit = relay(cluster, env, "audit", "--deep", timeout=300)
        if audit["ok"] and audit["totals"]["applied_once"] == audit["applied_rows"] == count:
            print(f"audit --deep: {json.dumps(audit['totals'])}", flush=True)
            return
        assert time.monotonic() < deadline, audit
        time.sleep(3)


def lose_driver_host(
    cluster: NamespaceCluster, env: dict[str, str], placed: dict[str, Any]
) -> dict[str, Any]:
    """Produce more, then SIGKILL every process of the worker host that runs the driver (worker,
    driver, executors, supervisord: the host is gone); wait until the master runs a relaunched
    driver on the other worker and it took an attempt in the ledger."""
    relay(cluster, env, "produce", "--count", str(MESSAGES))
    host = next(h for h in ("worker1", "worker2") if cluster.info().addresses[h] == placed["driver_host"])
    victims = pids(cluster.layout.ns(host))
    print(f"killing host {host}: {len(victims)} processes", flush=True)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 300
    while True:
        now = driver_placement(cluster, env)
        if (
            now["submission"] != placed["submission"]
            and now["driver_state"] == "RUNNING"
            and now["attempt_drivers"][-1] == now["submission"]
            and now["state"] == "ACTIVE"
        ):
            return now
        assert time.monotonic() < deadline, now
        time.sleep(2)


def test_blue_green_upgrade_on_the_namespace_cluster() -> None:
    """v1 runs; ``relay upgrade --version v2`` starts green (its code from the ledger too, on any
    worker), hands off, stops blue; every record applied exactly once; ``relay stop``."""
    run_dir = new_run_dir()
    cluster = NamespaceCluster(run_dir, progress=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True))
    t0 = time.monotonic()
    try:
        with cluster:
            info = cluster.up()
            env = cluster_env(cluster)
            workers = {info.addresses["worker1"], info.addresses["worker2"]}
            relay(cluster, env, "ledger", "init")
            relay(cluster, env, "produce", "--count", str(MESSAGES))
            relay(cluster, env, "deploy", "--version", "v1", "--wait", "400")
            blue = driver_placement(cluster, env)
            relay(cluster, env, "build", "--version", "v2")
            upgraded = relay(cluster, env, "upgrade", "--version", "v2", timeout=900)
            print(f"upgrade: {json.dumps(upgraded, default=str)[:3000]}", flush=True)
            green = driver_placement(cluster, env)
            print(f"blue: {blue}\ngreen: {green}", flush=True)
            assert green["instance"] != blue["instance"] and green["state"] == "ACTIVE", green
            assert green["driver_host"] in workers, green
            assert any("experience v2" in line for line in green["bootstrap_lines"]), green
            relay(cluster, env, "produce", "--count", str(MESSAGES))
            wait_applied(cluster, env, 2 * MESSAGES)
            relay(cluster, env, "stop", timeout=300)
            assert relay(cluster, env, "audit", "--deep", timeout=300)["ok"]
            cluster.down()
        print(f"upgrade test: {time.monotonic() - t0:.1f}s", flush=True)
    finally:
        with contextlib.suppress(Exception):
            cleanup(run_dir)
    remove_run_dir(run_dir)
