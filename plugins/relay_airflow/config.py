"""The bridge from Airflow connections to Relay's configuration, read once at the task edge."""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow.sdk.exceptions import AirflowNotFoundException
from relay.config import RelayConfig, load_config

from relay_airflow.hooks.kafka_offsets import KafkaOffsetsHook
from relay_airflow.hooks.ledger import LedgerHook
from relay_airflow.hooks.spark_standalone import SparkStandaloneHook

log = logging.getLogger("airflow.task")


def selected_pipeline(context: Any) -> str | None:
    """The ``pipeline`` param of the run (None: the DAG has none, the environment's pipeline)."""
    return (context.get("params") or {}).get("pipeline") or None


def relay_config_from_connections(
    base: RelayConfig | None = None, pipeline: str | None = None
) -> RelayConfig:
    """``load_config(pipeline=...)`` (RELAY_* variables and the pipelines file) overridden by the
    ``relay_*`` connections that exist.

    Why: in a real deployment the addresses of Spark, Kafka and the ledger are Airflow connections
    (managed, secrets masked); the embedded stack defines them as AIRFLOW_CONN_* variables. A missing
    connection keeps the value of the configuration.
    """
    config = base or load_config(pipeline=pipeline)
    changes: dict[str, object] = {}
    try:
        spark = SparkStandaloneHook()
        urls = spark.urls()
        changes.update(
            spark_master_ui_url=urls["master_ui_url"],
            spark_rest_url=urls["rest_url"],
            spark_master_url=urls["master_url"],
        )
        key, key_file = spark.rest_secret()
        if key_file is not None:
            changes["spark_rest_secret_file"] = key_file
        elif key:
            changes["spark_rest_secret"] = key  # from the connection's password (repr hides it)
    except AirflowNotFoundException:
        pass
    try:
        changes["kafka_bootstrap"] = KafkaOffsetsHook().bootstrap_servers()
    except AirflowNotFoundException:
        pass
    try:
        changes["ledger_url"] = LedgerHook().sqlalchemy_url()
    except AirflowNotFoundException:
        pass
    return config.with_(**changes) if changes else config


def secrets_from_variables(config: RelayConfig) -> list[str]:
    """Fill each variable the pipeline's sink needs (``secret_env`` of the pipelines file) that this
    task's environment lacks from the Airflow Variable of the same name; returns the names filled.

    Why: in a real deployment a secret lives in Airflow (its metastore, encrypted, or a secrets
    backend), not in the environment every Airflow process was started with. The value is masked
    in the task's logs and set in this task process only, from where a submission copies it to the
    driver's environment like any other (never argv, a Spark option or a log).
    """
    from airflow.sdk import Variable
    from airflow.sdk.log import mask_secret

    filled: list[str] = []
    for name in config.secret_env:
        if os.environ.get(name):
            continue
        value = Variable.get(name, default=None)
        if value:
            mask_secret(value, name=name)
            os.environ[name] = str(value)
            filled.append(name)
    if filled:
        log.info("%s from Airflow Variables (masked)", ", ".join(filled))
    return filled
