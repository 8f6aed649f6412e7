"""What a driver is told when it starts: its arguments, its environment, its artifact and its folder.

Kept apart from the lifecycle in ``driver_runtime``: the arguments every driver takes (the launcher's
``driver_args``), the ledger URL Relay passes in the environment (never on the command line), the
settings frozen into the artifact's version module and the Spark driver id its working folder names.
Shipped to drivers in the artifact's zip like every ``spark_jobs`` module.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from relay.errors import ConfigError

LEDGER_URL_ENV = "RELAY_LEDGER_URL"  # the URL may hold a password: never on the command line
_DRIVER_DIR = re.compile(r"^driver-\d+-\d+$")


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit 2: a relaunch loop under supervision
        raise ConfigError(f"bad arguments: {message}")


def arg_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments every driver takes (the launcher's ``driver_args``); nothing secret."""
    p = _ArgParser(description=description)
    p.add_argument("--instance-id", required=True, type=int)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--max-offsets-per-trigger", type=int, default=None, help="default: adaptive batches")
    p.add_argument("--trigger-seconds", type=float, default=1.0)
    p.add_argument("--local", action="store_true", help="run with a local[2] master (no cluster)")
    p.add_argument("--spark-dir", help="scratch folder for local mode")
    p.add_argument("--supervised", action="store_true", help="exit 0 on failures a restart cannot fix")
    return p


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    limit = args.max_offsets_per_trigger
    if (limit is not None and limit < 1) or args.trigger_seconds < 0:
        raise ConfigError("--max-offsets-per-trigger must be >= 1 and --trigger-seconds >= 0")
    return args


def ledger_url_from_env() -> str:
    """The ledger URL from the environment Relay gave the submission (argv shows in ``ps``)."""
    url = os.environ.get(LEDGER_URL_ENV, "").strip()
    if not url:
        raise ConfigError(
            f"{LEDGER_URL_ENV} is not set: Relay passes the ledger URL in the driver's environment"
        )
    return url


def code_version() -> tuple[str | None, bool]:
    """The version frozen into the artifact this driver runs from (None when run from the source tree)."""
    try:
        import relay_job_version  # written by relay.artifacts.build_artifact
    except ImportError:
        return None, False
    return relay_job_version.VERSION, bool(relay_job_version.FAIL_AT_START)


def batch_delay() -> float:
    """Seconds each batch waits first: only a version built slow on purpose (``batch_delay_s``)."""
    try:
        import relay_job_version
    except ImportError:
        return 0.0
    return float(getattr(relay_job_version, "BATCH_DELAY_S", 0.0))


def own_driver_id() -> str | None:
    """The Spark driver id this process runs as: a standalone worker starts each driver in
    ``<work dir>/<driver id>``, the same folder across supervised relaunches."""
    name = Path.cwd().name
    return name if _DRIVER_DIR.match(name) else None
