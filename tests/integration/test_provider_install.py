"""Relay installed into a plain Airflow: the provider's wheel in a venv of its own (apache-airflow and
the wheel, nothing of the development install: no relay_dev, no PYTHONPATH to include/ or plugins/),
its own AIRFLOW_HOME, the DAGs folder pointed at the repository's dags/.

As docs/deploy.md ("Install into your Airflow") tells a user: the provider is listed, its connection
types are offered, the connections are created through the CLI with the form's field names, every DAG
parses, and relay_health runs against the embedded stack (its report in the ledger, written by that
Airflow's task): ~45 s beside the session's stack. The slow test (~2 min) has that Airflow's
relay_deploy start a pipeline, which relay_health then finds running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT, RelayConfig
from relay.kafka.producer import produce
from relay.ledger.engine import create_ledger
from relay.ledger.store import Ledger
from relay.operations.stop import stop

from tests.integration.conftest import private_data_dir

# make test-long (50 s: a plain Airflow in a venv of its own); make test runs the repository's DAGs and plugin
pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Python's own and the system's folders only: no development venv on PATH, no PYTHONPATH.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class PlainAirflow:
    """A venv with apache-airflow and the provider's wheel, and the environment of its processes."""

    venv: Path
    env: dict[str, str]
    ledger_url: str  # the ledger its connection relay_ledger names

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``airflow <args>`` of this venv; fails the test with its output when it exits non-zero."""
        done = subprocess.run(
            [str(self.venv / "bin" / "airflow"), *args],
            env=self.env,
            cwd=self.env["AIRFLOW_HOME"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"airflow {' '.join(args)}: exit {done.returncode}\n{_tail(done)}"
        return done

    def json(self, *args: str) -> list[dict]:
        """``airflow <args> -o json``, parsed (the CLI may log before the JSON: the last line is it)."""
        out = self.run(*args, "-o", "json").stdout.strip().splitlines()
        return json.loads(out[-1]) if out else []


def _tail(done: subprocess.CompletedProcess[str], chars: int = 6000) -> str:
    return (done.stdout + done.stderr)[-chars:]


@pytest.fixture(scope="module")
def plain_root() -> Iterator[Path]:
    root = private_data_dir("plain-airflow-")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def plain_venv(plain_root: Path) -> Path:
    """The wheel (scripts/build_provider.sh) and apache-airflow, the lock as constraints (offline from
    uv's cache when it holds the locked versions)."""
    wheel = subprocess.run(
        ["bash", str(PROJECT_ROOT / "scripts" / "build_provider.sh"), str(plain_root / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.strip()
    venv = plain_root / "venv"
    uv_env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    for cmd in (
        ["uv", "venv", "-q", "--python", "3.11", str(venv)],
        [
            "uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
            "-c", str(PROJECT_ROOT / "requirements.txt"), "apache-airflow==3.3.2", wheel,
        ],
    ):  # fmt: skip
        subprocess.run(cmd, env=uv_env, capture_output=True, text=True, timeout=900, check=True)
    return venv


def _plain_env(root: Path, cfg: RelayConfig) -> dict[str, str]:
    """What a deployment sets: Airflow's home and DAGs folder, the checkout (RELAY_PROJECT_ROOT), the
    data dir and the workers' Python. Every address comes from the connections."""
    home = root / "airflow-home"
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        "PATH": SYSTEM_PATH,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": str(home / "tmp"),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "RELAY_PROJECT_ROOT": str(PROJECT_ROOT),
        "RELAY_DATA_DIR": str(cfg.data_dir),
        # the workers' Python (pyspark installed), here the embedded stack's: not this Airflow's
        "RELAY_SPARK_PYTHON": sys.executable,
    }


def _add_connections(airflow: PlainAirflow, cfg: RelayConfig) -> None:
    """The three connections, with the extra keys the connection form's fields store."""
    ui = cfg.spark_master_ui_url.split("://", 1)[1]
    host, port = ui.rsplit(":", 1)
    spark = {
        "rest_url": cfg.spark_rest_url,
        "master_url": cfg.spark_master_url,
        "rest_secret_file": str(cfg.spark_rest_secret_path),
    }
    for conn_id, args in (
        ("relay_spark", ["--conn-host", host, "--conn-port", port, "--conn-extra", json.dumps(spark)]),
        ("relay_kafka", ["--conn-extra", json.dumps({"bootstrap_servers": cfg.kafka_bootstrap})]),
        ("relay_ledger", ["--conn-extra", json.dumps({"url": cfg.ledger_url})]),
    ):
        airflow.run("connections", "add", conn_id, "--conn-type", conn_id, *args)


@pytest.fixture(scope="module")
def plain_airflow(stack: RelayConfig, plain_root: Path, plain_venv: Path) -> PlainAirflow:
    """The installed Airflow, its metadata DB migrated and Relay's connections created, on a ledger of
    its own on the embedded stack."""
    ledger_url = f"sqlite:///{plain_root / 'ledger.db'}"
    create_ledger(ledger_url)
    cfg = stack.with_(ledger_url=ledger_url)
    airflow = PlainAirflow(plain_venv, _plain_env(plain_root, cfg), ledger_url)
    airflow.run("db", "migrate")
    _add_connections(airflow, cfg)
    return airflow


def _pipeline(stack: RelayConfig, airflow: PlainAirflow, records: int) -> tuple[RelayConfig, PlainAirflow]:
    """A pipeline of its own (its topic holding ``records``) and the installed Airflow set to it."""
    name = f"p{uuid.uuid4().hex[:8]}"
    cfg = stack.with_(pipeline=name, topic=name, ledger_url=airflow.ledger_url)
    produce(cfg.kafka_bootstrap, cfg.topic, records, None, partitions=cfg.partitions)
    env = {
        **airflow.env,
        "RELAY_PIPELINE": name,
        "RELAY_TOPIC": name,
        "RELAY_PARTITIONS": str(cfg.partitions),
    }
    return cfg, PlainAirflow(airflow.venv, env, airflow.ledger_url)


def _run_state(airflow: PlainAirflow, dag_id: str) -> str:
    runs = airflow.json("dags", "list-runs", dag_id)
    assert runs, f"no run of {dag_id}"
    return str(runs[0]["state"])


def test_the_provider_registers_in_a_plain_airflow_whose_dags_parse_and_check_health(
    stack: RelayConfig, plain_airflow: PlainAirflow
) -> None:
    """The acceptance of the install (docs/deploy.md): listed, its types offered, DAGs parsed, and
    relay_health of a pipeline waiting for its first deploy reads Kafka, Spark and the ledger."""
    site = next((plain_airflow.venv / "lib").glob("python3*/site-packages"))
    assert (site / "relay_airflow" / "plugin.py").is_file() and not (site / "relay_dev").exists()

    providers = {p["package_name"]: p for p in plain_airflow.json("providers", "list")}
    assert "relay-airflow-provider" in providers, sorted(providers)
    hooks = {h["connection_type"]: h for h in plain_airflow.json("providers", "hooks")}
    for conn_type in ("relay_spark", "relay_kafka", "relay_ledger"):
        assert hooks[conn_type]["package_name"] == "relay-airflow-provider", hooks.get(conn_type)
    plugins = {p["name"]: p for p in plain_airflow.json("plugins")}
    assert "relay-airflow-provider" in str(plugins["relay"]["source"]), plugins.get("relay")

    cfg, airflow = _pipeline(stack, plain_airflow, 120)
    airflow.run("dags", "reserialize")  # parses the DAGs folder into the metadata DB, as a dag-processor
    assert airflow.json("dags", "list-import-errors") == []
    dags = {d["dag_id"] for d in airflow.json("dags", "list")}
    assert dags == {"relay_deploy", "relay_health", "relay_recover", "relay_stop", "relay_upgrade"}

    checked = airflow.run("dags", "test", "relay_health", timeout=600)
    assert _run_state(airflow, "relay_health") == "success", _tail(checked)
    report = Ledger(cfg.ledger_url).reports(cfg.pipeline, "health", 1)[0]
    assert report["status"] in ("OK", "WARN"), report  # DOWN: nothing deployed yet, nothing to page
    data, checks = report["body"]["data"], {c["name"]: c for c in report["body"]["checks"]}
    assert sum(o["latest"] for o in data["offsets"]) == 120, data  # Kafka, through relay_kafka
    assert checks["single_instance"]["data"]["master_error"] is None, checks["single_instance"]  # Spark


@pytest.mark.slow
def test_relay_deploy_of_the_installed_airflow_starts_a_pipeline_that_relay_health_finds_running(
    stack: RelayConfig, plain_airflow: PlainAirflow
) -> None:
    """Submissions from the installed package: the drivers come from RELAY_PROJECT_ROOT's spark_jobs/
    and run on RELAY_SPARK_PYTHON (this Airflow's venv has no pyspark)."""
    cfg, airflow = _pipeline(stack, plain_airflow, 200)
    try:
        conf = json.dumps({"pipeline": cfg.pipeline, "version": "v1", "wait_seconds": 240})
        deployed = airflow.run("dags", "test", "relay_deploy", "--conf", conf, timeout=900)
        assert _run_state(airflow, "relay_deploy") == "success", _tail(deployed)
        ledger = Ledger(cfg.ledger_url)
        assert [i.version for i in ledger.instances(cfg.pipeline)] == ["v1"]

        checked = airflow.run("dags", "test", "relay_health", timeout=600)
        assert _run_state(airflow, "relay_health") == "success", _tail(checked)
        report = ledger.reports(cfg.pipeline, "health", 1)[0]
        assert report["status"] in ("OK", "WARN"), report
        assert report["body"]["data"]["run_state"] == "RUNNING", report["body"]["data"]
    finally:
        stop(cfg)
