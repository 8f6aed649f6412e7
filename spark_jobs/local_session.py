"""A local-mode SparkSession for local drivers, tests and benchmarks: ``relay.spark.local``'s, with
Spark's shuffle partitions at 2 (the small local jobs these run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relay.spark.local import local_session as _local_session


def local_session(app_name: str, work_dir: Path, memory: str = "768m", cores: int = 2) -> Any:
    return _local_session(app_name, work_dir, memory, cores, {"spark.sql.shuffle.partitions": "2"})
