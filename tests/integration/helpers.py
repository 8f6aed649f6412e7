"""Helpers of the integration tests: a rogue Spark application, a caught-up check."""

from __future__ import annotations

import json
import subprocess
import sys

from relay.artifacts import artifact
from relay.config import PROJECT_ROOT, RelayConfig
from relay.kafka_offsets import KafkaOffsets
from relay.launcher import driver_args, driver_environment, spark_client, submission_environment
from relay.ledger.store import Ledger
from relay.spark_rest import driver_properties
from relay_dev.airflow_local import airflow_env

from tests.conftest import wait_for


def start_rogue_app(cfg: RelayConfig, name: str, seconds: int = 300) -> str:
    """Submit an app named ``name``; return its submission id once the master lists it as active."""
    client = spark_client(cfg)
    app = str(PROJECT_ROOT / "tests" / "integration" / "apps" / "rogue_app.py")
    props = driver_properties(cfg, name, supervise=False, py_files=[])
    before = {a.id for a in client.apps_named(name)}
    sub = client.submit_python(app, [str(seconds)], props, driver_environment(cfg))
    wait_for(
        f"rogue app {name} to be active",
        lambda: any(a.id not in before for a in client.apps_named(name)),
        timeout=120,
    )
    return sub


def submit_copy(cfg: RelayConfig, ledger: Ledger, instance_id: int, token: str | None) -> str:
    """What Relay submits for the instance (same artifact, arguments, properties), minus its token."""
    inst = ledger.instance(instance_id)
    art = artifact(cfg, inst.version)
    code = str(art.zip_file)
    props = driver_properties(
        cfg,
        inst.app_name,
        supervise=True,
        py_files=[code],
        extra={"spark.driverEnv.PYTHONPATH": code, "spark.executorEnv.PYTHONPATH": code},
    )
    env = submission_environment(cfg, code, token)
    return spark_client(cfg).submit_python(str(art.job_file), driver_args(cfg, inst, True), props, env)


def caught_up(cfg: RelayConfig, ledger: Ledger) -> bool:
    """Every partition's lowest unfinished cursor has reached the latest offset."""
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        latest = kafka.latest(cfg.topic)
    cursors: dict[int, int] = {}
    for lease in ledger.pipeline_leases(cfg.pipeline):
        if not lease.drained:
            cursors[lease.partition] = min(cursors.get(lease.partition, lease.next_offset), lease.next_offset)
    return bool(latest) and all(cursors.get(p, -1) >= o for p, o in latest.items())


RUNNER = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(sys.argv[1]).dags[sys.argv[2]]
run = dag.test(run_conf=json.loads(sys.argv[3]))
print("DAG_RUN_STATE=" + str(getattr(run.state, "value", run.state)))
"""


def run_dag_test(config: RelayConfig, dag_id: str, conf: dict) -> tuple[str, str]:
    """``dag.test(run_conf=conf)`` in a subprocess; returns (final run state, the run's output)."""
    cmd = [sys.executable, "-c", RUNNER, str(PROJECT_ROOT / "dags"), dag_id, json.dumps(conf)]
    result = subprocess.run(
        cmd, env=airflow_env(config), capture_output=True, text=True, timeout=600, check=False
    )
    output = result.stdout + result.stderr
    marker = "DAG_RUN_STATE="
    states = [line[len(marker) :] for line in result.stdout.splitlines() if line.startswith(marker)]
    assert states, f"dag.test() of {dag_id} did not finish (exit {result.returncode}):\n{output[-4000:]}"
    return states[-1], output
