"""LedgerHook: the ledger database (instances, attempts, leases) on SQLite or PostgreSQL."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from relay.errors import ConfigError, LedgerError
from relay.ledger.store import Ledger
from sqlalchemy.engine import URL


class LedgerHook(BaseHook):
    """Connection ``relay_ledger``: extra ``url``, the SQLAlchemy URL of the ledger.

    Without ``url``, a PostgreSQL URL is built from host/port/schema/login/password, so the
    password can stay in the connection's password field (masked by Airflow).
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "relay_ledger"
    conn_type = "relay_ledger"
    hook_name = "Relay ledger"

    def __init__(self, ledger_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id

    @staticmethod
    def get_ui_field_behaviour() -> dict[str, Any]:
        return {
            "placeholders": {
                "extra": '{"url": "sqlite:////path/to/ledger.db"}',
                "host": "PostgreSQL host (when no extra url)",
            }
        }

    def sqlalchemy_url(self) -> str:
        conn = self.get_connection(self.ledger_conn_id)
        url = conn.extra_dejson.get("url")
        if url:
            return str(url)
        if not conn.host:
            raise ConfigError(f"connection {self.ledger_conn_id!r} has neither extra url nor host")
        # URL.create encodes login and password: '@', '/' or ':' in a password cannot break the URL.
        url = URL.create(
            "postgresql+psycopg2",
            username=conn.login or None,
            password=(conn.password or None) if conn.login else None,
            host=conn.host,
            port=conn.port or 5432,
            database=conn.schema or "relay",
        )
        return url.render_as_string(hide_password=False)

    def _get_client(self) -> Ledger:
        return Ledger(self.sqlalchemy_url())

    def get_conn(self) -> Ledger:
        return self._get_client()

    def test_connection(self) -> tuple[bool, str]:
        ledger = self._get_client()
        try:
            ledger.engine  # connects; refuses a URL with no ledger; migrates an older one  # noqa: B018
        except (LedgerError, ConfigError) as exc:
            return False, str(exc)
        finally:
            ledger.close()
        return True, f"ledger at {ledger.safe_url}"
