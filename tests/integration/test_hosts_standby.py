"""Issue #18 on the namespace cluster: a hot standby waits on the other worker host than the active's,
and the loss of the active's host (every process of it SIGKILLed) fails over to it in seconds, with
every record applied once (``relay audit --deep`` reads the counter's sink).

From the client host with the README's cluster settings and a pipelines file with
``standby = "hot"``: ``relay deploy`` (it starts the standby after the first commit) -> the standby
READY on the other host -> the active's host lost -> the standby ACTIVE and committing (the seconds
printed) -> more records -> ``relay audit --deep`` clean -> ``relay stop``. Needs root; ~5 min.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest
from relay_dev.hosts import NamespaceCluster, netns
from relay_dev.hosts.netns import pids

from tests.conftest import Phases
from tests.integration.test_hosts_deploy import MESSAGES, cluster_run, relay, running_apps, wait_applied

pytestmark = [
    pytest.mark.integration,
    pytest.mark.multihost,
    pytest.mark.slow,  # `make test-hosts`
    pytest.mark.skipif(not netns.available(), reason="needs root, iproute2 and namespace rights"),
]

PIPELINES_FILE = """\
[pipelines.experience]
topic = "experience"
partitions = 3
standby = "hot"
"""


def instances(cluster: NamespaceCluster, env: dict[str, str]) -> list[dict[str, Any]]:
    """The pipeline's live instances with their driver's host, as the ledger and the master see them."""
    from relay.config import load_config
    from relay.ledger.store import Ledger
    from relay.spark.launcher import spark_client

    def look() -> list[dict[str, Any]]:
        cfg = load_config(env)
        ledger = Ledger(cfg.ledger_url)
        try:
            live = ledger.instances(cfg.pipeline, live_only=True)
            committed = {
                i.id: any(lease.next_offset > lease.start_offset for lease in ledger.leases(i.id))
                for i in live
            }
        finally:
            ledger.close()
        with contextlib.closing(spark_client(cfg)) as client:
            state = client.master_state()
        hosts = {w.id: w.host for w in state.workers}
        out = []
        for i in live:
            driver = state.driver(i.submission_id or "")
            out.append(
                {
                    "id": i.id,
                    "state": i.state.value,
                    "role": i.role,
                    "host": hosts.get(driver.worker) if driver else None,
                    "committed": committed[i.id],
                }
            )
        return out

    return cluster.call_in("client", look)


def wait_for(
    cluster: NamespaceCluster, env: dict[str, str], what: str, ok: Any, timeout_s: float
) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        now = instances(cluster, env)
        if ok(now):
            return now
        assert time.monotonic() < deadline, f"{what}: {now}"
        time.sleep(0.5)


def test_a_hot_standby_on_the_other_host_takes_over_a_host_loss() -> None:
    phase = Phases()
    with cluster_run() as (cluster, run_dir):
        with phase("up"):
            info = cluster.up()
        env = info.client_env
        (run_dir / "client" / "pipelines.toml").write_text(PIPELINES_FILE)
        workers = {info.addresses["worker1"], info.addresses["worker2"]}
        relay(cluster, env, "ledger", "init")
        sent = relay(cluster, env, "produce", "--count", str(MESSAGES))["sent"]
        with phase("deploy + hot standby READY"):
            deployed = relay(cluster, env, "deploy", "--version", "v1", "--wait", "400")
            assert deployed["standby"]["started"], deployed
            now = wait_for(
                cluster,
                env,
                "the standby READY",
                lambda live: any(i["role"] == "hot-standby" and i["state"] == "READY" for i in live),
                300,
            )
        active = next(i for i in now if i["role"] is None)
        standby = next(i for i in now if i["role"] == "hot-standby")
        print(f"active {active}, standby {standby}", flush=True)
        assert {active["host"], standby["host"]} == workers, "the standby waits on the other host"
        wait_applied(cluster, env, sent)

        host = next(h for h in ("worker1", "worker2") if info.addresses[h] == active["host"])
        victims = pids(cluster.layout.ns(host))
        with phase("host loss -> the standby commits"):
            t0 = time.monotonic()
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            sent += relay(cluster, env, "produce", "--count", str(MESSAGES))["sent"]
            wait_for(
                cluster,
                env,
                "the standby ACTIVE and committing",
                lambda live: any(
                    i["id"] == standby["id"] and i["state"] == "ACTIVE" and i["committed"] for i in live
                ),
                120,
            )
            took = time.monotonic() - t0
        print(
            f"host {host} lost ({len(victims)} processes): the standby committed {took:.1f}s later",
            flush=True,
        )
        with phase("every record once (audit --deep reads the sink)"):
            wait_applied(cluster, env, sent)
        status = relay(cluster, env, "status")
        assert [f["to_instance"] for f in status["failovers"]] == [standby["id"]], status["failovers"]
        with phase("stop"):
            relay(cluster, env, "stop", timeout=300)
        assert running_apps(cluster, env) == []
        with phase("down"):
            cluster.down()
        phase.report()
