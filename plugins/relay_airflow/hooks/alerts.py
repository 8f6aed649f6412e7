"""RelayAlertsHook: where Relay's alerts go, an HTTP endpoint named by an Airflow connection."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from relay.errors import ConfigError


class AlertDeliveryError(Exception):
    """The endpoint could not be reached or refused the alert (message says which, and the status)."""


class RelayAlertsHook(BaseHook):
    """Connection ``relay_alerts`` (type http): the alert is POSTed as JSON to its URL.

    The URL is ``host`` when it is a full URL, else ``<scheme>://host[:port]`` (scheme from the
    connection's ``schema`` when it is http/https, else from the type: ``https`` for an https
    connection, ``http`` otherwise), followed by the extra ``endpoint`` or, for a connection given as
    a URI (``http://127.0.0.1:9000/alerts``), the path Airflow stores in ``schema``. Extras:
    ``headers`` (a JSON object), ``timeout`` (seconds, default 10). ``login`` + ``password`` send basic
    auth; a ``password`` alone is sent as a bearer token (the usual webhook secret), masked by Airflow.
    """

    conn_name_attr = "alerts_conn_id"
    default_conn_name = "relay_alerts"
    conn_type = "http"
    hook_name = "Relay alerts (HTTP)"

    def __init__(self, alerts_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.alerts_conn_id = alerts_conn_id

    @staticmethod
    def get_ui_field_behaviour() -> dict[str, Any]:
        return {
            "placeholders": {
                "host": "alerts.example.com (or a full URL)",
                "extra": '{"endpoint": "/hooks/relay", "headers": {"X-Team": "data"}, "timeout": 10}',
                "password": "bearer token (optional)",
            }
        }

    def _settings(self) -> tuple[str, dict[str, str], Any, float]:
        """URL, headers, auth and timeout of the connection (AirflowNotFoundException if it is absent)."""
        conn = self.get_connection(self.alerts_conn_id)
        extra = conn.extra_dejson
        host = (conn.host or "").strip()
        if not host:
            raise ConfigError(f"connection {self.alerts_conn_id!r} has no host")
        schema = (conn.schema or "").strip()
        if "://" in host:
            base = host.rstrip("/")
        else:
            scheme = (
                schema if schema in ("http", "https") else ("https" if conn.conn_type == "https" else "http")
            )
            base = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
        path = str(extra.get("endpoint") or (schema if schema not in ("http", "https") else ""))
        url = base + ("/" + path.lstrip("/") if path else "")
        headers = {str(k): str(v) for k, v in (extra.get("headers") or {}).items()}
        auth: Any = None
        if conn.login:
            auth = (conn.login, conn.password or "")
        elif conn.password:
            headers.setdefault("Authorization", f"Bearer {conn.password}")
        return url, headers, auth, float(extra.get("timeout", 10))

    def url(self) -> str:
        """The endpoint's URL (never holds credentials: they travel in headers)."""
        return self._settings()[0]

    def post(self, payload: dict[str, Any]) -> int:
        """POST ``payload`` as JSON; the HTTP status, or AlertDeliveryError when it is not 2xx."""
        import requests

        url, headers, auth, timeout = self._settings()
        try:
            response = requests.post(url, json=payload, headers=headers, auth=auth, timeout=timeout)
        except requests.RequestException as exc:
            raise AlertDeliveryError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status_code < 300:
            raise AlertDeliveryError(f"POST {url} answered {response.status_code}: {response.text[:300]}")
        return response.status_code

    def test_connection(self) -> tuple[bool, str]:
        try:
            status = self.post({"source": "relay", "test": True, "summary": "Relay alerts: test message"})
        except (AlertDeliveryError, ConfigError) as exc:
            return False, str(exc)
        return True, f"{self.url()} answered {status}"
