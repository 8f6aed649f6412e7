"""The DAGs against the real embedded stack: dag.test() of relay_deploy / relay_stop, and one trigger
through a running Airflow's REST API.

``dag.test()`` runs in a subprocess with :func:`relay_dev.airflow_local.airflow_env`: Airflow's settings
are process-global (read at import), the subprocess gets the stack's AIRFLOW_HOME and connections, and
pytest's own logging stays untouched. The run's state is asserted (``dag.test()`` does not raise).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import StackError
from relay.ledger.store import Ledger
from relay.operations.inventory import master_apps
from relay.operations.stop import stop
from relay.producer import produce
from relay_dev.airflow_local import (
    LocalAirflow,
    airflow_env,
    ensure_airflow_db,
    trigger_dag_rest,
    wait_dag_run,
)
from relay_dev.stack import session_pids

from tests.conftest import free_port
from tests.integration.helpers import run_dag_test

pytestmark = pytest.mark.integration


def _private(stack: RelayConfig, name: str) -> RelayConfig:
    """A pipeline and topic of this test only, so other tests sharing the stack are not disturbed."""
    suffix = uuid.uuid4().hex[:6]
    config = stack.with_(pipeline=f"{name}{suffix}", topic=f"{name}-{suffix}")
    produce(config.kafka_bootstrap, config.topic, 200, None, partitions=config.partitions)
    return config


@pytest.fixture
def dags_config(stack: RelayConfig) -> Iterator[RelayConfig]:
    config = _private(stack, "afdags")
    ensure_airflow_db(config)
    yield config
    if master_apps(config, config.pipeline):  # a failed assertion must not leave a driver running
        stop(config, timeout_s=30)


def test_deploy_then_refuse_a_second_deploy_then_stop(dags_config: RelayConfig) -> None:
    config = dags_config
    ledger = Ledger(config.ledger_url, create=True)

    state, output = run_dag_test(config, "relay_deploy", {"version": "v1", "wait_seconds": 240})
    assert state == "success", output[-4000:]
    instances = ledger.instances(config.pipeline)
    assert len(instances) == 1 and instances[0].state.value == "ACTIVE"
    assert [a.name for a in master_apps(config, config.pipeline)] == [instances[0].app_name]

    state, output = run_dag_test(config, "relay_deploy", {"version": "v2", "wait_seconds": 60})
    assert state == "failed"
    assert "already running" in output
    assert len(ledger.instances(config.pipeline)) == 1, "the refused deploy created an instance"
    assert [a.name for a in master_apps(config, config.pipeline)] == [instances[0].app_name]

    state, output = run_dag_test(config, "relay_stop", {"timeout_seconds": 60})
    assert state == "success", output[-4000:]
    assert master_apps(config, config.pipeline) == []
    assert ledger.instances(config.pipeline, live_only=True) == []


@pytest.mark.slow  # make test-long (make run triggers relay_deploy through REST too)
def test_local_airflow_runs_relay_deploy_triggered_through_rest(stack: RelayConfig) -> None:
    config = _private(stack, "afrest")
    config = config.with_(ports=replace(config.ports, airflow=free_port()))
    airflow = LocalAirflow(config)
    started = airflow.start()
    pids = [c["pid"] for c in started["components"]]
    try:
        assert started["healthy"], started
        with pytest.raises(StackError, match="400"):  # Param validation at trigger time
            trigger_dag_rest(config, "relay_deploy", {"starting": "middle"})
        run = trigger_dag_rest(config, "relay_deploy", {"version": "v1", "wait_seconds": 240})
        done = wait_dag_run(config, "relay_deploy", run["dag_run_id"], timeout=400)
        assert done["state"] == "success", done
        assert len(master_apps(config, config.pipeline)) == 1

        run = trigger_dag_rest(config, "relay_stop", {"timeout_seconds": 60})
        done = wait_dag_run(config, "relay_stop", run["dag_run_id"], timeout=300)
        assert done["state"] == "success", done
        assert master_apps(config, config.pipeline) == []
    finally:
        try:
            if master_apps(config, config.pipeline):
                stop(config, timeout_s=30)
        finally:
            airflow.stop()
    assert all(session_pids(pid) == [] for pid in pids)


@pytest.mark.slow  # make test-long
def test_provider_submit_hook_starts_a_cluster_driver(
    stack: RelayConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alternative launcher path (SparkSubmitHook + PythonRunner + a carrier jar) really runs the job."""
    from relay.launcher import wait_until_active
    from relay.ledger.models import Color
    from relay.operations.deploy import create_instance

    for key, value in airflow_env(stack).items():  # connections, incl. relay_spark_submit
        if key.startswith("AIRFLOW") or key == "PATH":  # PATH: the hook finds spark-submit in the venv
            monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    from relay_airflow.provider_submit import submit_with_provider

    config = _private(stack, "afprov")
    ledger = Ledger(config.ledger_url, create=True)
    inst, _ = create_instance(config, ledger, "v1", Color.BLUE)
    try:
        driver = submit_with_provider(config, ledger, inst)
        assert driver.startswith("driver-")
        assert ledger.instance(inst.id).submission_id == driver
        assert wait_until_active(config, ledger, inst.id, 240).state == "ACTIVE"
    finally:
        stop(config, timeout_s=30)
    assert master_apps(config, config.pipeline) == []
