"""A local-mode SparkSession that keeps every scratch file in one folder (never /tmp).

Spark writes scratch dirs, unix sockets, JVM temp and perf files, and pyspark's gateway hand-shake
files (Python's tempfile, so TMPDIR) by default under /tmp: each is pointed into ``work_dir``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def local_session(app_name: str, work_dir: Path, memory: str = "768m", cores: int = 2) -> Any:
    from pyspark.sql import SparkSession

    work_dir = Path(work_dir).resolve()
    for sub in ("local", "sock", "tmp"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(work_dir / "tmp")
    tempfile.tempdir = None  # re-read TMPDIR
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run this interpreter (its venv has pyarrow), not whatever python3 is on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder
    if os.environ.get("PYTHONPATH"):
        # Python workers take it from the session's conf too: the JVM (and its environment) may
        # have been started by an earlier session of this process, before PYTHONPATH was set.
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    return (
        builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.driver.memory", memory)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(work_dir / "local"))
        .config("spark.python.unix.domain.socket.dir", str(work_dir / "sock"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={work_dir / 'tmp'} -XX:-UsePerfData")
        .config("spark.sql.warehouse.dir", str(work_dir / "warehouse"))
        .getOrCreate()
    )
