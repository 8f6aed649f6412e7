"""The asset "pipeline X now runs version v": one event per deploy, upgrade and recovery.

The pipeline a task acts on is known only at run time (connections and ``RELAY_*``), so the tasks
declare the alias :data:`PIPELINES` as their outlet and attach the event to ``relay://<pipeline>``
when they run. A downstream DAG schedules on the concrete asset::

    from airflow.sdk import Asset
    with DAG("after_orders_upgrade", schedule=[Asset("relay://orders")]): ...

and reads ``version``, ``instance`` and ``operation`` from the triggering event's ``extra``.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias

PIPELINES = AssetAlias("relay-pipelines")


def pipeline_asset(pipeline: str) -> Asset:
    """The asset of one pipeline (Airflow normalizes the URI to ``relay://<pipeline>/``)."""
    return Asset(f"relay://{pipeline}")


def emit_pipeline_event(
    context: Any, pipeline: str, version: str, instance_id: int, operation: str, **extra: Any
) -> dict[str, Any]:
    """Record "``pipeline`` now runs ``version`` as instance ``instance_id``" (the task's outlet)."""
    body = {"version": version, "instance": instance_id, "operation": operation, **extra}
    context["outlet_events"][PIPELINES].add(pipeline_asset(pipeline), extra=body)
    return body
