"""The reference job's driver: count Kafka messages and record each one, exactly once, through the ledger.

Run by the Spark master (cluster deploy mode, supervised) or locally (``--local``). The lifecycle
(attempt, heartbeat, supervision, graceful stop, deliberate exit codes) is ``driver_runtime``'s; what
is the reference job's own is its driver-side sink: each batch's rows (bounded by
``maxOffsetsPerTrigger``) are written into the ledger in the commit transaction, one row per
application, so the audit can see a record applied twice. User pipelines write on the executors
instead (``pipeline_driver``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # kafka_source, driver_runtime beside this file

from driver_inputs import LEDGER_URL_ENV, arg_parser, check_args  # noqa: E402
from driver_runtime import EXIT_OK, EXIT_RETRY, LAUNCH_TOKEN_ENV, DriverRuntime, exit_now, run_main  # noqa: E402
from relay.ledger.models import Offsets  # noqa: E402
from relay.protocol import Record, commit_batch  # noqa: E402
from relay.reference_sink import ReferenceSink  # noqa: E402

log = logging.getLogger("relay.job")

__all__ = ["EXIT_OK", "EXIT_RETRY", "LAUNCH_TOKEN_ENV", "LEDGER_URL_ENV", "Driver", "main", "parse_args"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    return check_args(arg_parser(__doc__).parse_args(argv))


class Driver(DriverRuntime):
    """The reference job: the batch's rows collected and committed with the ledger's own sink."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.sink = ReferenceSink(self.instance.version)

    def warm_batch(self, df: Any) -> None:
        """The warm-up batch: the same collect as a real batch, nothing committed."""
        df.select("topic", "partition", "offset", "key", "value").toArrow()

    def process_batch(
        self, df: Any, batch_id: int, start: Offsets | None, end: Offsets, started: float
    ) -> None:
        table = df.select("topic", "partition", "offset", "key", "value").toArrow()  # one action
        cols = [table.column(n).to_pylist() for n in ("topic", "partition", "offset", "key", "value")]
        records = [Record(*row) for row in zip(*cols)]
        result = commit_batch(self.ledger, self.attempt, batch_id, start, end, records, self.sink, started)
        log.info(
            "batch %s: read %s applied %s skipped %s dead %s commit %.1f ms",
            batch_id,
            result.rows_read,
            result.rows_applied,
            result.rows_skipped,
            result.dead_letters,
            result.commit_ms,
        )


def main(argv: list[str] | None = None) -> int:
    return run_main(argv, parse_args, Driver)


if __name__ == "__main__":
    exit_now(main())
