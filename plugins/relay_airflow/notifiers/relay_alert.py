"""RelayAlertNotifier: a failed Relay task (a CRITICAL health report above all) reaches a person.

Failing the task is what makes Airflow's alerting fire, but Airflow delivers nothing by itself: a
notifier set as ``on_failure_callback`` does. This one POSTs a JSON alert to the HTTP endpoint of the
connection ``relay_alerts`` (see :class:`RelayAlertsHook`). When that connection does not exist or the
endpoint fails, the alert is logged at ERROR in the task's log with its full text, so an operator
reading the log (or a log-based alert) still gets it, and the reason it was not delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk.bases.notifier import BaseNotifier
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException
from relay.errors import ConfigError

from relay_airflow.hooks.alerts import AlertDeliveryError, RelayAlertsHook

# The task log's logger (as the DAGs use): the alert's text lands in the failed task's own log.
log = logging.getLogger("airflow.task")


class HealthCriticalError(AirflowFailException):
    """The health report is CRITICAL: fail the task without retry and hand the report to the notifier.

    An ``AirflowFailException`` because the state will not change in the seconds a retry waits; the
    report rides on the exception because the task runner passes it to ``on_failure_callback`` as
    ``context["exception"]`` (a failed task pushes no return value).
    """

    def __init__(self, report: Mapping[str, Any]) -> None:
        super().__init__(str(report.get("summary") or "health report CRITICAL"))
        self.report = dict(report)


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else (None if value is None else str(value))


def alert_payload(context: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON an alert carries, from a task (or DAG) failure context.

    With a health report (``HealthCriticalError``): the pipeline, its status, the summary (one line per
    problem with the next step to run) and the non-OK checks. Otherwise the failed task and its error.
    """
    ti = context.get("ti") or context.get("task_instance")
    dag = context.get("dag")
    exc = context.get("exception")
    dag_id = getattr(dag, "dag_id", None) or getattr(ti, "dag_id", None)
    task_id = getattr(ti, "task_id", None)
    payload: dict[str, Any] = {
        "source": "relay",
        "dag_id": dag_id,
        "task_id": task_id,
        "run_id": context.get("run_id") or getattr(ti, "run_id", None),
        "try_number": getattr(ti, "try_number", None),
        "logical_date": _iso(context.get("logical_date")),
        "log_url": getattr(ti, "log_url", None),
        "error": None if exc is None else f"{type(exc).__name__}: {exc}"[:4000],
    }
    report = getattr(exc, "report", None)
    if isinstance(report, Mapping):
        payload.update(
            kind="health",
            pipeline=report.get("pipeline"),
            status=report.get("status"),
            report_id=report.get("report_id"),
            summary=report.get("summary"),
            checks=[
                {k: c.get(k) for k in ("name", "level", "message", "action")}
                for c in report.get("checks") or []
                if c.get("level") != "OK"
            ],
        )
    else:
        reason = context.get("reason") or payload["error"] or "no error recorded"
        where = f"{dag_id}.{task_id}" if task_id else str(dag_id)
        payload.update(kind="task_failure", status="FAILED", summary=f"{where} failed: {reason}")
    return payload


class RelayAlertNotifier(BaseNotifier):
    """POST the alert to the ``relay_alerts`` connection; log it at ERROR when it cannot be delivered.

    Use as ``on_failure_callback=RelayAlertNotifier()`` (in ``default_args`` to cover every task).
    Delivery problems never raise: the task has already failed and the alert's text is in the log.
    """

    template_fields = ("conn_id",)

    def __init__(self, conn_id: str = RelayAlertsHook.default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id

    def notify(self, context: Any) -> None:
        payload = alert_payload(context)
        text = f"RELAY ALERT [{payload['status']}] {payload['summary']}"
        hook = RelayAlertsHook(self.conn_id)
        try:
            status = hook.post(payload)
        except AirflowNotFoundException:
            log.error(
                "%s\n(no connection %r: the alert was only logged; create an http connection %r to "
                "have it POSTed)",
                text,
                self.conn_id,
                self.conn_id,
            )
            return
        except (AlertDeliveryError, ConfigError) as exc:
            log.error("%s\n(alert NOT delivered through connection %r: %s)", text, self.conn_id, exc)
            return
        log.info("alert sent through connection %r (HTTP %s): %s", self.conn_id, status, text)
