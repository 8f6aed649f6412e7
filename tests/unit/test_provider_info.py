"""The provider's registration (``get_provider_info``, the pyproject's entry points) names real
classes, every Relay connection type, and the same form text as the hooks; its form fields are the
extra keys the hooks read."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import sys
import tomllib
from typing import Any

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay_dev.airflow_local import airflow_env

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
for _key, _value in airflow_env(
    load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)
if str(PROJECT_ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; tests do it here
    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))

from airflow.plugins_manager import AirflowPlugin  # noqa: E402
from airflow.sdk import BaseHook  # noqa: E402
from relay_airflow import hooks  # noqa: E402
from relay_airflow.get_provider_info import get_provider_info  # noqa: E402

INFO = get_provider_info()
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())


def _load(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _relay_hooks() -> dict[str, type[BaseHook]]:
    """Every hook class of ``relay_airflow.hooks`` by its connection type."""
    found: dict[str, type[BaseHook]] = {}
    for mod in pkgutil.iter_modules(hooks.__path__):
        module = importlib.import_module(f"{hooks.__name__}.{mod.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseHook) and cls.__module__ == module.__name__:
                found[cls.conn_type] = cls
    return found


def test_the_entry_points_name_the_provider_info_and_the_plugin() -> None:
    points = PYPROJECT["project"]["entry-points"]
    assert points["apache_airflow_provider"]["provider_info"] == (
        "relay_airflow.get_provider_info:get_provider_info"
    )
    plugin = _load(points["airflow.plugins"]["relay"].replace(":", "."))
    assert inspect.isclass(plugin) and issubclass(plugin, AirflowPlugin) and plugin.name == "relay"
    assert INFO["plugins"] == [{"name": "relay", "plugin-class": "relay_airflow.plugin.RelayPlugin"}]
    assert INFO["package-name"] == PYPROJECT["project"]["name"]


def test_the_distribution_ships_the_runtime_and_the_adapters_but_not_the_developer_tooling() -> None:
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    assert sorted(find["include"]) == ["relay", "relay.*", "relay_airflow", "relay_airflow.*"]
    assert all((PROJECT_ROOT / where).is_dir() for where in find["where"])


def test_every_listed_module_and_class_imports() -> None:
    for kind in ("hooks", "operators", "sensors", "triggers"):
        for entry in INFO[kind]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for dotted in INFO["notifications"] + [c["hook-class-name"] for c in INFO["connection-types"]]:
        assert inspect.isclass(_load(dotted)), dotted
    listed = {m.rpartition(".")[2] for m in INFO["hooks"][0]["python-modules"]}
    assert listed == {m.name for m in pkgutil.iter_modules(hooks.__path__)}


def test_every_relay_connection_type_is_registered_with_the_hooks_own_form_text() -> None:
    """The UI reads the form from the provider info (hooks' methods are deprecated there since
    Airflow 3.2); the two must not drift. ``http`` (relay_alerts) is the HTTP provider's type."""
    by_type = {c["connection-type"]: c for c in INFO["connection-types"]}
    relay_hooks = _relay_hooks()
    assert set(by_type) == {t for t in relay_hooks if t.startswith("relay_")}
    for conn_type, entry in by_type.items():
        hook = relay_hooks[conn_type]
        assert entry["hook-class-name"] == f"{hook.__module__}.{hook.__qualname__}"
        assert entry["hook-name"] == hook.hook_name
        behaviour = hook.get_ui_field_behaviour()
        declared = entry["ui-field-behaviour"]
        assert declared["hidden-fields"] == behaviour.get("hidden_fields", [])
        assert declared["relabeling"] == behaviour.get("relabeling", {})
        assert declared["placeholders"] == behaviour.get("placeholders", {})


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn_type: str, extra: dict[str, str]) -> None:
    body = {"conn_type": conn_type, "host": "10.0.0.9", "port": 8080, "extra": extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def test_the_form_fields_are_the_extra_keys_the_hooks_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the connection form stores under each field's name reaches the hook."""
    relay_hooks = _relay_hooks()
    fields = {c["connection-type"]: set(c["conn-fields"]) for c in INFO["connection-types"]}
    assert fields == {
        "relay_spark": {"rest_url", "master_url", "rest_secret_file"},
        "relay_kafka": {"bootstrap_servers"},
        "relay_ledger": {"url"},
    }
    _conn(monkeypatch, "form_spark", "relay_spark", {"rest_url": "http://r:1", "master_url": "spark://m:2"})
    spark = relay_hooks["relay_spark"]("form_spark")
    assert spark.urls() == {
        "master_ui_url": "http://10.0.0.9:8080",
        "rest_url": "http://r:1",
        "master_url": "spark://m:2",
    }
    _conn(monkeypatch, "form_spark_key", "relay_spark", {"rest_secret_file": "/nowhere/spark-rest.key"})
    assert str(relay_hooks["relay_spark"]("form_spark_key").rest_secret()[1]) == "/nowhere/spark-rest.key"
    _conn(monkeypatch, "form_kafka", "relay_kafka", {"bootstrap_servers": "k1:9092,k2:9092"})
    assert relay_hooks["relay_kafka"]("form_kafka").bootstrap_servers() == "k1:9092,k2:9092"
    _conn(monkeypatch, "form_ledger", "relay_ledger", {"url": "sqlite:////x/ledger.db"})
    assert relay_hooks["relay_ledger"]("form_ledger").sqlalchemy_url() == "sqlite:////x/ledger.db"
