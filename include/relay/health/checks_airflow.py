"""Airflow itself: the scheduled health check, self-heal and every DAG stop when one of its parts does.

Read from Airflow's own ``/api/v2/monitor/health`` (no credentials needed): the metadata database and
the heartbeats of the scheduler, the triggerer and the DAG processor. A health run inside Airflow
sees the triggerer or the DAG processor gone; ``relay health`` from a shell also sees the scheduler
or the whole API server gone, which no scheduled run can report.
"""

from __future__ import annotations

from typing import Any

from relay.health.report import Check, Level

COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
TIMEOUT_S = 5.0


def airflow_status(url: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the health document, None) or (None, why it could not be read)."""
    import requests

    from relay.polling import get_with_retry

    try:
        response = get_with_retry(None, f"{url}/api/v2/monitor/health", timeout=TIMEOUT_S)
        response.raise_for_status()
        body = response.json()
    except (requests.RequestException, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return (body, None) if isinstance(body, dict) else (None, f"unexpected answer {body!r:.200}")


def check_airflow(url: str, body: dict[str, Any] | None, error: str | None) -> Check:
    """CRITICAL when Airflow does not answer or one of its parts is not healthy, naming which."""
    if body is None:
        return Check(
            "airflow",
            Level.CRITICAL,
            f"Airflow does not answer at {url} ({error}): the scheduled health check, self-heal "
            "and the DAGs do not run",
            {"url": url, "error": error},
            "`relay stack status`, then `relay stack up` (it starts only what is missing)",
        )
    states = {name: (body.get(name) or {}).get("status") for name in COMPONENTS}
    beats = {
        name: (body.get(name) or {}).get(f"latest_{name}_heartbeat")
        for name in COMPONENTS
        if name != "metadatabase"
    }
    data = {"url": url, "components": states, "heartbeats": beats}
    sick = [name for name, status in states.items() if status != "healthy"]
    if sick:
        text = ", ".join(f"{name} {states[name] or 'never seen'}" for name in sick)
        return Check(
            "airflow",
            Level.CRITICAL,
            f"Airflow is not whole: {text}; scheduled checks and DAG runs stall while it lasts",
            data,
            "`relay stack status`, then `relay stack up` (it starts only what is missing)",
        )
    return Check("airflow", Level.OK, "scheduler, triggerer, DAG processor and database healthy", data)
