"""A version's transform re-evaluated in a local Spark session over input records read from Kafka.

Why Spark: a transform is the user's DataFrame code, and only Spark evaluates it as the pipeline
did. Why local: the audit runs where ``relay audit`` runs (no cluster, no submission); scratch files
go under the data folder, never /tmp. The input DataFrame has Spark's Kafka source schema (the
pipeline's ``kafka_source.KAFKA_SCHEMA``), built from an Arrow table. pyspark and pyarrow are
imported inside functions only: ``relay`` must stay importable without them.

A stateless transform ran on each micro-batch; here it runs over all of a version's applied records
at once. That is the same output for a transform that maps or filters each record (what the Kafka
and upsert sinks' contract needs: every output row keeps its record's source position); a transform
whose output for a record depends on others of its micro-batch (dropDuplicates, limit) may differ.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from relay.audit.sink_report import SinkAuditError
from relay.pipeline import Pipeline
from relay.spark.local import local_session

KAFKA_DDL = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "timestampType INT"
)
Progress = Callable[[str], None]


class InputRecords:
    """Input records as columns of Spark's Kafka source schema."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.columns: dict[str, list[Any]] = {
            n: [] for n in ("key", "value", "partition", "offset", "timestamp", "timestampType")
        }

    def add(self, partition: int, record: Any) -> None:
        """A kafka-python ConsumerRecord of ``partition``."""
        c = self.columns
        c["key"].append(record.key)
        c["value"].append(record.value)
        c["partition"].append(partition)
        c["offset"].append(record.offset)
        c["timestamp"].append(record.timestamp * 1000)  # ms -> us
        c["timestampType"].append(max(record.timestamp_type, 0))

    def __len__(self) -> int:
        return len(self.columns["offset"])

    def sources(self) -> Iterator[tuple[int, int]]:
        return zip(self.columns["partition"], self.columns["offset"], strict=True)

    def timestamps_us(self) -> tuple[int, int]:
        """(oldest, newest) record timestamp in microseconds."""
        ts = self.columns["timestamp"]
        return (min(ts), max(ts)) if ts else (0, 0)

    def table(self, since_us: int | None = None, until_us: int | None = None) -> Any:
        """A pyarrow Table (only the records timestamped in ``[since_us, until_us]`` if given)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        c, n = self.columns, len(self)
        table = pa.table(
            {
                "key": pa.array(c["key"], pa.binary()),
                "value": pa.array(c["value"], pa.binary()),
                "topic": pa.array([self.topic] * n, pa.string()),
                "partition": pa.array(c["partition"], pa.int32()),
                "offset": pa.array(c["offset"], pa.int64()),
                "timestamp": pa.array(c["timestamp"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                "timestampType": pa.array(c["timestampType"], pa.int32()),
            }
        )
        ts = table["timestamp"].cast(pa.int64())
        if since_us is not None:
            table = table.filter(pc.greater_equal(ts, since_us))
            ts = table["timestamp"].cast(pa.int64())
        if until_us is not None:
            table = table.filter(pc.less_equal(ts, until_us))
        return table


class LocalSpark:
    """One local Spark session for the whole audit, started on first use."""

    def __init__(self, work_dir: Path, progress: Progress, cores: int = 2, memory: str = "1g") -> None:
        self.work_dir = Path(work_dir).resolve()
        self.progress = progress
        self.cores, self.memory = cores, memory
        self._spark: Any = None
        self._tmpdir: str | None = None  # the process's TMPDIR before the session, restored on close
        self.started_s = 0.0

    def session(self) -> Any:
        if self._spark is None:
            t0 = time.perf_counter()
            self._tmpdir = os.environ.get("TMPDIR")
            self.progress("sink audit: starting a local Spark session to re-evaluate the transform")
            self._spark = _session(self.work_dir, self.cores, self.memory)
            self._spark.sparkContext.setLogLevel("ERROR")
            self.started_s = time.perf_counter() - t0
        return self._spark

    def run(
        self, pipeline: Pipeline, package: str, table: Any, columns: Sequence[str] | None
    ) -> tuple[list[str], Iterator[tuple]]:
        """The transform's output over ``table``: its columns (``columns``, else all) and rows."""
        from pyspark import cloudpickle

        spark = self.session()
        cloudpickle.register_pickle_by_value(sys.modules[package])  # UDFs need no import on workers
        try:
            out = pipeline.transform(spark.createDataFrame(table))
            names = list(out.columns if columns is None else columns)
            lacking = [c for c in names if c not in out.columns]
        except Exception as exc:  # noqa: BLE001 - the user's code
            raise SinkAuditError(
                f"the transform of {pipeline.name} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if lacking:
            raise SinkAuditError(f"the transform of {pipeline.name} has no column(s) {lacking}")
        rows = (tuple(r) for r in out.select(*names).toLocalIterator(prefetchPartitions=True))
        return names, rows

    def close(self) -> None:
        """Stop the session and give the process its TMPDIR back (a long scratch path left behind
        broke a later Chromium, whose socket path in TMPDIR has to fit 107 bytes)."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None
            if self._tmpdir is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = self._tmpdir
            tempfile.tempdir = None


def _session(work_dir: Path, cores: int, memory: str) -> Any:
    """A local session whose scratch stays in ``work_dir``, times in UTC (Kafka's timestamps)."""
    return local_session("relay-audit", work_dir, memory, cores, {"spark.sql.session.timeZone": "UTC"})
