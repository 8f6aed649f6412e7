"""Issue #14's acceptance: Relay deploys, upgrades blue-green and recovers the counter (its default
pipeline) on the namespace cluster, survives the loss of the driver's worker host, and nothing is
read from the submitter's disk.

From the client host with exactly the settings README "Running on a real cluster" lists
(``hosts.Layout.client_config``: PostgreSQL ledger on its own host, artifacts in the ledger,
checkpoints on the shared store as a ``file:///`` URI, a worker-side Spark dir) and a pipelines file
giving the pipeline two executor cores: ``relay deploy`` (the driver on a worker, its code from the
ledger, executors on both workers) -> ``relay upgrade`` v1 -> v2 -> the loss of green's driver host
(every process SIGKILLed: the master relaunches the driver on the other worker, Relay follows it) ->
``relay stop`` -> retention deletes unread records -> ``relay recover --execute`` (the checkpoint
archived on the shared store) -> ``relay stop``. ``relay audit --deep`` is clean after each step,
with exactly the deleted records declared lost. Needs root (``ip netns``, mounts); ~7 min.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from relay.config import PROJECT_ROOT
from relay.errors import SparkError
from relay_dev.hosts import NamespaceCluster, cleanup, cleanup_stale, netns, new_run_dir, remove_run_dir
from relay_dev.hosts.netns import pids
from relay_dev.hosts.smoke import executor_hosts

from tests.conftest import Phases

pytestmark = [
    pytest.mark.integration,
    pytest.mark.multihost,
    pytest.mark.slow,  # ~9 min: `make test-hosts`; `make test` runs the cluster's smoke test instead
    pytest.mark.skipif(not netns.available(), reason="needs root, iproute2 and namespace rights"),
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


PIPELINES_FILE = """\
# The counter with two executor cores: one executor on each worker (Spark spreads them).
[pipelines.experience]
topic = "experience"
partitions = 3
trigger_seconds = 1.0
[pipelines.experience.spark]
cores_max = 2
"""


def driver_placement(cluster: NamespaceCluster, env: dict[str, str]) -> dict[str, Any]:
    """The instance's driver as the ledger and the master see it, read on the client's network."""
    from relay.config import load_config
    from relay.ledger.store import Ledger
    from relay.spark.launcher import spark_client

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
            "app_name": inst.app_name,
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


@contextlib.contextmanager
def cluster_run() -> Iterator[tuple[NamespaceCluster, Path]]:
    """A namespace cluster of 3 cores / 2 GiB per worker (blue and green, a driver and two executors
    each, fit side by side; after a host loss one worker still holds a driver and two executors),
    torn down whatever happens; its run folder removed when the test passed."""
    if stale := cleanup_stale():
        print(f"cleaned up stale runs: {stale}")
    run_dir = new_run_dir()
    cluster = NamespaceCluster(
        run_dir,
        progress=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True),
        worker_cores=3,
        worker_memory="2g",
    )
    try:
        with cluster:
            yield cluster, run_dir
    finally:
        with contextlib.suppress(Exception):
            cleanup(run_dir)
    remove_run_dir(run_dir)


def test_deploy_upgrade_host_loss_and_recovery_on_the_namespace_cluster() -> None:
    phase = Phases()
    with cluster_run() as (cluster, run_dir):
        with phase("up"):
            info = cluster.up()
        env = info.client_env  # the README's cluster settings, nothing added
        assert env["RELAY_ARTIFACT_STORE"] == "ledger"
        assert env["RELAY_CHECKPOINT_ROOT"] == info.checkpoint_root.as_uri()
        workers = {info.addresses["worker1"], info.addresses["worker2"]}
        client_dir = run_dir / "client"
        (client_dir / "pipelines.toml").write_text(PIPELINES_FILE)  # the client's data dir
        sent = 0

        with phase("ledger init + produce"):
            relay(cluster, env, "ledger", "init")
            sent += relay(cluster, env, "produce", "--count", str(MESSAGES))["sent"]

        with phase("deploy v1 (first commit)"):
            deployed = relay(cluster, env, "deploy", "--version", "v1", "--wait", "400")
        print(f"deploy: {deployed}")
        blue = driver_placement(cluster, env)
        print(f"blue: {blue}")
        assert blue["driver_host"] in workers, blue
        assert blue["submission"] in blue["attempt_drivers"], blue
        assert blue["checkpoint_dir"].startswith(str(info.checkpoint_root)), blue
        assert any("from the ledger" in line for line in blue["bootstrap_lines"]), blue
        assert set(blue["executor_hosts"]) == workers, f"one pipeline's tasks on both workers: {blue}"
        # The artifact the client built is on the client's disk, which no worker sees.
        assert list(client_dir.rglob("v1/relay_job.zip")), "relay deploy built v1 on the client"
        for worker in ("worker1", "worker2"):
            seen = cluster.run_on(worker, ["ls", "-A", str(client_dir)])
            assert seen.stdout.split() == [], (worker, seen.stdout)
        with phase("v1 applies every message"):
            wait_applied(cluster, env, sent)

        with phase("upgrade v1 -> v2"):
            relay(cluster, env, "build", "--version", "v2")
            upgraded = relay(cluster, env, "upgrade", "--version", "v2", timeout=900)
        print(f"upgrade: {json.dumps(upgraded, default=str)[:2000]}", flush=True)
        green = driver_placement(cluster, env)
        print(f"green: {green}")
        assert green["instance"] != blue["instance"] and green["state"] == "ACTIVE", green
        assert green["driver_host"] in workers, green
        assert any("experience v2" in line for line in green["bootstrap_lines"]), green
        assert [a["name"] for a in running_apps(cluster, env)] == [f"relay-experience-{green['instance']}"]
        sent += relay(cluster, env, "produce", "--count", str(MESSAGES))["sent"]
        with phase("v2 applies the new messages"):
            wait_applied(cluster, env, sent)

        with phase("host loss: driver relaunched on the other worker"):
            sent += relay(cluster, env, "produce", "--count", str(MESSAGES))["sent"]
            lost_host = lose_driver_host(cluster, env, green)
        print(f"after host loss: {lost_host}")
        assert lost_host["driver_host"] in workers - {green["driver_host"]}, lost_host
        assert lost_host["submission"] != green["submission"], lost_host  # Relay follows the new driver
        assert lost_host["attempt_drivers"][-1] == lost_host["submission"], lost_host
        with phase("the relaunched driver applies the rest"):
            wait_applied(cluster, env, sent)

        with phase("stop"):
            relay(cluster, env, "stop", timeout=300)
        assert driver_placement(cluster, env)["state"] == "STOPPED"
        assert running_apps(cluster, env) == []

        # Retention deletes records the stopped pipeline never read; the recovery declares them.
        sent += relay(cluster, env, "produce", "--count", str(MESSAGES))["sent"]
        lost = cluster.call_in("client", lambda: delete_unread(env, partition=0, keep=20))
        print(f"deleted {lost} unread records of partition 0", flush=True)
        assert lost > 0
        checkpoint = driver_placement(cluster, env)["checkpoint_dir"]
        with phase("recover (earliest) + first commit"):
            recovered = relay(
                cluster, env, "recover", "--strategy", "earliest", "--execute", "--reason", "host test"
            )
        print(f"recover: {json.dumps(recovered, default=str)[:2000]}", flush=True)
        archived = cluster.call_in("client", lambda: archived_checkpoints(env))
        assert any(a.startswith(checkpoint + ".archived-") for a in archived), (archived, checkpoint)
        for folder in map(Path, archived):  # archived, never deleted, on the shared store
            assert folder.is_dir() and folder.is_relative_to(info.checkpoint_root), folder
        assert not Path(checkpoint).exists()
        after = driver_placement(cluster, env)
        assert after["state"] == "ACTIVE" and after["driver_host"] == lost_host["driver_host"], after
        with phase("the recovered instance applies the rest"):
            report = wait_applied(cluster, env, sent - lost, lost=lost)
        assert [p["declared_lost"] for p in report["partitions"]][0] == lost, report

        with phase("stop + audit --deep"):
            relay(cluster, env, "stop", timeout=300)
            assert relay(cluster, env, "audit", "--deep", timeout=300)["ok"]
        assert running_apps(cluster, env) == []
        with phase("down"):
            cluster.down()
        phase.report()


def wait_applied(
    cluster: NamespaceCluster, env: dict[str, str], count: int, lost: int = 0, timeout_s: float = 300
) -> dict[str, Any]:
    """``relay audit --deep`` until it is clean with ``count`` records applied exactly once and
    ``lost`` declared lost; returns that audit."""
    deadline = time.monotonic() + timeout_s
    while True:
        audit = relay(cluster, env, "audit", "--deep", timeout=300)
        totals = audit["totals"]
        if (
            audit["ok"]
            and totals["applied_once"] == audit["applied_rows"] == count
            and totals["declared_lost"] == lost
        ):
            print(f"audit --deep: {json.dumps(totals)}", flush=True)
            return audit
        assert time.monotonic() < deadline, audit
        time.sleep(3)


def running_apps(cluster: NamespaceCluster, env: dict[str, str]) -> list[dict[str, Any]]:
    """The pipeline's applications the master runs (its ``/json/``, read on the client's network)."""
    from relay.config import load_config
    from relay.operations.inventory import master_apps

    cfg = load_config(env)
    return cluster.call_in(
        "client", lambda: [{"name": a.name, "id": a.id} for a in master_apps(cfg, cfg.pipeline)]
    )


def delete_unread(env: dict[str, str], partition: int, keep: int) -> int:
    """Delete a partition's records up to ``keep`` before its end, past the stopped pipeline's cursor
    (retention did it); the number of records it never read that are gone."""
    from relay.config import load_config
    from relay.kafka.offsets import KafkaOffsets
    from relay.ledger.store import Ledger

    cfg = load_config(env)
    ledger = Ledger(cfg.ledger_url)
    try:
        cursor = max(
            lease.next_offset
            for lease in ledger.pipeline_leases(cfg.pipeline)
            if lease.partition == partition
        )
    finally:
        ledger.close()
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        end = kafka.latest(cfg.topic)[partition]
        kafka.delete_records(cfg.topic, {partition: end - keep})
    return end - keep - cursor


def archived_checkpoints(env: dict[str, str]) -> list[str]:
    """The checkpoint folders the newest recovery archived (its ledger record)."""
    from relay.config import load_config
    from relay.ledger.store import Ledger

    cfg = load_config(env)
    ledger = Ledger(cfg.ledger_url)
    try:
        return list(ledger.operations(cfg.pipeline, "recovery", 1)[0]["data"]["archived_checkpoints"])
    finally:
        ledger.close()


def lose_driver_host(
    cluster: NamespaceCluster, env: dict[str, str], placed: dict[str, Any]
) -> dict[str, Any]:
    """SIGKILL every process of the worker host that runs the driver (worker, driver, executors,
    supervisord: the host is gone); wait until the master runs a relaunched driver on the other
    worker and it took an attempt in the ledger."""
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
