"""Typed, frozen settings, read once at the edge (CLI, DAG, driver) from environment variables.

Every address and path comes from here, so the same code runs on the embedded stack (defaults bind
127.0.0.1 under ``var/``) and against a real Kafka / Spark / PostgreSQL deployment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from relay.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MIN_KEEP_VERSIONS = 2  # the running version and the one a rollback returns to


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the embedded stack."""

    kafka: int = 19092
    spark_master: int = 17077
    spark_master_ui: int = 18080
    spark_rest: int = 16066
    spark_worker_ui: int = 18081
    postgres: int = 15432
    airflow: int = 18088


@dataclass(frozen=True)
class RelayConfig:
    """Everything Relay needs to know about one pipeline and where its parts live."""

    data_dir: Path = PROJECT_ROOT / "var"
    pipeline: str = "experience"
    topic: str = "experience"
    partitions: int = 3
    kafka_bootstrap: str = "127.0.0.1:19092"
    spark_master_url: str = "spark://127.0.0.1:17077"
    spark_master_ui_url: str = "http://127.0.0.1:18080"
    spark_rest_url: str = "http://127.0.0.1:16066"
    ledger_url: str = field(default="", repr=False)  # may hold a password: never in a repr
    ports: Ports = field(default_factory=Ports)
    worker_cores: int = 4
    worker_memory: str = "3g"
    trigger_seconds: float = 1.0
    max_offsets_per_trigger: int = 20000
    host: str = "127.0.0.1"
    spark_rest_secret_file: Path | None = None
    """Key of the REST server's JWS filter; None = ``<data_dir>/secrets/spark-rest.key``."""
    spark_rest_secret: str = field(default="", repr=False)
    """The key itself (base64url), when it comes from a secret store (an Airflow connection)."""
    pipeline_code: Path | None = None
    """The user's pipeline package folder ``relay build`` freezes (None: the reference job)."""
    keep_versions: int = 5
    """Artifacts kept after a build or an upgrade (newest first; running and rollback versions always)."""

    def __post_init__(self) -> None:
        if not self.ledger_url:
            object.__setattr__(self, "ledger_url", f"sqlite:///{self.data_dir / 'ledger.db'}")
        if not self.pipeline.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"pipeline name must be letters, digits, '-' or '_', got {self.pipeline!r}")
        if self.keep_versions < MIN_KEEP_VERSIONS:
            raise ConfigError(
                f"keep_versions must be >= {MIN_KEEP_VERSIONS} (the running version and the one a "
                f"rollback returns to), got {self.keep_versions}"
            )

    @property
    def checkpoints_dir(self) -> Path:
        return self.data_dir / "checkpoints" / self.pipeline

    @property
    def spark_dir(self) -> Path:
        """Spark scratch, socket and temp files (never /tmp)."""
        return self.data_dir / "spark"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def secrets_dir(self) -> Path:
        return self.data_dir / "secrets"

    @property
    def spark_rest_secret_path(self) -> Path:
        """Where the REST server's signing key is read from (and where ``stack up`` writes it)."""
        return self.spark_rest_secret_file or self.secrets_dir / "spark-rest.key"

    def with_(self, **changes: object) -> RelayConfig:
        return replace(self, **changes)


def load_config(env: Mapping[str, str] | None = None) -> RelayConfig:
    """Build the configuration from ``RELAY_*`` environment variables over the embedded defaults."""
    env = os.environ if env is None else env
    data_dir = Path(env.get("RELAY_DATA_DIR") or PROJECT_ROOT / "var").resolve()
    d = Ports()
    ports = Ports(
        kafka=_int(env, "RELAY_KAFKA_PORT", d.kafka, 1),
        spark_master=_int(env, "RELAY_SPARK_MASTER_PORT", d.spark_master, 1),
        spark_master_ui=_int(env, "RELAY_SPARK_MASTER_UI_PORT", d.spark_master_ui, 1),
        spark_rest=_int(env, "RELAY_SPARK_REST_PORT", d.spark_rest, 1),
        spark_worker_ui=_int(env, "RELAY_SPARK_WORKER_UI_PORT", d.spark_worker_ui, 1),
        postgres=_int(env, "RELAY_POSTGRES_PORT", d.postgres, 1),
        airflow=_int(env, "RELAY_AIRFLOW_PORT", d.airflow, 1),
    )
    host = env.get("RELAY_HOST", "127.0.0.1")
    trigger = env.get("RELAY_TRIGGER_SECONDS", "1")
    try:
        trigger_seconds = float(trigger)
    except ValueError as exc:
        raise ConfigError(f"RELAY_TRIGGER_SECONDS must be a number, got {trigger!r}") from exc
    return RelayConfig(
        data_dir=data_dir,
        pipeline=env.get("RELAY_PIPELINE", "experience"),
        topic=env.get("RELAY_TOPIC", "experience"),
        partitions=_int(env, "RELAY_PARTITIONS", 3, 1),
        kafka_bootstrap=env.get("RELAY_KAFKA_BOOTSTRAP") or f"{host}:{ports.kafka}",
        spark_master_url=env.get("RELAY_SPARK_MASTER_URL") or f"spark://{host}:{ports.spark_master}",
        spark_master_ui_url=env.get("RELAY_SPARK_MASTER_UI_URL") or f"http://{host}:{ports.spark_master_ui}",
        spark_rest_url=env.get("RELAY_SPARK_REST_URL") or f"http://{host}:{ports.spark_rest}",
        ledger_url=env.get("RELAY_LEDGER_URL", ""),
        ports=ports,
        worker_cores=_int(env, "RELAY_WORKER_CORES", 4, 1),
        worker_memory=env.get("RELAY_WORKER_MEMORY", "3g"),
        trigger_seconds=trigger_seconds,
        max_offsets_per_trigger=_int(env, "RELAY_MAX_OFFSETS_PER_TRIGGER", 20000, 1),
        host=host,
        spark_rest_secret_file=_path(env, "RELAY_SPARK_REST_SECRET_FILE"),
        pipeline_code=_path(env, "RELAY_PIPELINE_CODE"),
        keep_versions=_int(env, "RELAY_KEEP_VERSIONS", 5, MIN_KEEP_VERSIONS),
    )


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name)
    return Path(raw).expanduser().resolve() if raw else None
