"""Start the driver's Python planner processes while the driver loads its pipeline.

Why (issue #31, a start's seconds): Spark runs a Python data source's driver-side steps in Python
processes it starts on first use, one daemon per step (``pyspark.daemon`` importing pyspark and the
step's module, then a forked worker): ``create_data_source`` when the query's source is loaded,
``plan_data_source_read`` when its first batch is planned. Started on the critical path, one after
the other on two busy cores, each cost 1.3-1.7 s of a start (a CPU sampler beside ``relay bench
--only recovery``). Spark keeps each daemon, and returns each finished worker to an idle pool it
reuses (``spark.python.worker.reuse``), keyed by the step's module: a tiny batch source loaded and
planned here, in a thread right after the session is up, starts both while the driver imports and
checks the pipeline, so the real source finds them started. Nothing runs on the executors
(``rdd.getNumPartitions`` plans the read without a job). Only an optimisation: if it fails, the
query starts them itself, as before.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

log = logging.getLogger("relay.job")

NAME = "relay_planner_warm_up"


class PlannerWarmUp(DataSource):
    """One row, one partition: what it takes to run Spark's two planner steps once."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "id int"

    def reader(self, schema: Any) -> DataSourceReader:
        return _OneRow()


class _OneRow(DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (0,)


def warm_planners(spark: Any) -> float:
    """Load and plan :class:`PlannerWarmUp` once; the seconds it took."""
    from kafka_source_options import spare_data_source_lookup
    from pyspark import cloudpickle

    started = time.monotonic()
    # The planner processes cannot import this module (see kafka_source.register): by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spare_data_source_lookup(spark)  # before the first registration, as kafka_source.register does
    spark.dataSource.register(PlannerWarmUp)
    spark.read.format(NAME).load().rdd.getNumPartitions()  # create_data_source, plan_data_source_read
    return time.monotonic() - started


def warm_planners_in_background(spark: Any) -> threading.Thread:
    """:func:`warm_planners` in a daemon thread; never fails the attempt."""

    def run() -> None:
        try:
            log.info("driver's Python planners started ahead of the query in %.2f s", warm_planners(spark))
        except Exception as exc:  # noqa: BLE001 - the query starts them itself
            log.info("driver's Python planners not started ahead of the query: %s", exc)

    thread = threading.Thread(target=run, name="relay-warm-planners", daemon=True)
    thread.start()
    return thread
