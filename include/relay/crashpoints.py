"""Test-only crash points: make an operation die at a named persisted step, to prove it resumes.

Set ``RELAY_CRASH_AT`` to a point's name and the process exits at once (``os._exit``: no cleanup,
no finally blocks, as a SIGKILL would) when it gets there. Unset, a point costs one dict lookup.
"""

from __future__ import annotations

import os
import sys

CRASH_ENV = "RELAY_CRASH_AT"
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


def crash_point(name: str) -> None:
    """Exit here, hard, if the test asked for this point."""
    if os.environ.get(CRASH_ENV) == name:
        sys.stderr.write(f"relay: crash point {name} reached ({CRASH_ENV}); exiting {CRASH_EXIT}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT)
