"""A driver process's entry: parse, build the runtime, run the attempt, exit with its deliberate code.

Apart from ``driver_runtime`` (the attempt's lifecycle) because this is the process's edge: how
start-up failures map to exit codes (relaunch or not), the SIGTERM handler, and the hard exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable

from driver_runtime import EXIT_OK, EXIT_RETRY, DriverRuntime
from relay.errors import LedgerUnavailableError, RelayError

log = logging.getLogger("relay.job")


def run_main(
    argv: list[str] | None,
    parse: Callable[[list[str]], argparse.Namespace],
    driver_class: Callable[[argparse.Namespace], DriverRuntime],
) -> int:
    """Parse, open the ledger, run the attempt; every failure mapped to its deliberate exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    supervised = "--supervised" in argv
    try:
        driver = driver_class(parse(argv))
    except LedgerUnavailableError as exc:  # transient: the relaunch may find the ledger back
        log.error("cannot start (will be relaunched): %s", exc)
        return EXIT_RETRY
    except RelayError as exc:  # bad arguments, no such instance: a relaunch cannot fix it
        log.error("cannot start: %s", exc)
        return EXIT_OK if supervised else 2
    signal.signal(signal.SIGTERM, lambda *_: setattr(driver, "stop_signal", True))
    code = driver.run()
    log.info("exit %s", code)
    return code


def exit_now(code: int) -> None:
    logging.shutdown()
    os._exit(code)  # py4j threads must not keep a finished driver alive
