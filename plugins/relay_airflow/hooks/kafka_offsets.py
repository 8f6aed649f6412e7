"""KafkaOffsetsHook: earliest/latest offsets and topic settings of the Kafka cluster."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from relay.errors import KafkaError
from relay.kafka.offsets import KafkaOffsets


class KafkaOffsetsHook(BaseHook):
    """Connection ``relay_kafka``: extra ``bootstrap.servers`` (the Kafka provider's key), else host:port."""

    conn_name_attr = "kafka_conn_id"
    default_conn_name = "relay_kafka"
    conn_type = "relay_kafka"
    hook_name = "Relay Kafka offsets"

    def __init__(self, kafka_conn_id: str = default_conn_name, timeout_s: float = 10) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id
        self.timeout_s = timeout_s

    @staticmethod
    def get_ui_field_behaviour() -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "login", "password", "host", "port"],
            "placeholders": {"extra": '{"bootstrap.servers": "127.0.0.1:9092"}'},
        }

    def bootstrap_servers(self) -> str:
        conn = self.get_connection(self.kafka_conn_id)
        servers = conn.extra_dejson.get("bootstrap.servers") or conn.extra_dejson.get("bootstrap_servers")
        if servers:
            return str(servers)
        if not conn.host:
            raise KafkaError(f"connection {self.kafka_conn_id!r} has no extra bootstrap.servers and no host")
        return f"{conn.host}:{conn.port or 9092}"

    def _get_client(self) -> KafkaOffsets:
        """A new client (the caller closes it, e.g. ``with hook.get_conn() as kafka:``)."""
        return KafkaOffsets(self.bootstrap_servers(), self.timeout_s)

    def get_conn(self) -> KafkaOffsets:
        return self._get_client()

    def test_connection(self) -> tuple[bool, str]:
        try:
            with self._get_client() as kafka:
                topics = kafka.topics()
        except KafkaError as exc:
            return False, str(exc)
        return True, f"{len(topics)} topic(s) at {self.bootstrap_servers()}"
