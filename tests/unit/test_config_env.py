"""A configuration handed to another process through RELAY_* variables comes back identical."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.config import Ports, RelayConfig, load_config
from relay.config.env import config_env
from relay.errors import ConfigError


def rebuilt(config: RelayConfig) -> RelayConfig:
    return load_config(config_env(config))


def test_every_setting_of_a_cluster_client_survives_the_trip(tmp_path: Path) -> None:
    config = RelayConfig(
        data_dir=tmp_path / "client data",
        pipeline="orders",
        topic="orders.v1",
        partitions=7,
        kafka_bootstrap="10.0.0.20:9092",
        spark_master_url="spark://10.0.0.10:7077",
        spark_master_ui_url="http://10.0.0.10:8080",
        spark_rest_url="http://10.0.0.10:6066",
        ledger_url="postgresql+psycopg2://relay:s3cret@10.0.0.30:5432/relay",
        ports=Ports(
            kafka=1,
            spark_master=2,
            spark_master_ui=3,
            spark_rest=4,
            spark_worker_ui=5,
            spark_worker2_ui=8,
            postgres=6,
            airflow=7,
        ),
        worker_cores=3,
        worker_memory="2g",
        spark_workers=2,
        trigger_seconds=2.5,
        max_offsets_per_trigger=1234,
        host="10.0.0.40",
        spark_rest_secret_file=tmp_path / "key",
        pipeline_code=tmp_path / "my pipeline",
        keep_versions=9,
        artifact_store="ledger",
        checkpoint_root=tmp_path / "shared store" / "checkpoints%20",
        worker_spark_dir=tmp_path / "local" / "spark",
        spark_python="/opt/relay-venv/bin/python",  # a venv's link: kept as written, never resolved
    )
    assert rebuilt(config) == config
    env = config_env(config)
    assert env["RELAY_CHECKPOINT_ROOT"].startswith("file:///"), "the documented URI form"
    assert "s3cret" not in env["RELAY_SPARK_REST_SECRET_FILE"]


def test_defaults_survive_and_optional_settings_stay_unset(tmp_path: Path) -> None:
    config = RelayConfig(data_dir=tmp_path).with_(spark_rest_secret_file=tmp_path / "secrets" / "k")
    env = config_env(config)
    assert rebuilt(config) == config
    for name in (
        "RELAY_CHECKPOINT_ROOT",
        "RELAY_WORKER_SPARK_DIR",
        "RELAY_PIPELINE_CODE",
        "RELAY_PIPELINES_FILE",
        "RELAY_SPARK_PYTHON",
    ):
        assert name not in env
    assert env["RELAY_ARTIFACT_STORE"] == "local"


def test_a_pipelines_file_names_the_code_not_the_environment(tmp_path: Path) -> None:
    """With a file, one pipeline's RELAY_PIPELINE_CODE would be stale for the others: never passed."""
    (tmp_path / "orders").mkdir()
    (tmp_path / "pipelines.toml").write_text(
        '[pipelines.orders]\ntopic = "orders"\npipeline_code = "orders"\n'
        '[pipelines.experience]\ntopic = "experience"\n'
    )
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)}, pipeline="orders")
    env = config_env(config)
    assert "RELAY_PIPELINE_CODE" not in env and env["RELAY_PIPELINES_FILE"] == str(
        tmp_path / "pipelines.toml"
    )
    assert load_config(env, pipeline="experience").pipeline_code is None
    assert load_config(env, pipeline="orders").pipeline_code == tmp_path / "orders"


def test_a_bad_value_in_the_environment_is_refused_by_name(tmp_path: Path) -> None:
    env = config_env(RelayConfig(data_dir=tmp_path))
    with pytest.raises(ConfigError, match="RELAY_ARTIFACT_STORE"):
        load_config({**env, "RELAY_ARTIFACT_STORE": "s3"})
    with pytest.raises(ConfigError, match="RELAY_CHECKPOINT_ROOT"):
        load_config({**env, "RELAY_CHECKPOINT_ROOT": "hdfs://nn/checkpoints"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RELAY_TRIGGER_SECONDS", "1e309"),
        ("RELAY_TRIGGER_SECONDS", "nan"),
        ("RELAY_TRIGGER_SECONDS", "inf"),
        ("RELAY_TRIGGER_SECONDS", "-1"),
        ("RELAY_TRIGGER_SECONDS", "86400"),
        ("RELAY_MAX_OFFSETS_PER_TRIGGER", "99999999999999999999999"),
        ("RELAY_KAFKA_PORT", "70000"),
        ("RELAY_PARTITIONS", "0"),
        ("RELAY_STANDBY_NICE", "40"),
    ],
)
def test_every_number_is_finite_and_bounded(tmp_path: Path, name: str, value: str) -> None:
    """Issue #34: RELAY_TRIGGER_SECONDS=1e309 passed the check and reached PostgreSQL's JSON as Infinity."""
    with pytest.raises(ConfigError, match=name):
        load_config({"RELAY_DATA_DIR": str(tmp_path), name: value})


def test_the_checkout_is_this_one_unless_the_deployment_names_another(tmp_path: Path) -> None:
    """Installed from the provider's wheel, ``relay`` lives in site-packages: RELAY_PROJECT_ROOT
    names the checkout whose spark_jobs/ and examples/ submissions use."""
    from relay.config import PROJECT_ROOT, project_root

    assert (PROJECT_ROOT / "spark_jobs").is_dir() and project_root({}) == PROJECT_ROOT
    assert project_root({"RELAY_PROJECT_ROOT": str(tmp_path)}) == tmp_path.resolve()
