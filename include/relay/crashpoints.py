"""Test-only crash points: make an operation die at a named persisted step, to prove it resumes.

Set ``RELAY_CRASH_AT`` to a point's name and the process exits at once (``os._exit``: no cleanup,
no finally blocks, as a SIGKILL would) when it gets there. Unset, a point costs one dict lookup.

The data plane's points (a Spark task inside its sink transaction, a driver between its tasks' writes
and the ledger commit) must fire exactly once across processes and relaunches, or every retry would
die too: ``RELAY_CRASH_ONCE_DIR`` names a folder, a file named after a point arms it, and the first
process to get there deletes the file (``unlink`` succeeds for exactly one) and exits. The launcher
forwards that variable to drivers and executors (``forwarded_env``).
"""

from __future__ import annotations

import os
import sys

CRASH_ENV = "RELAY_CRASH_AT"
CRASH_ONCE_DIR_ENV = "RELAY_CRASH_ONCE_DIR"
CRASH_EXIT = 86

UPGRADE_POINTS = (
    "upgrade.opened",  # operation persisted at PREFLIGHT, nothing started
    "upgrade.green_created",  # green created as a standby (no leases), GREEN_WARMING, not submitted
    "upgrade.green_submitted",  # green's driver submitted, READY not awaited yet
    "upgrade.green_ready",  # GREEN_READY persisted, H not chosen yet
    "upgrade.handed_off",  # handoff committed: blue closed at H, green leased from H, GREEN_STARTING
    "upgrade.green_caught_up",  # the cutover gate passed: DRAINING_BLUE persisted
    "upgrade.blue_drained",  # STOPPING_BLUE persisted
    "upgrade.blue_stopped",  # blue stopped, DONE not persisted yet
)
RECOVERY_POINTS = (
    "recovery.opened",  # operation persisted, nothing stopped yet
    "recovery.stopped",  # pipeline stopped and checkpoints archived (ARCHIVED persisted)
    "recovery.leased",  # gaps, new instance and leases committed with LEASED
    "recovery.submitted",  # the new instance's driver submitted, first commit not awaited
)

DATA_POINTS = (
    "pg_sink.before_commit",  # a task's rows and range record sent in its transaction, no COMMIT yet
    "kafka_sink.before_commit",  # a task's rows and marker sent in its Kafka transaction, not committed
    "ledger_sink.before_commit",  # a task's messages, dead letters and ranges sent, no COMMIT yet
    "pipeline.before_ledger_commit",  # every task of the batch wrote; the cursors not committed yet
)


def crash_point(name: str) -> None:
    """Exit here, hard, if the test asked for this point (always, or once: see the module)."""
    if os.environ.get(CRASH_ENV) == name or _claim_once(name):
        sys.stderr.write(f"relay: crash point {name} reached; exiting {CRASH_EXIT}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT)


def _claim_once(name: str) -> bool:
    folder = os.environ.get(CRASH_ONCE_DIR_ENV)
    if not folder:
        return False
    try:
        os.unlink(os.path.join(folder, name))
    except OSError:
        return False  # not armed, or another process got there first
    return True


def arm_once(folder: str, name: str) -> None:
    """Arm ``name`` in ``folder`` (tests): the next process with the folder set that reaches it dies."""
    if name not in (*UPGRADE_POINTS, *RECOVERY_POINTS, *DATA_POINTS):
        raise ValueError(f"unknown crash point {name!r}")
    with open(os.path.join(folder, name), "w"):
        pass


def forwarded_env() -> dict[str, str]:
    """What a launcher passes to drivers and executors: the once-folder when a test set one."""
    folder = os.environ.get(CRASH_ONCE_DIR_ENV)
    return {CRASH_ONCE_DIR_ENV: folder} if folder else {}
