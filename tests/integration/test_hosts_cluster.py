"""The multi-host test cluster made of network namespaces (issue 14's first building block).

Brings up master, two workers, broker, ledger and client hosts, each a network namespace with its
own address and folder, and checks from the client host what a real cluster must show: both workers
ALIVE at their own addresses, a cluster-mode Python app with executors on both workers, the broker
and PostgreSQL reachable, other hosts' folders hidden, the shared folder shared; then tears it
down and finds nothing of the run left. A second test kills the orchestrator mid-way (SIGKILL)
and cleans up by the run's state file. Needs root (``ip netns``, mounts).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT
from relay_dev.hosts import NamespaceCluster, cleanup, cleanup_stale, netns, new_run_dir, remove_run_dir
from relay_dev.hosts.netns import ip
from relay_dev.hosts.state import Proc, RunState

from tests.conftest import Phases, wait_for

# The cleanup tests run in `make test`; the smoke test (~1.5 min) in `make test-hosts`, `make test-long`:
# test_hosts_deploy.py, in `make test`, builds the same cluster and checks the same from Relay's side.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.multihost,
    pytest.mark.skipif(not netns.available(), reason="needs root, iproute2 and namespace rights"),
]

APP = PROJECT_ROOT / "tests" / "integration" / "apps" / "rogue_app.py"
SMOKE = [sys.executable, "-m", "relay_dev.hosts.smoke"]


def namespaces_named(prefix: str) -> list[str]:
    return [
        line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.startswith(prefix + "-")
    ]


def processes_mentioning(path: Path) -> list[int]:
    """Live processes whose command line names ``path`` (anything of the run's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if (
                    str(path).encode() in (entry / "cmdline").read_bytes()
                    and Proc.of(int(entry.name)).alive()
                ):
                    found.append(int(entry.name))
    return found


def smoke(cluster: NamespaceCluster, *args: str, timeout: float = 300) -> dict:
    env = cluster.info().client_env
    done = cluster.run_on("client", [*SMOKE, *args], env=env, timeout=timeout)
    assert done.returncode == 0, f"smoke {args[0]} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def listeners(cluster: NamespaceCluster, host: str) -> list[str]:
    """Local addresses (without port) of the host's listening TCP sockets."""
    done = cluster.run_on(host, ["ss", "-Hltn"], check=True)
    return [
        line.split()[3].rsplit(":", 1)[0].strip("[]") for line in done.stdout.splitlines() if line.strip()
    ]


def test_namespace_cluster_runs_spark_kafka_postgres_across_hosts() -> None:
    phase = Phases()
    stale = cleanup_stale()
    if stale:
        print(f"cleaned up stale runs: {stale}")
    run_dir = new_run_dir()
    cluster = NamespaceCluster(run_dir, progress=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True))
    prefix = cluster.layout.prefix
    try:
        with cluster:
            with phase("up"):
                info = cluster.up()
            addr = info.addresses
            workers = sorted([addr["worker1"], addr["worker2"]])

            with phase("master /json/ from client"):
                master = smoke(cluster, "master")
            assert master["status"] == "ALIVE"
            alive = sorted(w["host"] for w in master["workers"] if w["state"] == "ALIVE")
            assert alive == workers, master

            with phase("listeners bind own address"):
                for host in ("master", "worker1", "worker2", "broker", "ledger"):
                    own = {addr[host], f"::ffff:{addr[host]}", "127.0.0.1", "::1", "::ffff:127.0.0.1"}
                    bound = listeners(cluster, host)
                    assert bound and set(bound) <= own, f"{host} listens on {bound}"

            with phase("cluster-mode app on both workers"):
                app = smoke(
                    cluster, "spark-app", str(APP), "--host-local", str(info.host_local), "--timeout", "240"
                )
            print(f"spark app: {app}")
            assert app["executor_hosts"] == workers, app
            assert app["driver_host"] in workers, app
            assert app["final_state"] == "KILLED", app

            with phase("kafka from client"):
                kafka = smoke(cluster, "kafka", "--count", "20")
            assert kafka["consumed"] == 20 and kafka["same"], kafka

            with phase("postgres from client"):
                pg = smoke(cluster, "postgres")
            assert (pg["server_addr"], pg["client_addr"]) == (addr["ledger"], addr["client"]), pg

            with phase("folder isolation"):
                check_isolation(cluster, run_dir)

            recorded = [Proc.of(p) for pids in cluster.processes().values() for p in pids]
            assert len(recorded) >= 10, cluster.processes()
            with phase("down"):
                cluster.down()
        assert namespaces_named(prefix) == []
        assert [p.pid for p in recorded if p.alive()] == []
        assert processes_mentioning(run_dir) == []
        assert RunState.load(run_dir / "state.json").status == "down"
        phase.report()
    finally:
        with contextlib.suppress(Exception):
            cleanup(run_dir)
    remove_run_dir(run_dir)


def check_isolation(cluster: NamespaceCluster, run_dir: Path) -> None:
    """worker1 sees neither worker2's nor master's files; both see the shared checkpoint root."""
    own = cluster.run_on("worker1", ["ls", "-A", str(run_dir / "worker1")], check=True).stdout.split()
    assert "spark" in own and "supervisor" in own
    assert (run_dir / "worker2" / "spark").is_dir()  # really there (root namespace's view)
    hidden = cluster.run_on("worker1", ["ls", "-A", str(run_dir / "worker2")], check=True).stdout.split()
    assert hidden == [], hidden
    conf = run_dir / "worker2" / "supervisor" / "supervisord.conf"
    assert cluster.run_on("worker1", ["cat", str(conf)]).returncode != 0
    assert cluster.run_on("worker1", ["touch", str(run_dir / "worker2" / "planted")]).returncode != 0
    assert not (run_dir / "worker2" / "planted").exists()
    key = run_dir / "master" / "secrets" / "spark-rest.key"
    assert cluster.run_on("client", ["cat", str(key)]).returncode != 0
    # <run>/local is each host's own folder
    local = cluster.run_on("worker2", ["ls", "-A", str(cluster.layout.host_local / "spark" / "work")]).stdout
    assert local.split() == sorted(p.name for p in (run_dir / "worker2" / "spark" / "work").iterdir())
    # the running parts see the same: look through each supervisord's own root (its mount namespace)
    assert cluster.state is not None
    for host, other in (
        ("worker1", "worker2"),
        ("worker2", "master"),
        ("ledger", "broker"),
        ("master", "ledger"),
    ):
        view = Path(f"/proc/{cluster.state.supervisors[host].pid}/root")
        assert os.listdir(f"{view}{run_dir / other}") == [], (host, other)
        assert "supervisor" in os.listdir(f"{view}{run_dir / host}"), host
    note = cluster.layout.checkpoint_root / "from-worker2"
    cluster.run_on("worker2", ["sh", "-c", f"echo written-on-worker2 > {note}"], check=True)
    seen = cluster.run_on("worker1", ["cat", str(note)], check=True).stdout.strip()
    assert seen == "written-on-worker2"


def test_interrupted_up_tears_down_what_it_started() -> None:
    """Ctrl-C (KeyboardInterrupt) after broker, ledger and master started: ``up`` removes them."""
    run_dir = new_run_dir()

    def progress(message: str) -> None:
        print(time.strftime("%H:%M:%S"), message, flush=True)
        if message.startswith("broker, ledger, master:"):
            raise KeyboardInterrupt

    cluster = NamespaceCluster(run_dir, progress=progress)
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.up()
        started = RunState.load(run_dir / "state.json")
        assert started is not None and set(started.supervisors) == {"broker", "ledger", "master"}
        assert started.status == "down"
        assert namespaces_named(cluster.layout.prefix) == []
        assert not any(p.alive() for p in [*started.supervisors.values(), *started.seen])
        assert processes_mentioning(run_dir) == []
    finally:
        with contextlib.suppress(Exception):
            cleanup(run_dir)
    remove_run_dir(run_dir)


def test_cleanup_removes_a_killed_run_by_its_state_file() -> None:
    """The orchestrator is SIGKILLed while it brings the cluster up; ``cleanup`` removes the rest."""
    run_dir = new_run_dir()
    script = (
        "import sys; from pathlib import Path; from relay_dev.hosts import NamespaceCluster; "
        "NamespaceCluster(Path(sys.argv[1])).up()"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(run_dir)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state_file = run_dir / "state.json"
    try:
        wait_for(
            "the broker's supervisord to be recorded",
            lambda: "broker" in getattr(RunState.load(state_file), "supervisors", {}),
            timeout=120,
        )
        state = RunState.load(state_file)
        assert state is not None
        with pytest.raises(Exception, match="still owned"):
            cleanup(run_dir)  # refused while the owner lives
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=30)
        assert namespaces_named(state.prefix)  # what the killed run left
        t0 = time.monotonic()
        report = cleanup(run_dir)
        print(f"cleanup of the killed run: {time.monotonic() - t0:.2f}s, {report}")
        assert namespaces_named(state.prefix) == []
        assert processes_mentioning(run_dir) == []
        assert not any(p.alive() for p in RunState.load(state_file).supervisors.values())
    finally:
        if owner.poll() is None:
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(timeout=30)
        with contextlib.suppress(Exception):
            cleanup(run_dir)
    remove_run_dir(run_dir)
