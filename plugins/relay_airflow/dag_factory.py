"""What every Relay DAG shares, in one place: live from the first parse, one run at a time, alerts.

``is_paused_upon_creation=False`` holds in any Airflow (not only the embedded one): the scheduled
health check runs and the operation DAGs accept REST triggers without a manual unpause. A failed
task reaches the user through ``RelayAlertNotifier`` (connection ``relay_alerts``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param
from relay.config import pipeline_names

from relay_airflow.notifiers import RelayAlertNotifier


def relay_dag(
    dag_id: str,
    doc_md: str | None,
    *,
    params: dict[str, Any] | None = None,
    retries: int = 0,
    retry_delay: timedelta = timedelta(seconds=30),
    **dag_kwargs: Any,
) -> DAG:
    """A DAG with Relay's defaults; ``dag_kwargs`` adds or overrides (schedule, start_date, ...)."""
    default_args: dict[str, Any] = {"retries": retries, "on_failure_callback": [RelayAlertNotifier()]}
    if retries:
        default_args["retry_delay"] = retry_delay
    settings: dict[str, Any] = {
        "schedule": None,
        "is_paused_upon_creation": False,
        "catchup": False,
        "max_active_runs": 1,
        "tags": ["relay"],
        **dag_kwargs,
    }
    return DAG(dag_id=dag_id, doc_md=doc_md, default_args=default_args, params=params or {}, **settings)


def pipeline_param() -> Param:
    """The ``pipeline`` param of an operation DAG: one of the declared pipelines (read when the DAG
    file is parsed), the environment's (``RELAY_PIPELINE`` or the file's default) preselected.

    Why a param with an enum: the trigger form shows a drop-down of the declared names and a REST
    trigger naming an unknown pipeline is refused (HTTP 400) before anything runs; the run's conf
    (run details) shows which pipeline it acted on, and every task logs it first.
    """
    names, default = pipeline_names()
    return Param(
        default,
        type="string",
        enum=names,
        title="Pipeline",
        description="the pipeline this run acts on (`relay pipelines` lists them)",
    )
