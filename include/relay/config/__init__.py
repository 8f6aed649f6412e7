"""Typed, frozen settings, read once at the edge (CLI, DAG, driver) from environment variables.

Every address and path comes from here, so the same code runs on the embedded stack (defaults bind
127.0.0.1 under ``var/``) and against a real Kafka / Spark / PostgreSQL deployment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from relay.config.bounds import (
    MAX_CORES,
    MAX_OFFSETS_PER_TRIGGER,
    MAX_PARTITIONS,
    MAX_PORT,
    MAX_TRIGGER_S,
    finite_between,
)
from relay.errors import ConfigError

if TYPE_CHECKING:
    from relay.pipeline.pipelines_file import PipelinesFile


def project_root(env: Mapping[str, str] | None = None) -> Path:
    """The Relay checkout holding ``spark_jobs/``, ``examples/`` and ``dags/``: ``RELAY_PROJECT_ROOT``,
    else the checkout this file is in (``include/relay/config``).

    Why the variable: installed from the provider's wheel (docs/deploy.md), this file lives in
    site-packages, three levels under no checkout; the deployment names the checkout its DAGs come
    from, where submissions find the drivers and the default data dir is ``var/``.
    """
    raw = (os.environ if env is None else env).get("RELAY_PROJECT_ROOT", "").strip()
    return Path(raw).resolve() if raw else Path(__file__).resolve().parents[3]


PROJECT_ROOT = project_root()
MIN_KEEP_VERSIONS = 2  # the running version and the one a rollback returns to
ARTIFACT_STORES = ("local", "ledger")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int = 2**31 - 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {raw[:40]!r}") from exc
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {raw[:40]}")
    return value


def _optional_int(env: Mapping[str, str], name: str, minimum: int, maximum: int) -> int | None:
    """``_int`` where unset (or ``auto``) means Relay decides: None."""
    if env.get(name, "").strip().lower() in ("", "auto"):
        return None
    return _int(env, name, 0, minimum, maximum)


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {env.get(name)!r}")


STANDBY_MODES = ("none", "hot")
RESOURCE_KEYS = ("driver_cores", "driver_memory", "executor_cores", "executor_memory", "cores_max")
"""The Spark resources an instance may run with apart from its pipeline's (``relay scale``)."""


def standby_mode(raw: str | None, where: str) -> str:
    value = (raw or "none").strip().lower()
    if value not in STANDBY_MODES:
        raise ConfigError(f"{where} must be one of {', '.join(STANDBY_MODES)}, got {raw!r}")
    return value


ADAPTIVE_BATCH_S = 5.0
"""What a batch aims to take while the pipeline is behind, when no batch size is fixed
(``spark_jobs/batch_sizing.py``); health expects batches that long while it catches up."""
BATCH_LIMITS = ("max_offsets_per_trigger", "trigger_seconds")
"""The settings a pipeline package, the operator and Relay's default may each give (an operator's
wins: relay.pipeline.effective_limits)."""
BATCH_LIMIT_VARIABLES = {
    "max_offsets_per_trigger": "RELAY_MAX_OFFSETS_PER_TRIGGER",
    "trigger_seconds": "RELAY_TRIGGER_SECONDS",
}
OPERATOR_LIMITS_ENV = "RELAY_OPERATOR_LIMITS"
"""Which BATCH_LIMITS the operator set, comma-separated: in a driver's environment (the values travel
on its command line) and in ``relay.config.env``'s (its RELAY_* values include Relay's defaults)."""


def named_limits(raw: str) -> tuple[str, ...]:
    """The BATCH_LIMITS a comma-separated list names, in BATCH_LIMITS order (other names ignored)."""
    names = {n.strip() for n in raw.split(",")}
    return tuple(n for n in BATCH_LIMITS if n in names)


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the embedded stack."""

    kafka: int = 19092
    spark_master: int = 17077
    spark_master_ui: int = 18080
    spark_rest: int = 16066
    spark_worker_ui: int = 18081
    spark_worker2_ui: int = 18082  # the embedded stack's second worker (RELAY_SPARK_WORKERS=2)
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
    worker_cores: int = 6
    """Scheduling slots of the embedded worker (not CPUs): two pipelines (a driver and an executor
    each) and one upgrade's green fit in the defaults (see relay.spark.capacity)."""
    worker_memory: str = "3g"
    spark_workers: int = 1
    """Workers of the embedded stack (1 or 2, each of ``worker_cores`` / ``worker_memory``): with 2 a
    hot standby waits on the other worker than the active's, so a worker loss is a failover."""
    trigger_seconds: float = 0.1
    """Seconds between micro-batch starts: 0.1 runs small batches back to back when records arrive
    (latency: p50 333 ms against 789 ms at 1 s, at 1,000 msg/s); an idle trigger costs two Kafka
    look-ups and no ledger transaction (issue #31)."""
    max_offsets_per_trigger: int | None = None
    """A fixed batch size in offsets. None (the default): each batch is sized from the lag and its
    measured cost, up to a bound from the executors' memory (``spark_jobs/batch_sizing.py``)."""
    host: str = "127.0.0.1"
    spark_rest_secret_file: Path | None = None
    """Key of the REST server's JWS filter; None = ``<data_dir>/secrets/spark-rest.key``."""
    spark_rest_secret: str = field(default="", repr=False)
    """The key itself (base64url), when it comes from a secret store (an Airflow connection)."""
    pipeline_code: Path | None = None
    """The pipeline package folder ``relay build`` freezes (None: ``examples/counter``, the seeds'
    counter, under this pipeline's name and topic: ``relay.artifacts.DEFAULT_PIPELINE_CODE``)."""
    keep_versions: int = 5
    """Artifacts kept after a build or an upgrade (newest first; running and rollback versions always)."""
    secret_env: tuple[str, ...] = ()
    """Names of the variables the pipeline's sink needs, as its pipelines file declares them."""
    driver_cores: int = 1
    driver_memory: str = "512m"
    executor_cores: int = 1
    executor_memory: str = "512m"
    cores_max: int = 1
    """Spark resources of each driver submitted for the pipeline (``spark.cores.max``: all executors)."""
    standby_nice: int = 10
    """The CPU priority (nice) a warm standby's driver and executors run at until the handoff, so
    green's start-up does not slow blue on a shared host (``RELAY_STANDBY_NICE``; 0 = unchanged)."""
    standby: str = "none"
    """``hot``: a second instance of the running version waits warm and takes the active's place
    within seconds when it dies (relay.protocol.failover); ``RELAY_STANDBY`` or the pipelines
    file's ``standby``. ``none``: a dead driver is relaunched by Spark (15-70 s)."""
    heal: bool = True
    """The health check relaunches an ACTIVE instance whose driver Spark will never run again
    (``RELAY_HEAL``; see relay.operations.heal)."""
    pipelines_file: Path | None = None
    """The pipelines file this pipeline was declared in (None: the environment's single pipeline).
    With a file, each pipeline's artifacts live in ``pipelines/<pipeline>/artifacts/`` (see
    relay.artifacts.artifacts_dir); checkpoints are per pipeline either way."""
    artifact_store: str = "local"
    """Where cluster-mode drivers get their version's code: ``local`` reads the submitter's
    ``artifacts/`` folder (one host); ``ledger`` stores it in the ledger and submits drivers that may
    run on any worker (see relay.artifacts.store)."""
    checkpoint_root: Path | None = None
    """Root of every pipeline's checkpoints (a filesystem every host mounts, on a cluster);
    None: ``<data_dir>/checkpoints``."""
    worker_spark_dir: Path | None = None
    """With the ledger store: Spark scratch for drivers and executors, a path valid on every worker
    (None: each worker's own settings decide)."""
    spark_python: str | None = None
    """The Python the drivers and executors run on the workers (pyspark installed); None: the
    submitter's own interpreter (the embedded stack, or Relay's venv at the same path everywhere)."""
    limits_from_env: tuple[str, ...] = ()
    """Which of ``max_offsets_per_trigger`` / ``trigger_seconds`` the environment set
    (``RELAY_MAX_OFFSETS_PER_TRIGGER`` / ``RELAY_TRIGGER_SECONDS``)."""
    limits_from_file: tuple[str, ...] = ()
    """Which of them this pipeline's table of the pipelines file set. Both are the operator's: they
    beat what the pipeline package declares (``relay.spark.launcher.operator_limits``); a value set
    neither way (the default, ``with_``) is Relay's, and the package's own value beats it."""

    def __post_init__(self) -> None:
        if not self.ledger_url:
            object.__setattr__(self, "ledger_url", f"sqlite:///{self.data_dir / 'ledger.db'}")
        if not self.pipeline.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"pipeline name must be letters, digits, '-' or '_', got {self.pipeline!r}")
        if self.artifact_store not in ARTIFACT_STORES:
            raise ConfigError(
                f"RELAY_ARTIFACT_STORE must be one of {', '.join(ARTIFACT_STORES)}, "
                f"got {self.artifact_store!r}"
            )
        if not 0 <= self.standby_nice <= 19:
            raise ConfigError(f"RELAY_STANDBY_NICE must be from 0 to 19, got {self.standby_nice}")
        if self.keep_versions < MIN_KEEP_VERSIONS:
            raise ConfigError(
                f"keep_versions must be >= {MIN_KEEP_VERSIONS} (the running version and the one a "
                f"rollback returns to), got {self.keep_versions}"
            )

    @property
    def checkpoints_dir(self) -> Path:
        return (self.checkpoint_root or self.data_dir / "checkpoints") / self.pipeline

    @property
    def drivers_anywhere(self) -> bool:
        """True when a driver may run on any worker: nothing it needs may live on the submitter."""
        return self.artifact_store == "ledger"

    @property
    def spark_dir(self) -> Path:
        """Spark scratch, socket and temp files (never /tmp)."""
        return self.data_dir / "spark"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def airflow_url(self) -> str:
        """The embedded stack's Airflow API server (its home is ``<data_dir>/airflow``)."""
        return f"http://{self.host}:{self.ports.airflow}"

    @property
    def airflow_supervised(self) -> bool:
        """The embedded stack runs Airflow for this data dir (``relay stack up``; ``relay airflow down``
        removes its programs): then health checks Airflow too."""
        return (self.data_dir / "supervisor" / "programs" / "airflow-scheduler.conf").is_file()

    @property
    def secrets_dir(self) -> Path:
        return self.data_dir / "secrets"

    @property
    def spark_rest_secret_path(self) -> Path:
        """Where the REST server's signing key is read from (and where ``stack up`` writes it)."""
        return self.spark_rest_secret_file or self.secrets_dir / "spark-rest.key"

    def with_(self, **changes: object) -> RelayConfig:
        return replace(self, **changes)

    def with_resources(self, resources: Mapping[str, Any] | None) -> RelayConfig:
        """This configuration with an instance's own Spark resources (``relay scale``) over it."""
        changes = {k: v for k, v in (resources or {}).items() if k in RESOURCE_KEYS}
        return replace(self, **changes) if changes else self

    def resources(self) -> dict[str, Any]:
        """The Spark resources a driver of this configuration is submitted with."""
        return {k: getattr(self, k) for k in RESOURCE_KEYS}


def load_config(env: Mapping[str, str] | None = None, pipeline: str | None = None) -> RelayConfig:
    """The configuration of one pipeline: ``RELAY_*`` environment variables over the embedded
    defaults, then that pipeline's entries of the pipelines file when there is one.

    ``pipeline`` (the CLI's ``--pipeline``, a DAG's param) else ``RELAY_PIPELINE`` else the file's
    default selects it; without a file it only names the pipeline, as ``RELAY_PIPELINE`` always did.
    """
    env = os.environ if env is None else env
    base, declared = _declared(env)
    name = pipeline or env.get("RELAY_PIPELINE") or None
    if declared is None:
        return base.with_(pipeline=name) if name and name != base.pipeline else base
    return base.with_(**declared.settings(name or declared.default))


def pipeline_names(env: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """The pipelines one can act on, and the one chosen when none is named (``RELAY_PIPELINE`` if
    set, else the file's default): what ``--pipeline`` and the DAGs' ``pipeline`` param offer."""
    env = os.environ if env is None else env
    base, declared = _declared(env)
    if declared is None:
        return [base.pipeline], base.pipeline
    chosen = env.get("RELAY_PIPELINE") or declared.default
    declared.settings(chosen)  # an undeclared RELAY_PIPELINE is refused here too
    return declared.names, chosen


def _declared(env: Mapping[str, str]) -> tuple[RelayConfig, PipelinesFile | None]:
    """The environment's configuration and the pipelines file found from it (None: no file)."""
    from relay.pipeline.pipelines_file import load_pipelines_file

    base = _from_env(env)
    return base, load_pipelines_file(env, base.data_dir)


def _from_env(env: Mapping[str, str]) -> RelayConfig:
    data_dir = Path(env.get("RELAY_DATA_DIR") or PROJECT_ROOT / "var").resolve()
    d = Ports()
    ports = Ports(
        kafka=_int(env, "RELAY_KAFKA_PORT", d.kafka, 1, MAX_PORT),
        spark_master=_int(env, "RELAY_SPARK_MASTER_PORT", d.spark_master, 1, MAX_PORT),
        spark_master_ui=_int(env, "RELAY_SPARK_MASTER_UI_PORT", d.spark_master_ui, 1, MAX_PORT),
        spark_rest=_int(env, "RELAY_SPARK_REST_PORT", d.spark_rest, 1, MAX_PORT),
        spark_worker_ui=_int(env, "RELAY_SPARK_WORKER_UI_PORT", d.spark_worker_ui, 1, MAX_PORT),
        spark_worker2_ui=_int(env, "RELAY_SPARK_WORKER2_UI_PORT", d.spark_worker2_ui, 1, MAX_PORT),
        postgres=_int(env, "RELAY_POSTGRES_PORT", d.postgres, 1, MAX_PORT),
        airflow=_int(env, "RELAY_AIRFLOW_PORT", d.airflow, 1, MAX_PORT),
    )
    host = env.get("RELAY_HOST", "127.0.0.1")
    # A batch setting's variable is the operator's (it beats a pipeline package's value), unless
    # RELAY_OPERATOR_LIMITS names which are: relay.config.env hands on every value, Relay's defaults
    # included, and names the ones its configuration's operator set.
    operator_set = named_limits(env.get(OPERATOR_LIMITS_ENV, ",".join(BATCH_LIMITS)))
    trigger = env.get("RELAY_TRIGGER_SECONDS", "0.1")
    try:
        trigger_seconds = float(trigger)
    except ValueError:
        trigger_seconds = math.nan
    if not finite_between(trigger_seconds, 0, MAX_TRIGGER_S):
        raise ConfigError(
            f"RELAY_TRIGGER_SECONDS must be seconds in [0, {MAX_TRIGGER_S:g}], got {trigger[:40]!r}"
        )
    return RelayConfig(
        data_dir=data_dir,
        pipeline=env.get("RELAY_PIPELINE", "experience"),
        topic=env.get("RELAY_TOPIC", "experience"),
        partitions=_int(env, "RELAY_PARTITIONS", 3, 1, MAX_PARTITIONS),
        kafka_bootstrap=env.get("RELAY_KAFKA_BOOTSTRAP") or f"{host}:{ports.kafka}",
        spark_master_url=env.get("RELAY_SPARK_MASTER_URL") or f"spark://{host}:{ports.spark_master}",
        spark_master_ui_url=env.get("RELAY_SPARK_MASTER_UI_URL") or f"http://{host}:{ports.spark_master_ui}",
        spark_rest_url=env.get("RELAY_SPARK_REST_URL") or f"http://{host}:{ports.spark_rest}",
        ledger_url=env.get("RELAY_LEDGER_URL", ""),
        ports=ports,
        worker_cores=_int(env, "RELAY_WORKER_CORES", 6, 1, MAX_CORES),
        worker_memory=env.get("RELAY_WORKER_MEMORY", "3g"),
        spark_workers=_int(env, "RELAY_SPARK_WORKERS", 1, 1, 2),
        trigger_seconds=trigger_seconds,
        max_offsets_per_trigger=_optional_int(
            env, "RELAY_MAX_OFFSETS_PER_TRIGGER", 1, MAX_OFFSETS_PER_TRIGGER
        ),
        host=host,
        spark_rest_secret_file=_path(env, "RELAY_SPARK_REST_SECRET_FILE"),
        pipeline_code=_path(env, "RELAY_PIPELINE_CODE"),
        keep_versions=_int(env, "RELAY_KEEP_VERSIONS", 5, MIN_KEEP_VERSIONS, 1000),
        standby_nice=_int(env, "RELAY_STANDBY_NICE", 10, 0, 19),
        heal=_bool(env, "RELAY_HEAL", True),
        standby=standby_mode(env.get("RELAY_STANDBY"), "RELAY_STANDBY"),
        artifact_store=env.get("RELAY_ARTIFACT_STORE") or "local",
        checkpoint_root=checkpoint_root(env.get("RELAY_CHECKPOINT_ROOT")),
        worker_spark_dir=_path(env, "RELAY_WORKER_SPARK_DIR"),
        spark_python=env.get("RELAY_SPARK_PYTHON", "").strip() or None,  # not resolved: a venv's link
        limits_from_env=tuple(n for n in operator_set if env.get(BATCH_LIMIT_VARIABLES[n])),
    )


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name)
    return Path(raw).expanduser().resolve() if raw else None


def checkpoint_root(raw: str | None) -> Path | None:
    """``RELAY_CHECKPOINT_ROOT``: a ``file:///`` URI or an absolute path (a mounted shared filesystem).

    Other schemes (``hdfs://``, ``s3a://``) are refused: the driver reads ``offsets/N`` and recovery
    archives a checkpoint through the local filesystem, so the root must be mounted on every host.
    """
    if not raw:
        return None
    if raw.startswith("file://"):
        parsed = urlparse(raw)
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"RELAY_CHECKPOINT_ROOT: a file URI names no host (file:///path), got {raw!r}")
        raw = unquote(parsed.path)
    elif "://" in raw:
        raise ConfigError(
            f"RELAY_CHECKPOINT_ROOT must be a file:/// URI or a path of a filesystem every host mounts, "
            f"got {raw!r}: Relay reads checkpoints through the local filesystem"
        )
    path = Path(raw)
    if not path.is_absolute():
        raise ConfigError(f"RELAY_CHECKPOINT_ROOT must be absolute, got {raw!r}")
    return path
