"""A standby's driver and executors at a lower CPU priority until the handoff (relay.spark.standby_priority).

The driver lowers its own process tree (its JVM, itself, the Python workers of a local session)
before it builds the session, and its executors' trees with one small job as soon as they run
(their JVM start itself is at the worker's priority: no code of the pipeline runs before it). It
takes both back just before it reports READY: its costly start-up is over by then, and the handoff
must find green's first batches at full priority (measured: taken back only after the handoff,
green's first batches ran at nice 10 beside blue's drain and the pause at the handoff grew from
0.8 to 2.4 s). Best effort: a task lands on whichever executor Spark picks, so each executor's JVM
is named by host and pid and a task on another one changes nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from relay.spark.standby_priority import jvm_above, lower, take_back

log = logging.getLogger("relay.standby_cpu")


class StandbyCpu:
    """What this standby lowered, so it can take exactly that back."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.driver: tuple[int, int] | None = None  # (root pid, nice before)
        self.executors: list[tuple[str, int, int]] = []  # (host, JVM pid, nice before)

    def lower_driver(self) -> None:
        root = jvm_above() or os.getpid()  # cluster mode: the JVM above; local: this process
        original = lower(root, self.nice)
        if original is not None:
            self.driver = (root, original)

    def lower_for_stop(self) -> None:
        """A driver that stops gracefully has nothing left to apply: its shutdown (the query's,
        the session's, the JVM's) yields the cores to the instance that took over. Not taken back."""
        lower(jvm_above() or os.getpid(), self.nice, returning=False)

    def lower_executors(self, spark: Any) -> None:
        if self.nice <= 0:
            return
        nice = self.nice

        def task(batches: Any) -> Any:
            import socket

            import pyarrow as pa
            from relay.spark.standby_priority import jvm_above, lower

            for _ in batches:
                pass
            root = jvm_above()
            original = lower(root, nice) if root else None
            schema = pa.schema([("host", pa.string()), ("pid", pa.int64()), ("nice", pa.int64())])
            rows = [] if original is None else [{"host": socket.gethostname(), "pid": root, "nice": original}]
            yield pa.RecordBatch.from_pylist(rows, schema=schema)

        n = max(int(spark.sparkContext.defaultParallelism), 1)
        rows = spark.range(0, n, 1, n).mapInArrow(task, "host string, pid long, nice long").collect()
        self.executors = sorted({(r.host, int(r.pid), int(r.nice)) for r in rows})

    def take_back(self, spark: Any) -> None:
        """The writer's priority, for the driver and then its executors (one small job): when the
        standby is READY, so the handoff finds green whole and blue alone on the cores it needed."""
        if self.driver is not None:
            take_back(*self.driver)
            self.driver = None
        if not self.executors:
            return
        executors, self.executors = self.executors, []

        def task(batches: Any) -> Any:
            import socket

            from relay.spark.standby_priority import jvm_above, take_back

            for _ in batches:
                pass
            here = socket.gethostname(), jvm_above()
            for host, pid, original in executors:
                if (host, pid) == here:
                    take_back(pid, original)
            yield from ()

        n = max(int(spark.sparkContext.defaultParallelism), 1) * 2
        try:
            spark.range(0, n, 1, n).mapInArrow(task, "id long").count()
        except Exception as exc:  # noqa: BLE001 - best effort: the executors stay lowered, logged
            log.warning("could not take the executors' priority back: %s", exc)
