"""What Airflow learns about Relay from the ``apache_airflow_provider`` entry point (``provider.yaml``).

Installed as the ``relay-airflow-provider`` distribution (the repository's ``pyproject.toml``),
``airflow providers list`` shows Relay and the connection form offers its three connection types with
their fields. The UI reads the fields from here (``conn-fields``, ``ui-field-behaviour``) without
importing a hook: Airflow 3.2 deprecated the hooks' ``get_ui_field_behaviour`` for this, and
``tests/unit/test_provider_info.py`` holds both to the same text. ``conn-fields`` are stored in the
connection's extra under their own name, the key each hook reads.

``relay_alerts`` is not a type of its own: it is an ``http`` connection (any webhook), a type the
HTTP provider owns; ``RelayAlertsHook`` is listed among the hooks only. Static data, no imports:
Airflow calls this in every process that discovers providers.
"""

from __future__ import annotations

from typing import Any

PACKAGE_NAME = "relay-airflow-provider"  # its version is the distribution's (pyproject.toml)
INTEGRATION = "Relay"

_SPARK_FIELDS = {
    "rest_url": {
        "label": "REST submission URL",
        "description": "The master's REST submission server (default: the master's host, port 6066).",
        "schema": {"type": ["string", "null"]},
    },
    "master_url": {
        "label": "Master URL",
        "description": "spark://host:port of the master (default: the master's host, port 7077).",
        "schema": {"type": ["string", "null"]},
    },
    "rest_secret_file": {
        "label": "REST signing key file",
        "description": "A file holding the REST server's signing key (the password field wins).",
        "schema": {"type": ["string", "null"]},
    },
}


def _modules(*names: str) -> list[dict[str, Any]]:
    """One integration entry listing ``relay_airflow.<name>`` for each name."""
    return [{"integration-name": INTEGRATION, "python-modules": [f"relay_airflow.{n}" for n in names]}]


def get_provider_info() -> dict[str, Any]:
    """Relay's provider information (keys as in Airflow's ``provider_info.schema.json``)."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "Relay",
        "description": "Relay: deploy, upgrade, recover, stop and watch PySpark Structured Streaming "
        "pipelines that read Kafka, with a ledger that makes each batch's output exactly-once.\n",
        "integrations": [{"integration-name": INTEGRATION, "tags": ["apache", "spark", "kafka"]}],
        "hooks": _modules("hooks.spark_standalone", "hooks.kafka_offsets", "hooks.ledger", "hooks.alerts"),
        "operators": _modules("operators.ledger_wait", "operators.approval"),
        "sensors": _modules("sensors.first_commit"),
        "triggers": _modules("triggers.ledger_wait"),
        "notifications": ["relay_airflow.notifiers.relay_alert.RelayAlertNotifier"],
        "connection-types": [
            {
                "hook-class-name": "relay_airflow.hooks.spark_standalone.SparkStandaloneHook",
                "hook-name": "Relay Spark standalone",
                "connection-type": "relay_spark",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login"],
                    "relabeling": {"password": "REST signing key (base64url)"},
                    "placeholders": {
                        "host": "127.0.0.1 (master web UI)",
                        "port": "8080",
                        "extra": '{"rest_url": "http://127.0.0.1:6066", '
                        '"master_url": "spark://127.0.0.1:7077", '
                        '"rest_secret_file": "/path/to/spark-rest.key"}',
                    },
                },
                "conn-fields": _SPARK_FIELDS,
            },
            {
                "hook-class-name": "relay_airflow.hooks.kafka_offsets.KafkaOffsetsHook",
                "hook-name": "Relay Kafka offsets",
                "connection-type": "relay_kafka",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "password", "host", "port"],
                    "relabeling": {},
                    "placeholders": {"extra": '{"bootstrap.servers": "127.0.0.1:9092"}'},
                },
                "conn-fields": {
                    # not "bootstrap.servers": a form field's name with a dot would be read as a path
                    "bootstrap_servers": {
                        "label": "Bootstrap servers",
                        "description": "host:port[,host:port...] of the Kafka brokers.",
                        "schema": {"type": ["string", "null"]},
                    }
                },
            },
            {
                "hook-class-name": "relay_airflow.hooks.ledger.LedgerHook",
                "hook-name": "Relay ledger",
                "connection-type": "relay_ledger",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {},
                    "placeholders": {
                        "extra": '{"url": "sqlite:////path/to/ledger.db"}',
                        "host": "PostgreSQL host (when no extra url)",
                    },
                },
                "conn-fields": {
                    "url": {
                        "label": "Ledger URL",
                        "description": "SQLAlchemy URL of the ledger; empty: PostgreSQL from host, port, "
                        "schema, login and password.",
                        "schema": {"type": ["string", "null"]},
                    }
                },
            },
        ],
        "plugins": [{"name": "relay", "plugin-class": "relay_airflow.plugin.RelayPlugin"}],
    }
