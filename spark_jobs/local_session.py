"""A local-mode SparkSession for local drivers, tests and benchmarks: ``relay.spark.local``'s, with
Spark's shuffle partitions at 2 (the small local jobs these run); and the checkpoint settings every
Relay driver's session gets (``CHECKPOINT_CONF``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relay.spark.local import local_session as _local_session

# A Relay checkpoint is a local folder (``RelayConfig.checkpoints_dir``). Spark's default manager
# (FileContext) runs `readlink` and `chmod` processes for every offsets/N and commits/N it writes
# (no native Hadoop library): 33-41 ms a write against 8-9 ms through the FileSystem API, whose
# rename on a local disk is the same check-then-rename, CRC files kept (issue #31: two per batch).
CHECKPOINT_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


def local_session(app_name: str, work_dir: Path, memory: str = "768m", cores: int = 2) -> Any:
    return _local_session(
        app_name, work_dir, memory, cores, {"spark.sql.shuffle.partitions": "2", **CHECKPOINT_CONF}
    )
