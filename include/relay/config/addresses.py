"""Where the parts live: the stack's addresses, ports, folders and secrets, shared by every pipeline.

Apart from a pipeline's own settings (``relay.config.pipeline``): these name one deployment (the
embedded stack by default: 127.0.0.1 and ``var/``; a real Kafka, Spark and PostgreSQL otherwise),
and every pipeline declared on it sees the same values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from relay.config.bounds import MAX_CORES, MAX_PORT
from relay.config.variables import env_int, env_path
from relay.errors import ConfigError


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
ARTIFACT_STORES = ("local", "ledger")


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
class StackSettings:
    """The deployment's addresses and folders (one per stack, whatever the pipeline)."""

    data_dir: Path = PROJECT_ROOT / "var"
    kafka_bootstrap: str = "127.0.0.1:19092"
    spark_master_url: str = "spark://127.0.0.1:17077"
    spark_master_ui_url: str = "http://127.0.0.1:18080"
    spark_rest_url: str = "http://127.0.0.1:16066"
    ledger_url: str = field(default="", repr=False)  # may hold a password: never in a repr
    ports: Ports = field(default_factory=Ports)
    host: str = "127.0.0.1"
    worker_cores: int = 6
    """Scheduling slots of the embedded worker (not CPUs): two pipelines (a driver and an executor
    each) and one upgrade's green fit in the defaults (see relay.spark.capacity)."""
    worker_memory: str = "3g"
    spark_workers: int = 1
    """Workers of the embedded stack (1 or 2, each of ``worker_cores`` / ``worker_memory``): with 2 a
    hot standby waits on the other worker than the active's, so a worker loss is a failover."""
    spark_rest_secret_file: Path | None = None
    """Key of the REST server's JWS filter; None = ``<data_dir>/secrets/spark-rest.key``."""
    spark_rest_secret: str = field(default="", repr=False)
    """The key itself (base64url), when it comes from a secret store (an Airflow connection)."""
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

    def check_stack(self) -> None:
        """Fill the ledger's default (a SQLite file in the data dir) and refuse what can't work."""
        if not self.ledger_url:
            object.__setattr__(self, "ledger_url", f"sqlite:///{self.data_dir / 'ledger.db'}")
        if self.artifact_store not in ARTIFACT_STORES:
            raise ConfigError(
                f"RELAY_ARTIFACT_STORE must be one of {', '.join(ARTIFACT_STORES)}, "
                f"got {self.artifact_store!r}"
            )

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


def stack_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """The stack's settings the ``RELAY_*`` variables give (unset: the embedded stack's)."""
    d = Ports()
    ports = Ports(
        kafka=env_int(env, "RELAY_KAFKA_PORT", d.kafka, 1, MAX_PORT),
        spark_master=env_int(env, "RELAY_SPARK_MASTER_PORT", d.spark_master, 1, MAX_PORT),
        spark_master_ui=env_int(env, "RELAY_SPARK_MASTER_UI_PORT", d.spark_master_ui, 1, MAX_PORT),
        spark_rest=env_int(env, "RELAY_SPARK_REST_PORT", d.spark_rest, 1, MAX_PORT),
        spark_worker_ui=env_int(env, "RELAY_SPARK_WORKER_UI_PORT", d.spark_worker_ui, 1, MAX_PORT),
        spark_worker2_ui=env_int(env, "RELAY_SPARK_WORKER2_UI_PORT", d.spark_worker2_ui, 1, MAX_PORT),
        postgres=env_int(env, "RELAY_POSTGRES_PORT", d.postgres, 1, MAX_PORT),
        airflow=env_int(env, "RELAY_AIRFLOW_PORT", d.airflow, 1, MAX_PORT),
    )
    host = env.get("RELAY_HOST", "127.0.0.1")
    return {
        "data_dir": Path(env.get("RELAY_DATA_DIR") or PROJECT_ROOT / "var").resolve(),
        "kafka_bootstrap": env.get("RELAY_KAFKA_BOOTSTRAP") or f"{host}:{ports.kafka}",
        "spark_master_url": env.get("RELAY_SPARK_MASTER_URL") or f"spark://{host}:{ports.spark_master}",
        "spark_master_ui_url": env.get("RELAY_SPARK_MASTER_UI_URL")
        or f"http://{host}:{ports.spark_master_ui}",
        "spark_rest_url": env.get("RELAY_SPARK_REST_URL") or f"http://{host}:{ports.spark_rest}",
        "ledger_url": env.get("RELAY_LEDGER_URL", ""),
        "ports": ports,
        "host": host,
        "worker_cores": env_int(env, "RELAY_WORKER_CORES", 6, 1, MAX_CORES),
        "worker_memory": env.get("RELAY_WORKER_MEMORY", "3g"),
        "spark_workers": env_int(env, "RELAY_SPARK_WORKERS", 1, 1, 2),
        "spark_rest_secret_file": env_path(env, "RELAY_SPARK_REST_SECRET_FILE"),
        "artifact_store": env.get("RELAY_ARTIFACT_STORE") or "local",
        "checkpoint_root": checkpoint_root(env.get("RELAY_CHECKPOINT_ROOT")),
        "worker_spark_dir": env_path(env, "RELAY_WORKER_SPARK_DIR"),
        "spark_python": env.get("RELAY_SPARK_PYTHON", "").strip() or None,  # not resolved: a venv's link
    }


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
