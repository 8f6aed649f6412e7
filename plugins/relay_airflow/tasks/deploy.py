"""relay_deploy's tasks: submit (preflight + instance + driver), wait (FirstCommitSensor), verify."""

from __future__ import annotations

from typing import Any

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException
from relay.operations.upgrade_steps import VERIFY_TIMEOUT_S
from relay.operations.waits import ONLY_APPS, OnlyAppsWait
from relay.spark.launcher import app_name

from relay_airflow.assets import emit_pipeline_event
from relay_airflow.operators.ledger_wait import WaitFor
from relay_airflow.tasks import log, relay_config, run_key, upstream
from relay_airflow.triggers.ledger_wait import DONE


def submit() -> dict[str, Any]:
    """Preflight and submit; a rerun of this run's task finds the instance it created."""
    from relay.operations.deploy import submit as submit_step

    context = get_current_context()
    params = context["params"]
    return submit_step(
        relay_config(context),
        version=params["version"] or None,
        starting=params["starting"],
        progress=log.info,
        key=run_key(context),
    )


def verify_prepare(context: Any) -> WaitFor:
    config = relay_config(context)
    name = app_name(config.pipeline, upstream(context, "submit")["instance_id"])
    return WaitFor(ONLY_APPS, {"names": [name]}, VERIFY_TIMEOUT_S, config.pipeline, note=f"only {name}")


def verify_complete(context: Any, event: dict[str, Any]) -> dict[str, Any]:
    """The master lists only the new instance's application: the deploy is done; emit the asset event."""
    config = relay_config(context)
    if event["status"] != DONE:
        raise AirflowFailException(
            f"{OnlyAppsWait(config, event['args']['names']).mismatch()}: {event['error']}"
        )
    submitted = upstream(context, "submit")
    first = upstream(context, "wait_first_commit") or {}
    emit_pipeline_event(context, config, submitted["version"], submitted["instance_id"], "deploy")
    return {**submitted, "first_commit_s": first.get("first_commit_s"), "verified": event["result"]}
