"""The hooks build their library clients from connections given as AIRFLOW_CONN_* variables."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay_dev.airflow_local import airflow_env, connection_env

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
for _key, _value in airflow_env(
    load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)
if str(PROJECT_ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; tests do it here
    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))

import jwt  # noqa: E402
from airflow.sdk.exceptions import AirflowNotFoundException  # noqa: E402
from relay.ledger.engine import create_ledger, safe_url  # noqa: E402
from relay.spark.auth import decode_key, ensure_secret_file  # noqa: E402
from relay_airflow.config import relay_config_from_connections  # noqa: E402
from relay_airflow.hooks.kafka_offsets import KafkaOffsetsHook  # noqa: E402
from relay_airflow.hooks.ledger import LedgerHook  # noqa: E402
from relay_airflow.hooks.spark_standalone import SparkStandaloneHook  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402


@pytest.fixture
def connections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Connections of a stack on unusual ports, as LocalAirflow hands them to its processes."""
    config = load_config(
        {
            "RELAY_DATA_DIR": str(tmp_path),
            "RELAY_SPARK_MASTER_UI_PORT": "28080",
            "RELAY_SPARK_REST_PORT": "26066",
            "RELAY_SPARK_MASTER_PORT": "27077",
            "RELAY_KAFKA_PORT": "29092",
        }
    )
    env = connection_env(config)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_spark_hook_builds_client_from_connection(connections: dict[str, str]) -> None:
    client = SparkStandaloneHook()._get_client()
    assert (client.master_ui_url, client.rest_url) == ("http://127.0.0.1:28080", "http://127.0.0.1:26066")
    assert SparkStandaloneHook().urls()["master_url"] == "spark://127.0.0.1:27077"


def test_spark_hook_defaults_rest_port_when_extra_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_OTHER_SPARK", json.dumps({"conn_type": "relay_spark", "host": "10.0.0.5", "port": 8080})
    )
    urls = SparkStandaloneHook("other_spark").urls()
    assert urls == {
        "master_ui_url": "http://10.0.0.5:8080",
        "rest_url": "http://10.0.0.5:6066",
        "master_url": "spark://10.0.0.5:7077",
    }


def test_spark_hook_test_connection_reports_unreachable_master(connections: dict[str, str]) -> None:
    ok, message = SparkStandaloneHook(timeout_s=1).test_connection()
    assert ok is False and "28080" in message


def test_kafka_hook_wraps_kafka_offsets_with_bootstrap_servers(connections: dict[str, str]) -> None:
    with KafkaOffsetsHook().get_conn() as kafka:
        assert kafka.bootstrap == "127.0.0.1:29092"


def test_kafka_hook_falls_back_to_host_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_K2", "relay-kafka://broker.example:9093")
    assert KafkaOffsetsHook("k2").bootstrap_servers() == "broker.example:9093"


def test_ledger_hook_returns_a_ledger_on_the_connection_url(
    connections: dict[str, str], tmp_path: Path
) -> None:
    ledger = LedgerHook().get_conn()
    assert ledger.url == f"sqlite:///{tmp_path / 'ledger.db'}"
    ok, message = LedgerHook().test_connection()  # no ledger there yet: refused, and none created
    assert ok is False and "no ledger at" in message and "relay ledger init" in message
    assert not (tmp_path / "ledger.db").exists()
    create_ledger(ledger.url)
    assert LedgerHook().test_connection() == (True, f"ledger at {ledger.url}")


def test_spark_hook_signs_with_the_key_file_or_the_password(
    connections: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded stack names the key file in the connection; a deployment may use the password."""
    assert SparkStandaloneHook()._get_client().signer is None  # no key file yet: unsigned
    key_file = tmp_path / "secrets" / "spark-rest.key"
    ensure_secret_file(key_file)
    key = key_file.read_text().strip()
    token = SparkStandaloneHook()._get_client().signer.token()
    assert jwt.decode(token, decode_key(key), algorithms=["HS256"])["iss"] == "relay"
    config = relay_config_from_connections(load_config({"RELAY_DATA_DIR": str(tmp_path / "other")}))
    assert config.spark_rest_secret_file == key_file
    monkeypatch.setenv(
        "AIRFLOW_CONN_PW_SPARK",
        json.dumps({"conn_type": "relay_spark", "host": "10.0.0.5", "port": 8080, "password": key}),
    )
    token = SparkStandaloneHook("pw_spark")._get_client().signer.token()
    assert jwt.decode(token, decode_key(key), algorithms=["HS256"])["iss"] == "relay"


def test_ledger_hook_builds_postgres_url_keeping_the_password_in_its_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_PG_LEDGER",
        json.dumps(
            {
                "conn_type": "relay_ledger",
                "host": "db",
                "port": 5433,
                "login": "relay",
                "password": "s3cret",
                "schema": "ledger",
            }
        ),
    )
    assert LedgerHook("pg_ledger").sqlalchemy_url() == "postgresql+psycopg2://relay:s3cret@db:5433/ledger"


@pytest.mark.parametrize("password", ["p@ss/w:rd", "a@b@c", "%40/:?#&=+ é"])
def test_ledger_hook_encodes_login_and_password(monkeypatch: pytest.MonkeyPatch, password: str) -> None:
    """'@', '/', ':' and friends in a password or login are URL-encoded, so they cannot break the URL,
    and the masked form shows no part of the password."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_PG_ODD",
        json.dumps(
            {
                "conn_type": "relay_ledger",
                "host": "db",
                "port": 5433,
                "login": "re:l@y",
                "password": password,
                "schema": "ledger",
            }
        ),
    )
    url = LedgerHook("pg_odd").sqlalchemy_url()
    parsed = make_url(url)
    assert (parsed.username, parsed.password, parsed.host, parsed.port, parsed.database) == (
        "re:l@y",
        password,
        "db",
        5433,
        "ledger",
    )
    assert safe_url(url) == "postgresql+psycopg2://re%3Al%40y:***@db:5433/ledger"


def test_config_from_connections_overrides_only_addresses(
    connections: dict[str, str], tmp_path: Path
) -> None:
    base = load_config({"RELAY_DATA_DIR": str(tmp_path / "elsewhere"), "RELAY_PIPELINE": "p1"})
    config = relay_config_from_connections(base)
    assert config.pipeline == "p1" and config.data_dir == tmp_path / "elsewhere"
    assert config.spark_rest_url == "http://127.0.0.1:26066"
    assert config.spark_master_ui_url == "http://127.0.0.1:28080"
    assert config.kafka_bootstrap == "127.0.0.1:29092"
    assert config.ledger_url == f"sqlite:///{tmp_path / 'ledger.db'}"


def test_config_from_connections_keeps_config_when_no_connection_exists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("RELAY_SPARK", "RELAY_KAFKA", "RELAY_LEDGER"):
        monkeypatch.delenv(f"AIRFLOW_CONN_{name}", raising=False)
    with pytest.raises(AirflowNotFoundException):
        LedgerHook().sqlalchemy_url()
    base = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    assert relay_config_from_connections(base) == base
