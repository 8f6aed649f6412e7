"""The asset events of deploy, upgrade and recovery: "the sink's dataset is now written by version v".

The pipeline a task acts on is known only at run time (its ``pipeline`` param, connections and
``RELAY_*``), so the tasks declare the alias :data:`PIPELINES` as their outlet and attach the event
when they run, to the asset of what the pipeline writes, named by its provider's URI form (AIP-60,
``relay.pipeline.datasets``): ``postgres://host:port/db/schema/table``, ``kafka://host:port/topic``,
``file:///path`` (the counter on a SQLite ledger). A downstream DAG schedules on "the table Relay
writes"::

    from airflow.sdk import Asset
    with DAG("after_users_changes", schedule=[Asset("postgres://db:5432/shop/public/users")]): ...

and reads ``pipeline``, ``version``, ``instance`` and ``operation`` from the triggering event's
``extra``. A ``ForEachBatch`` pipeline writes where its function decides: its event goes to the
pipeline-level asset ``relay://<pipeline>`` instead, the one name Relay can give it.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import Asset, AssetAlias
from relay.config import RelayConfig

from relay_airflow.lineage import OperationLineage, operation_lineage

PIPELINES = AssetAlias("relay-pipelines")
log = logging.getLogger("airflow.task")


def pipeline_asset(pipeline: str) -> Asset:
    """The asset of one pipeline (Airflow normalizes the URI to ``relay://<pipeline>/``)."""
    return Asset(f"relay://{pipeline}")


def operation_asset(record: OperationLineage) -> Asset:
    """The sink's dataset when it has a standard name, else the pipeline's own asset."""
    return Asset(record.sink.uri) if record.sink is not None else pipeline_asset(record.pipeline)


def emit_pipeline_event(
    context: Any, config: RelayConfig, version: str, instance_id: int, operation: str, **extra: Any
) -> dict[str, Any]:
    """Record "``pipeline`` now runs ``version`` as instance ``instance_id``": the task's asset event,
    and on the task the lineage its OpenLineage ``on_complete`` reports (``relay_airflow.lineage``)."""
    try:
        record: OperationLineage | None = operation_lineage(config, version, operation)
    except Exception as exc:  # noqa: BLE001 - naming what it wrote must never fail the operation
        log.warning(
            "lineage of %s %s: %s; the event goes to the pipeline's asset", config.pipeline, version, exc
        )
        record = None
    body = {
        "pipeline": config.pipeline,
        "version": version,
        "instance": instance_id,
        "operation": operation,
        **extra,
    }
    asset = operation_asset(record) if record is not None else pipeline_asset(config.pipeline)
    context["outlet_events"][PIPELINES].add(asset, extra=body)
    task = context.get("task")
    if task is not None:
        task.relay_lineage = record
    return body
