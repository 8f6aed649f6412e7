"""Artifacts that travel: the ledger as the store every host reaches (``RELAY_ARTIFACT_STORE=ledger``).

On a Spark standalone cluster the master may start a driver on any worker, where the submitter's
``artifacts/`` folder does not exist. With this store the submitter writes each version it launches
into the ledger (``artifacts`` table: driver script, zip, code hash), and submits the installed
runtime's ``spark_jobs/artifact_bootstrap.py`` instead of the artifact's driver: on the worker, it
fetches the version by pipeline and version, checks the bytes against the code hash the submission
names, and runs the version's driver, which ships the zip to its executors.

Why the ledger: every driver already reaches it (its URL is in the driver's environment), it is
backed up with the rest of the pipeline's truth, and a version's code is small (a few hundred kB).
The same submission pins nothing of the submitter's host: no SPARK_LOCAL_IP (each worker's own
address applies), no submitter folder (scratch goes to ``RELAY_WORKER_SPARK_DIR`` or the workers'
own settings).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.engine import Connection

from relay.artifacts import Artifact, zip_code_hash
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import ConfigError
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from relay.spark.driver_properties import DRIVER_JIT_OPTS, driver_properties, scratch_properties
from relay.spark.rest import SparkStandaloneClient

BOOTSTRAP = PROJECT_ROOT / "spark_jobs" / "artifact_bootstrap.py"
BOOTSTRAP_FOLDER = "relay-artifact"  # artifact_bootstrap.FOLDER, under the driver's working folder
HOST_PINNED = ("SPARK_LOCAL_IP",)  # the submitter's address: a driver elsewhere must not bind it


@dataclass(frozen=True)
class StoredArtifact:
    pipeline: str
    version: str
    code_hash: str
    driver: str
    size: int
    created_at: float


def publish(ledger: Ledger, pipeline: str, art: Artifact) -> StoredArtifact:
    """Write ``art`` into the ledger unless the same code is there already; a rebuilt version
    (``relay build --force``) replaces its row. Returns what the store holds now."""
    if not art.exists():
        raise ConfigError(f"version {art.version} is not built: nothing to store")
    code_hash = zip_code_hash(art.zip_file, art.job_file)
    t = s.artifacts
    key = (t.c.pipeline == pipeline) & (t.c.version == art.version)
    with ledger.tx() as conn:
        found = conn.execute(select(t.c.code_hash).where(key)).first()
        if found is not None and found[0] == code_hash:
            return _describe(conn, key)
        values = {
            "code_hash": code_hash,
            "driver": art.job_file.name,
            "driver_script": art.job_file.read_bytes(),
            "zip": art.zip_file.read_bytes(),
            "created_at": time.time(),
        }
        if found is None:
            conn.execute(t.insert().values(pipeline=pipeline, version=art.version, **values))
        else:
            conn.execute(t.update().where(key).values(**values))
        return _describe(conn, key)


def stored(ledger: Ledger, pipeline: str) -> list[StoredArtifact]:
    """The versions the store holds for ``pipeline`` (oldest first), without their bytes."""
    t = s.artifacts
    with ledger.tx() as conn:
        return _describe_all(conn, t.c.pipeline == pipeline)


def _describe(conn: Connection, where: ColumnElement[bool]) -> StoredArtifact:
    return _describe_all(conn, where)[0]


def _describe_all(conn: Connection, where: ColumnElement[bool]) -> list[StoredArtifact]:
    t = s.artifacts
    rows = conn.execute(
        select(t.c.pipeline, t.c.version, t.c.code_hash, t.c.driver, func.length(t.c.zip), t.c.created_at)
        .where(where)
        .order_by(t.c.created_at)
    ).all()
    return [StoredArtifact(r[0], r[1], r[2], r[3], int(r[4] or 0), float(r[5])) for r in rows]


def bootstrap_args(pipeline: str, version: str, code_hash: str, driver_args: list[str]) -> list[str]:
    """The bootstrap's command line: which artifact, the hash it must have, then the driver's own."""
    return ["--pipeline", pipeline, "--version", version, "--code-hash", code_hash, "--", *driver_args]


def anywhere_properties(config: RelayConfig, app_name: str) -> dict[str, str]:
    """sparkProperties of a supervised driver that may run on any worker: the usual ones without
    the submitter's address and folders, and no py-file (the bootstrap fetches the code)."""
    props = driver_properties(config, app_name, supervise=True, py_files=[])
    for name in HOST_PINNED:
        props.pop(f"spark.driverEnv.{name}", None)
        props.pop(f"spark.executorEnv.{name}", None)
    for key in ("spark.submit.pyFiles", *scratch_properties(config.spark_dir)):
        props.pop(key, None)
    if config.worker_spark_dir is not None:
        props.update(scratch_properties(config.worker_spark_dir))
    else:
        props["spark.driver.extraJavaOptions"] = DRIVER_JIT_OPTS
    # The driver's Python planner processes (started by its JVM in its working folder) find the
    # version's code there; executors get it from the driver (SparkContext.addPyFile).
    props["spark.driverEnv.PYTHONPATH"] = f"{BOOTSTRAP_FOLDER}/relay_job.zip"
    props["spark.executorEnv.PYTHONPATH"] = ""
    return props


def anywhere_environment(env_vars: dict[str, str]) -> dict[str, str]:
    """The submission's environment without what pins the submitter's host."""
    env = {k: v for k, v in env_vars.items() if k not in HOST_PINNED}
    env["PYTHONPATH"] = f"{BOOTSTRAP_FOLDER}/relay_job.zip"
    return env


def submit_from_store(
    config: RelayConfig,
    ledger: Ledger,
    client: SparkStandaloneClient,
    app_name: str,
    art: Artifact,
    driver_args: list[str],
    env_vars: dict[str, str],
    placement: dict[str, str] | None = None,
) -> str:
    """Publish ``art`` to the ledger, then submit the bootstrap for it; returns the driver id."""
    held = publish(ledger, config.pipeline, art)
    args = bootstrap_args(config.pipeline, art.version, held.code_hash, driver_args)
    props = {**anywhere_properties(config, app_name), **(placement or {})}
    return client.submit_python(str(BOOTSTRAP), args, props, anywhere_environment(env_vars))
