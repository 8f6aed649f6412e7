"""The callables of the operation DAGs' tasks: each runs one persisted step of the library.

Why here and not in ``dags/``: the DAG files stay thin (structure, params, docs); these functions
read the run's params and upstream XComs, call the step, and turn a failed operation into a failed
task. Every one can be rerun (cleared) safely: the step it calls finds its work done and moves on.
"""

from __future__ import annotations

import logging
from typing import Any

from relay.config import RelayConfig
from relay.ledger.store import Ledger

log = logging.getLogger("airflow.task")


def relay_config(context: Any) -> RelayConfig:
    """The configuration of the pipeline this run acts on: its ``pipeline`` param (the environment's
    pipeline when the DAG has none), addresses from the connections, its sink's secrets from
    Airflow Variables when the environment lacks them."""
    from relay_airflow.config import relay_config_from_connections, secrets_from_variables, selected_pipeline

    config = relay_config_from_connections(pipeline=selected_pipeline(context))
    log.info("pipeline %s (topic %s)", config.pipeline, config.topic)
    secrets_from_variables(config)
    return config


def run_key(context: Any) -> str:
    """Names this DAG run in the ledger, so a cleared task finds what its first try did."""
    return f"airflow:{context['dag'].dag_id}/{context['run_id']}"


def upstream(context: Any, task_id: str) -> Any:
    return context["ti"].xcom_pull(task_ids=task_id)


def ledger_of(config: RelayConfig) -> Ledger:
    return Ledger(config.ledger_url)
