"""The hot standby's watch: a thread of its driver that takes the active's place when it dies.

The rules (what counts as dead, the one-transaction takeover) are ``relay.protocol.failover``'s; this
is the loop that applies them every ``POLL_S`` while the instance waits, and stops for good once it
took over, was fenced or asked to stop.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from relay.config.bounds import finite_between
from relay.errors import RelayError
from relay.ledger.store import Ledger
from relay.operations.upgrade_state import ALL_TERMINAL
from relay.protocol.failover import FAILOVER_AFTER_S, DeathWatch, fail_over, look_at_active

log = logging.getLogger("relay.job")

POLL_S = 0.5
AFTER_ENV = "RELAY_FAILOVER_AFTER_S"


def failover_after_s() -> float:
    """The detection bound: ``RELAY_FAILOVER_AFTER_S`` (1 to 300 s) or ``FAILOVER_AFTER_S``."""
    try:
        value = float(os.environ.get(AFTER_ENV) or FAILOVER_AFTER_S)
    except ValueError:
        return FAILOVER_AFTER_S
    return value if finite_between(value, 1.0, 300.0) else FAILOVER_AFTER_S


def watch(ledger: Ledger, instance_id: int, pipeline: str) -> None:
    """Until this instance stops waiting: look at the active, take over when it is dead."""
    death = DeathWatch(failover_after_s())
    while True:  # not a wait with a deadline: the standby watches for as long as it stands by
        time.sleep(POLL_S)
        try:
            me = ledger.instance(instance_id)
            if not me.state.standby or me.stop_requested:
                return
            seen = look_at_active(ledger, pipeline, instance_id)
            reason = death.dead(seen)
            if reason is None or seen is None:
                continue
            log.warning("the active looks dead (%s): taking over", reason)
            taken = fail_over(ledger, instance_id, seen, reason, ALL_TERMINAL)
            if taken is not None:
                log.warning(
                    "failover: instance %s took over from instance %s (%s lease(s))",
                    instance_id,
                    taken["from_instance"],
                    len(taken["leases"]),
                )
                return
            log.info("no failover: instance %s is alive, stopping or owned by an operation", seen.instance_id)
            death.reset()
        except RelayError as exc:  # the ledger is away for both: the count starts again after it
            death.reset()
            log.warning("hot standby watch: %s", exc)


def start_watch(ledger: Ledger, instance_id: int, pipeline: str) -> None:
    """Start the watch thread (it ends by itself once the instance no longer waits)."""
    args = (ledger, instance_id, pipeline)
    threading.Thread(target=watch, args=args, name="relay-hot-standby", daemon=True).start()
    log.info("hot standby: watching the active (failover after %.1f s of silence)", failover_after_s())
