"""A class-data-sharing archive of Spark's classes, so driver and executor JVMs start faster.

A Spark JVM spends its first seconds loading and verifying thousands of classes from the jars. A
dynamic AppCDS archive (JDK 13+: ``-XX:ArchiveClassesAtExit`` once, then ``-XX:SharedArchiveFile``)
maps them ready-made: a local session's start and first job took 3.8-4.0 s instead of 6.1-6.7 s
here. The archive is made once per Spark and Java version by a tiny local job under the project's
data folder, shared by every stack of the checkout, and only ever appears whole (written under
another name, then renamed): the JVM crashes on a truncated archive, while a missing or mismatched
one only disables sharing. ``RELAY_CLASS_ARCHIVE=off`` leaves it out.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from relay.config import PROJECT_ROOT
from relay.errors import StackError
from relay.spark.install import spark_home

ARCHIVE_DIR = PROJECT_ROOT / "var" / "cds"
WARM_UP = """
from pyspark.sql import SparkSession
s = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
s.range(100).selectExpr("id % 3 AS k", "id AS v").groupBy("k").sum("v").collect()
s.stop()
"""


@functools.cache
def _java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stderr.strip()


@functools.cache
def archive_path() -> Path:
    """Where the archive of this Spark and this Java lives (named by both)."""
    import pyspark

    key = hashlib.sha256(f"{pyspark.__version__}|{spark_home()}|{_java_version()}".encode()).hexdigest()
    return ARCHIVE_DIR / f"spark-{pyspark.__version__}-{key[:12]}.jsa"


def enabled() -> bool:
    return os.environ.get("RELAY_CLASS_ARCHIVE", "on").lower() not in ("off", "0", "false", "no")


def java_option(path: Path | None = None) -> str:
    """``-XX:SharedArchiveFile=...`` when the archive exists (and is wanted), else nothing."""
    if not enabled():
        return ""
    try:
        path = path or archive_path()
    except (ImportError, StackError):  # a submitter without Spark: the drivers start without it
        return ""
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""


def ensure_archive(spark_tmp: Path, progress: Callable[[str], None] = lambda _: None) -> Path | None:
    """Make the archive when it is missing (about 10 s, once); None when it can't be made."""
    if not enabled():
        return None
    path = archive_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    spark_tmp.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".partial-", suffix=".jsa", dir=path.parent)
    os.close(fd)
    os.unlink(partial)  # the JVM writes it at exit
    with tempfile.TemporaryDirectory(dir=spark_tmp) as work:
        script = Path(work) / "warm_up.py"
        script.write_text(WARM_UP)
        opts = f"-XX:ArchiveClassesAtExit={partial} -Djava.io.tmpdir={work}"
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--driver-java-options", opts, str(script)]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_DIRS": work, "TMPDIR": work}
        progress("making the JVMs' class archive (once per Spark and Java version)")
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    if done.returncode != 0 or not Path(partial).is_file():
        Path(partial).unlink(missing_ok=True)
        progress(f"no class archive (JVMs start without it): {done.stderr.strip()[-300:]}")
        return None
    os.replace(partial, path)  # whole or not at all: a truncated archive crashes the JVM
    return path
