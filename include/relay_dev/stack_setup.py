"""What ``relay stack up`` prepares before and after starting the parts (private files and the
ledger), and how it tells the Spark parts are up (the master's and a worker's probe).

Why apart from :mod:`relay_dev.stack` (which starts and stops processes): these are the security
defaults of the embedded stack. The data dir is private (0700: it holds the ledger, the keys and
the Airflow password); the REST submission server's signing key is generated once (0600) and given
to the master in a 0600 properties file, never on its command line; the configured ledger is created
here, because opening a ledger anywhere else never creates one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.config import RelayConfig
from relay.config.secret_files import write_private
from relay.errors import LedgerError, StackError
from relay.ledger.engine import create_ledger, safe_url
from relay.spark.auth import ensure_secret_file, master_properties, read_secret_file
from relay.spark.rest import SparkStandaloneClient

from relay_dev.postgres_local import restrict_dir

REST_UNPROTECTED = (
    "the REST submission server accepts unsigned requests (started without the JWS filter): "
    "stop the stack and start it again"
)


def prepare_data_dir(config: RelayConfig, progress: Callable[[str], None]) -> None:
    """The data dir 0700 and the REST server's signing key (generated on the first ``up`` only)."""
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    restrict_dir(config.data_dir)
    config.logs_dir.mkdir(parents=True, exist_ok=True)
    if ensure_secret_file(config.spark_rest_secret_path):
        progress(f"generated the Spark REST signing key in {config.spark_rest_secret_path}")


def master_properties_file(config: RelayConfig) -> Path:
    """The master's REST settings, signing key and recovery mode, in a 0600 file it reads at start.

    A file, not ``-D`` options in SPARK_MASTER_OPTS: a JVM's options show in ``ps`` and in the
    master's log. Rewritten at each start from the key file (the key itself never changes).
    """
    recovery = config.spark_dir / "recovery"
    recovery.mkdir(parents=True, exist_ok=True, mode=0o700)
    props = {
        # A master restarted by the supervisor reads back its workers, applications and drivers
        # (without it, it knows no driver and the worker is told to kill the one it runs).
        "spark.deploy.recoveryMode": "FILESYSTEM",
        "spark.deploy.recoveryDirectory": str(recovery),
        "spark.master.rest.enabled": "true",
        "spark.master.rest.port": str(config.ports.spark_rest),
        "spark.master.rest.host": config.host,
        **master_properties(read_secret_file(config.spark_rest_secret_path)),
    }
    path = config.secrets_dir / "spark-master.properties"
    write_private(path, "".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def ensure_ledger(config: RelayConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    """Create the configured ledger when it does not exist (``up`` is an explicit create)."""
    try:
        created = create_ledger(config.ledger_url)
    except LedgerError as exc:
        raise StackError(f"ledger: {exc}") from exc
    where = safe_url(config.ledger_url)
    progress(f"ledger: {'created' if created else 'found'} at {where}")
    return {"url": where, "created": created}


def noida_binary() -> Path:
    """The noida-db binary inside the installed package (its entry point is a Python wrapper)."""
    import noida_db

    path = Path(noida_db.__file__).parent / "noida-db"
    if not path.exists():
        raise StackError(f"noida-db binary not found at {path}: is the noida-db package installed?")
    return path


def probe_master(client: SparkStandaloneClient) -> tuple[bool, str]:
    """(healthy, detail) of the master as a client sees it: alive, its REST server taking signed
    requests only (an unsigned one answered is a REST server open to anyone: unhealthy)."""
    unsigned = SparkStandaloneClient(client.master_ui_url, client.rest_url, client.timeout_s)
    try:
        state = client.master_state()
        rest = client.ready()
        open_rest = rest and unsigned.ready()
    finally:
        client.close()
        unsigned.close()
    if open_rest:
        return False, REST_UNPROTECTED
    detail = f"status {state.status}, REST {'ready (signed requests only)' if rest else 'not ready'}"
    return state.alive and rest, detail


def probe_worker(client: SparkStandaloneClient, host: str, ui_port: int, first: bool) -> tuple[bool, str]:
    """(healthy, detail) of the worker whose UI is on ``ui_port``: registered ALIVE with the master.
    The first worker is also recognised by its host alone (a master that lists no UI address)."""
    try:
        state = client.master_state()
    finally:
        client.close()
    mine = [w for w in state.workers if w.state == "ALIVE" and w.host == host]
    by_ui = [w for w in mine if f":{ui_port}" in (w.webui or "")]
    mine = by_ui if by_ui or not first else mine
    if not mine:
        return False, "not registered with the master"
    w = mine[0]
    return True, f"{w.id} ALIVE, cores {w.cores_used}/{w.cores}, memory {w.memory_used_mb}/{w.memory_mb} MB"
