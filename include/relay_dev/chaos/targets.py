"""Which worker and which driver JVM a fault aims at when the stack has two workers.

With ``RELAY_SPARK_WORKERS=2`` and a hot standby, the pipeline's active driver runs on one worker
and its standby on the other: a "worker" or "driver" fault aims at the active's (killing the
standby's tests nothing a user cares about). The active is read from the ledger, its driver's
worker from the master; the driver JVM is the one whose working folder is named after the driver id
(the worker runs each driver in ``<work dir>/<driver id>``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from relay.config import RelayConfig
from relay.errors import RelayError
from relay.ledger.models import Instance
from relay.ledger.store import Ledger
from relay.operations.standby import hot_standbys
from relay.spark.placement import active_of
from sqlalchemy.exc import SQLAlchemyError

from relay_dev.chaos import procs
from relay_dev.stack import WORKERS, LocalStack, Part


def _live(config: RelayConfig) -> list[Instance]:
    """The pipeline's live instances; none when the ledger can't be read (a fault may hold it)."""
    ledger = Ledger(config.ledger_url)
    try:
        return ledger.instances(config.pipeline, live_only=True)
    except (RelayError, SQLAlchemyError):
        return []
    finally:
        ledger.close()


def active_submission(config: RelayConfig) -> str | None:
    """The driver id of the pipeline's ACTIVE (or STARTING) instance, not a standby's."""
    active = active_of(_live(config))
    return active.submission_id if active else None


def active_worker(config: RelayConfig, stack: LocalStack) -> Part:
    """The worker part running the active's driver (the first worker when it can't be told)."""
    parts = [p for p in stack.parts() if p in WORKERS]
    if len(parts) < 2:
        return Part.SPARK_WORKER
    from relay.spark.launcher import spark_client

    with contextlib.suppress(RelayError):
        submission = active_submission(config)
        with contextlib.closing(spark_client(config)) as client:
            state = client.master_state()
        driver = state.driver(submission or "")
        worker = next((w for w in state.workers if driver and w.id == driver.worker), None)
        for part in parts:
            if worker is not None and worker.webui.endswith(f":{stack.worker_ui_port(part)}"):
                return part
    return Part.SPARK_WORKER


def driver_jvm_of(jvms: list[procs.Proc], submission: str | None) -> procs.Proc | None:
    """Of the driver JVMs in a worker's group, the one running ``submission`` (else the first)."""
    for jvm in jvms:
        with contextlib.suppress(OSError):
            if submission and Path(os.readlink(f"/proc/{jvm.pid}/cwd")).name == submission:
                return jvm
    return jvms[0] if jvms else None


def standby_state(config: RelayConfig) -> str | None:
    """The waiting hot standby's state (READY: warm) when the pipeline has one, else None."""
    if config.standby != "hot":
        return None
    waiting = hot_standbys(_live(config))
    return waiting[-1].state.value if waiting else "none"
