"""SparkStandaloneHook: the Spark standalone master (``/json/``) and its REST submission server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook
from relay.errors import SparkError
from relay.spark.auth import RestSigner, read_secret_file
from relay.spark.rest import SparkStandaloneClient


class SparkStandaloneHook(BaseHook):
    """Connection ``relay_spark``: host/port of the master's web UI; extras ``rest_url``, ``master_url``.

    Without ``rest_url`` the REST server is assumed on the same host at port 6066 (Spark's default).
    The REST server's signing key (its JWS filter answers 403 to unsigned requests) is the
    connection's password (masked by Airflow) or the file named by extra ``rest_secret_file``.
    """

    conn_name_attr = "spark_conn_id"
    default_conn_name = "relay_spark"
    conn_type = "relay_spark"
    hook_name = "Relay Spark standalone"

    def __init__(self, spark_conn_id: str = default_conn_name, timeout_s: float = 10) -> None:
        super().__init__()
        self.spark_conn_id = spark_conn_id
        self.timeout_s = timeout_s
        self._client: SparkStandaloneClient | None = None

    @staticmethod
    def get_ui_field_behaviour() -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "login"],
            "relabeling": {"password": "REST signing key (base64url)"},
            "placeholders": {
                "host": "127.0.0.1 (master web UI)",
                "port": "8080",
                "extra": '{"rest_url": "http://127.0.0.1:6066", "master_url": "spark://127.0.0.1:7077", '
                '"rest_secret_file": "/path/to/spark-rest.key"}',
            },
        }

    def urls(self) -> dict[str, str]:
        """``master_ui_url``, ``rest_url`` and ``master_url`` of the connection."""
        conn = self.get_connection(self.spark_conn_id)
        host = conn.host or "127.0.0.1"
        extra = conn.extra_dejson
        ui = host if "://" in host else f"http://{host}:{conn.port or 8080}"
        bare = ui.split("://", 1)[1].rsplit(":", 1)[0]
        return {
            "master_ui_url": ui,
            "rest_url": str(extra.get("rest_url") or f"http://{bare}:6066"),
            "master_url": str(extra.get("master_url") or f"spark://{bare}:7077"),
        }

    def rest_secret(self) -> tuple[str, Path | None]:
        """(key text, key file): the password wins over the file; "" when there is no key (yet).

        A named file that does not exist yet (the stack generates it at its first ``up``) gives no
        key: requests go unsigned and a protected REST server answers 403, saying what to set.
        """
        conn = self.get_connection(self.spark_conn_id)
        if conn.password:
            return conn.password, None
        raw = conn.extra_dejson.get("rest_secret_file")
        if not raw:
            return "", None
        path = Path(raw)
        return (read_secret_file(path) if path.exists() else ""), path

    def _get_client(self) -> SparkStandaloneClient:
        urls = self.urls()
        key, where = self.rest_secret()
        signer = (
            RestSigner.from_text(key, str(where or f"the password of {self.spark_conn_id}")) if key else None
        )
        return SparkStandaloneClient(urls["master_ui_url"], urls["rest_url"], self.timeout_s, signer)

    def get_conn(self) -> SparkStandaloneClient:
        """The client, built once per hook (lazily: no network call before first use)."""
        if self._client is None:
            self._client = self._get_client()
        return self._client

    def test_connection(self) -> tuple[bool, str]:
        try:
            client = self.get_conn()
            state = client.master_state()
            rest = client.ready()
        except SparkError as exc:
            return False, str(exc)
        if not state.alive:
            return False, f"master status is {state.status!r}"
        return rest, (
            f"master ALIVE, {state.workers_alive} worker(s), REST "
            f"{'ready' if rest else 'not ready at ' + client.rest_url}"
        )
