"""A configuration as the ``RELAY_*`` variables that rebuild it in another process.

Why: a Relay command on another host (the namespace cluster's client), an Airflow task or a test's
subprocess must act on exactly the settings of the process that started it, and the environment is
the one channel ``load_config`` reads. ``load_config(config_env(cfg)) == cfg`` (the REST key file
named explicitly), tested in tests/unit/test_config_env.py.
"""

from __future__ import annotations

from relay.config import OPERATOR_LIMITS_ENV, RelayConfig


def config_env(config: RelayConfig) -> dict[str, str]:
    """The ``RELAY_*`` variables that make ``load_config()`` elsewhere rebuild exactly ``config``."""
    p = config.ports
    env = {
        "RELAY_DATA_DIR": str(config.data_dir),
        "RELAY_PIPELINE": config.pipeline,
        "RELAY_TOPIC": config.topic,
        "RELAY_PARTITIONS": str(config.partitions),
        "RELAY_KAFKA_BOOTSTRAP": config.kafka_bootstrap,
        "RELAY_SPARK_MASTER_URL": config.spark_master_url,
        "RELAY_SPARK_MASTER_UI_URL": config.spark_master_ui_url,
        "RELAY_SPARK_REST_URL": config.spark_rest_url,
        "RELAY_LEDGER_URL": config.ledger_url,
        "RELAY_KAFKA_PORT": str(p.kafka),
        "RELAY_SPARK_MASTER_PORT": str(p.spark_master),
        "RELAY_SPARK_MASTER_UI_PORT": str(p.spark_master_ui),
        "RELAY_SPARK_REST_PORT": str(p.spark_rest),
        "RELAY_SPARK_WORKER_UI_PORT": str(p.spark_worker_ui),
        "RELAY_SPARK_WORKER2_UI_PORT": str(p.spark_worker2_ui),
        "RELAY_POSTGRES_PORT": str(p.postgres),
        "RELAY_AIRFLOW_PORT": str(p.airflow),
        "RELAY_WORKER_CORES": str(config.worker_cores),
        "RELAY_SPARK_WORKERS": str(config.spark_workers),
        "RELAY_WORKER_MEMORY": config.worker_memory,
        "RELAY_TRIGGER_SECONDS": str(config.trigger_seconds),
        "RELAY_MAX_OFFSETS_PER_TRIGGER": str(config.max_offsets_per_trigger or "auto"),
        # which of the two the operator set (they beat a pipeline package's values; the others are
        # Relay's): without it, load_config would take both for the operator's
        OPERATOR_LIMITS_ENV: ",".join(config.limits_from_env),
        "RELAY_HOST": config.host,
        "RELAY_SPARK_REST_SECRET_FILE": str(config.spark_rest_secret_path),  # a path, never the key
        "RELAY_KEEP_VERSIONS": str(config.keep_versions),
        "RELAY_STANDBY_NICE": str(config.standby_nice),
        "RELAY_HEAL": "true" if config.heal else "false",
        "RELAY_STANDBY": config.standby,
        "RELAY_ARTIFACT_STORE": config.artifact_store,
    }
    if config.checkpoint_root is not None:
        env["RELAY_CHECKPOINT_ROOT"] = config.checkpoint_root.as_uri()
    if config.worker_spark_dir is not None:
        env["RELAY_WORKER_SPARK_DIR"] = str(config.worker_spark_dir)
    if config.spark_python is not None:
        env["RELAY_SPARK_PYTHON"] = config.spark_python
    if config.pipelines_file is not None:
        # The DAGs' pipeline choices and each task's pipeline come from the same file, which also
        # names each pipeline's code: a RELAY_PIPELINE_CODE here would be one pipeline's, stale for
        # the others (the file wins anyway).
        env["RELAY_PIPELINES_FILE"] = str(config.pipelines_file)
    elif config.pipeline_code is not None:
        env["RELAY_PIPELINE_CODE"] = str(config.pipeline_code)
    return env


__all__ = ["config_env"]
