"""A local-mode SparkSession that keeps every scratch file in one folder (never /tmp).

Spark writes scratch dirs, unix sockets, JVM temp and perf files, and pyspark's gateway hand-shake
files (Python's tempfile, so TMPDIR) by default under /tmp: each is pointed into ``work_dir``. Used
by local drivers, tests and benchmarks (``spark_jobs/local_session.py``) and by the audit's
re-evaluation of a transform; pyspark is imported only when a session is made.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def local_session(
    app_name: str,
    work_dir: Path,
    memory: str = "768m",
    cores: int = 2,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """A ``local[cores]`` session on loopback, no UI, its scratch under ``work_dir``."""
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
    settings = {
        "spark.driver.memory": memory,
        "spark.pyspark.python": sys.executable,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.local.dir": str(work_dir / "local"),
        "spark.python.unix.domain.socket.dir": str(work_dir / "sock"),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={work_dir / 'tmp'} -XX:-UsePerfData",
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        **(conf or {}),
    }
    builder = builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
