"""The pipelines file: several pipelines declared once (TOML), each selected by name.

Why a file: with one pipeline the ``RELAY_*`` environment is enough, but two pipelines in one
environment can't both be ``RELAY_TOPIC``. The file holds what differs per pipeline (topic, code,
the sink's variable names, Spark resources, batch size); the environment keeps what they share
(stack addresses, the ledger). Found at ``RELAY_PIPELINES_FILE``, else ``<data_dir>/pipelines.toml``
(under the data dir so every private stack and test data dir has its own); no file = one pipeline
from the environment, exactly as before::

    default = "experience"            # optional: the pipeline when none is named

    [pipelines.experience]
    topic = "experience"              # required; one topic per pipeline, never shared
    partitions = 3
    max_offsets_per_trigger = 20000
    trigger_seconds = 1.0
    standby = "hot"                   # optional: a hot standby takes over a dead driver in seconds
    [pipelines.experience.autoscale]  # optional: the health check scales by lag (off without it)
    max_executors = 3

    [pipelines.json_upsert]
    topic = "json_upsert"
    pipeline_code = "json_upsert"     # relative to this file's folder
    secret_env = ["JSON_UPSERT_SINK_URL"]   # names of variables, never their values
    [pipelines.json_upsert.spark]
    driver_memory = "1g"
    executor_cores = 1

Batch size and trigger (``max_offsets_per_trigger``, ``trigger_seconds``): the operator's setting
wins, then the package's, then Relay's default. A key set here (or, for every pipeline, the
``RELAY_MAX_OFFSETS_PER_TRIGGER`` / ``RELAY_TRIGGER_SECONDS`` variable, the file winning over it)
overrides what the pipeline package declares in ``Pipeline(max_offsets_per_trigger=...,
trigger_seconds=...)``; a key set nowhere leaves the package's value, else Relay's default (20000
records, 1 s). So an operator can resize a deployed pipeline's batches without touching its code.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.config import BATCH_LIMITS, STANDBY_MODES, AutoscalePolicy, standby_mode
from relay.config.bounds import MAX_CORES, MAX_OFFSETS_PER_TRIGGER, MAX_TRIGGER_S, finite_between
from relay.errors import ConfigError

PIPELINES_FILE_ENV = "RELAY_PIPELINES_FILE"
DEFAULT_FILE_NAME = "pipelines.toml"  # under the data dir
NAME = re.compile(r"^[A-Za-z0-9_-]{1,200}$")  # relay.pipeline's rule: a Spark app name, an asset URI
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's rule
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
SPARK_SIZE = re.compile(r"^[1-9][0-9]*[kmgt]$")  # Spark's memory strings: 512m, 2g
TOP_KEYS = ("default", "pipelines")
PIPELINE_KEYS = (
    "topic",
    "partitions",
    "pipeline_code",
    "secret_env",
    "max_offsets_per_trigger",
    "trigger_seconds",
    "standby",
    "spark",
    "autoscale",
)
#: ``[pipelines.<name>.spark]`` key -> (RelayConfig field, kind). Defaults: RelayConfig's.
SPARK_KEYS = {
    "driver_cores": "cores",
    "driver_memory": "memory",
    "executor_cores": "cores",
    "executor_memory": "memory",
    "cores_max": "cores",
}


@dataclass(frozen=True)
class PipelinesFile:
    """A parsed, validated pipelines file: the declared pipelines (in file order) and the default."""

    path: Path
    default: str
    pipelines: dict[str, dict[str, Any]]
    """name -> RelayConfig field changes (``topic``, ``partitions``, ``pipeline_code``, ...)."""

    @property
    def names(self) -> list[str]:
        return list(self.pipelines)

    def settings(self, name: str) -> dict[str, Any]:
        """The RelayConfig changes of pipeline ``name``; an unknown name lists the known ones."""
        if name not in self.pipelines:
            raise ConfigError(
                f"{self.path}: no pipeline {name!r}; declared: {', '.join(self.names)} "
                f"(choose one with --pipeline or RELAY_PIPELINE)"
            )
        return self.pipelines[name]


def pipelines_file_path(env: Mapping[str, str], data_dir: Path) -> Path | None:
    """The file to read, or None (no file: one pipeline from the environment).

    A file named by ``RELAY_PIPELINES_FILE`` must exist (a typo must not fall back silently to the
    environment's pipeline); the default ``<data_dir>/pipelines.toml`` is optional.
    """
    raw = env.get(PIPELINES_FILE_ENV)
    if raw:
        path = Path(raw).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{PIPELINES_FILE_ENV}={raw}: no such file")
        return path
    default = data_dir / DEFAULT_FILE_NAME
    return default if default.is_file() else None


def read_pipelines_file(path: Path) -> PipelinesFile:
    """Parse and validate every pipeline of ``path`` (ConfigError naming the file, pipeline and key)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the pipelines file: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    _unknown(path, "", data, TOP_KEYS)
    declared = data.get("pipelines")
    if not isinstance(declared, dict) or not declared:
        raise ConfigError(f"{path}: declares no pipeline: add a [pipelines.<name>] table with a topic")
    pipelines: dict[str, dict[str, Any]] = {}
    topics: dict[str, str] = {}
    for name, table in declared.items():
        if not NAME.match(name):
            raise ConfigError(f"{path}: pipeline name {name!r} must be 1-200 letters, digits, '-' or '_'")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: pipelines.{name} must be a table ([pipelines.{name}])")
        settings = _pipeline(path, name, table)
        if settings["topic"] in topics:
            raise ConfigError(
                f"{path}: pipelines {topics[settings['topic']]} and {name} both read topic "
                f"{settings['topic']!r}: each pipeline needs its own topic"
            )
        topics[settings["topic"]] = name
        pipelines[name] = settings
    default = data.get("default", next(iter(pipelines)))
    if not isinstance(default, str) or default not in pipelines:
        raise ConfigError(
            f"{path}: default = {default!r} names no declared pipeline ({', '.join(pipelines)})"
        )
    return PipelinesFile(path, default, pipelines)


def _unknown(path: Path, where: str, table: Mapping[str, Any], allowed: tuple[str, ...] | Mapping) -> None:
    extra = [k for k in table if k not in allowed]
    if extra:
        at = f"{where}: " if where else ""
        raise ConfigError(f"{path}: {at}unknown key(s) {', '.join(extra)} (allowed: {', '.join(allowed)})")


def _pipeline(path: Path, name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """One ``[pipelines.<name>]`` table as RelayConfig changes."""
    where = f"pipelines.{name}"
    _unknown(path, where, table, PIPELINE_KEYS)

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: {where}.{key} {why}, got {table[key]!r}")

    if "topic" not in table:
        raise ConfigError(f"{path}: {where}: topic is required (the Kafka topic the pipeline reads)")
    if not isinstance(table["topic"], str) or not TOPIC.match(table["topic"]):
        raise bad("topic", "must be a Kafka topic name (letters, digits, '.', '_', '-')")
    out: dict[str, Any] = {
        "pipeline": name,
        "topic": table["topic"],
        "partitions": _integer(table, "partitions", 1, bad, default=3),
        "pipeline_code": None,
        "secret_env": (),
        "pipelines_file": path,
    }
    if "pipeline_code" in table:
        out["pipeline_code"] = _folder(path, table["pipeline_code"], bad)
    if "secret_env" in table:
        names = table["secret_env"]
        if not isinstance(names, list) or not all(isinstance(n, str) and ENV_NAME.match(n) for n in names):
            raise bad("secret_env", "must be a list of environment variable names (A-Z, 0-9, _)")
        out["secret_env"] = tuple(dict.fromkeys(names))
    if "max_offsets_per_trigger" in table:
        out["max_offsets_per_trigger"] = _integer(
            table, "max_offsets_per_trigger", 1, bad, None, MAX_OFFSETS_PER_TRIGGER
        )
    if "trigger_seconds" in table:
        value = table["trigger_seconds"]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not finite_between(value, 0, MAX_TRIGGER_S)
        ):
            raise bad("trigger_seconds", f"must be a number of seconds in [0, {MAX_TRIGGER_S:g}]")
        out["trigger_seconds"] = float(value)
    if "standby" in table:
        if not isinstance(table["standby"], str):
            raise bad("standby", f"must be one of {', '.join(STANDBY_MODES)}")
        out["standby"] = standby_mode(table["standby"], f"{path}: {where}.standby")
    if "spark" in table:
        out.update(_spark(path, where, table["spark"]))
    if "autoscale" in table:
        out["autoscale"] = _autoscale(path, where, table["autoscale"])
    # the operator's, so they beat the package's values (see the module's docstring)
    out["limits_from_file"] = tuple(k for k in BATCH_LIMITS if k in table)
    return out


def _integer(
    table: Mapping[str, Any],
    key: str,
    minimum: int,
    bad: Any,
    default: int | None = None,
    maximum: int = 2**31 - 1,
) -> int:
    if key not in table and default is not None:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad(key, f"must be an integer >= {minimum}")
    if value > maximum:
        raise bad(key, f"must be at most {maximum}")
    return value


def _folder(path: Path, raw: Any, bad: Any) -> Path:
    """A pipeline package folder, relative to the file's folder; it must exist now."""
    if not isinstance(raw, str) or not raw:
        raise bad("pipeline_code", "must be the path of a pipeline package folder")
    folder = (path.parent / Path(raw).expanduser()).resolve()
    if not folder.is_dir():
        raise bad("pipeline_code", f"must be an existing folder (resolved to {folder})")
    return folder


def _spark(path: Path, where: str, table: Any) -> dict[str, Any]:
    where = f"{where}.spark"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {where} must be a table ([{where}])")
    _unknown(path, where, table, SPARK_KEYS)
    out: dict[str, Any] = {}
    for key, value in table.items():
        if SPARK_KEYS[key] == "cores":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{path}: {where}.{key} must be an integer >= 1, got {value!r}")
        elif not isinstance(value, str) or not SPARK_SIZE.match(value):
            raise ConfigError(
                f"{path}: {where}.{key} must be a Spark size such as '512m' or '2g', got {value!r}"
            )
        out[key] = value
    executor, most = out.get("executor_cores", 1), out.get("cores_max", 1)  # RelayConfig's defaults
    if executor > most:
        raise ConfigError(
            f"{path}: {where}: executor_cores ({executor}) exceeds cores_max ({most}, 1 unless set): "
            "no executor could start"
        )
    return out


def load_pipelines_file(env: Mapping[str, str] | None, data_dir: Path) -> PipelinesFile | None:
    """The validated file for this environment and data dir, or None when there is none."""
    env = os.environ if env is None else env
    path = pipelines_file_path(env, data_dir)
    return read_pipelines_file(path) if path is not None else None


AUTOSCALE_KEYS = ("max_executors", "min_executors", "lag_seconds", "runs", "idle_runs", "busy_below")


def _autoscale(path: Path, where: str, table: Any) -> AutoscalePolicy:
    """``[pipelines.<name>.autoscale]``: ``max_executors`` required, the rest AutoscalePolicy's defaults."""
    where = f"{where}.autoscale"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {where} must be a table ([{where}])")
    _unknown(path, where, table, AUTOSCALE_KEYS)

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: {where}.{key} {why}, got {table[key]!r}")

    if "max_executors" not in table:
        raise ConfigError(f"{path}: {where}: max_executors is required (the most the policy may use)")
    most = _integer(table, "max_executors", 1, bad, None, MAX_CORES)
    least = _integer(table, "min_executors", 1, bad, 1, most)
    defaults = AutoscalePolicy(most)
    numbers: dict[str, float] = {}
    for key, low, high in (("lag_seconds", 1.0, MAX_TRIGGER_S * 24), ("busy_below", 0.01, 0.9)):
        value = table.get(key, getattr(defaults, key))
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not finite_between(value, low, high)
        ):
            raise bad(key, f"must be a number in [{low:g}, {high:g}]")
        numbers[key] = float(value)
    return AutoscalePolicy(
        max_executors=most,
        min_executors=least,
        runs=_integer(table, "runs", 1, bad, defaults.runs, 100),
        idle_runs=_integer(table, "idle_runs", 1, bad, defaults.idle_runs, 1000),
        **numbers,
    )
