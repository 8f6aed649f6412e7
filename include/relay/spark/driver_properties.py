"""What a cluster-mode Python driver is submitted with: its sparkProperties and its environment.

Kept apart from the REST client in ``relay.spark.rest``: REST submissions ignore
``spark-defaults.conf``, so every setting a driver needs (master, resources, scratch folders,
PYTHONPATH, loopback binding) is built here, once, for every caller that submits a driver.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from relay.config import PROJECT_ROOT, RelayConfig
from relay.crashpoints import forwarded_env
from relay.spark import class_archive


def driver_properties(
    config: RelayConfig,
    app_name: str,
    supervise: bool,
    py_files: list[str],
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """sparkProperties for a cluster-mode Python driver on the configured standalone cluster.

    Everything lives here because REST submissions ignore ``spark-defaults.conf``. Scratch, sockets
    and Java temp files go under ``config.spark_dir`` (never /tmp).
    """
    spark_dir = config.spark_dir
    for d in (spark_dir / "local", spark_dir / "sock", spark_dir / "tmp"):
        d.mkdir(parents=True, exist_ok=True)
    python = config.spark_python or sys.executable
    pythonpath = os.pathsep.join([str(PROJECT_ROOT / "include"), str(PROJECT_ROOT)])
    props = {
        "spark.master": config.spark_master_url,
        "spark.submit.deployMode": "cluster",
        "spark.app.name": app_name,
        "spark.driver.supervise": "true" if supervise else "false",
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.submit.pyFiles": ",".join(os.path.abspath(p) for p in py_files),
        **scratch_properties(spark_dir),
        "spark.driver.memory": config.driver_memory,  # the pipeline's resources (pipelines file)
        "spark.executor.memory": config.executor_memory,
        "spark.driver.cores": str(config.driver_cores),
        "spark.executor.cores": str(config.executor_cores),
        "spark.cores.max": str(config.cores_max),
        "spark.ui.port": "0",
        "spark.ui.killEnabled": "false",  # Relay stops drivers through the ledger and REST, not the UI
        "spark.sql.shuffle.partitions": "2",
        "spark.driverEnv.SPARK_LOCAL_IP": config.host,
        "spark.driverEnv.PYTHONPATH": pythonpath,
        "spark.driverEnv.RELAY_STANDBY_NICE": str(config.standby_nice),  # relay.spark.standby_priority
        "spark.executorEnv.SPARK_LOCAL_IP": config.host,
        "spark.executorEnv.PYTHONPATH": pythonpath,
    }
    for name, value in forwarded_env().items():  # tests only: armed crash points reach drivers and tasks
        props[f"spark.driverEnv.{name}"] = props[f"spark.executorEnv.{name}"] = value
    props.update({k: str(v) for k, v in (extra or {}).items()})
    return props


# A cluster-mode driver's JVM compiles with C1 only. It plans micro-batches and moves no records, so
# C2's faster code buys it little, while C2 compiled for ~6.5 of its first 25 CPU-seconds (measured
# per thread, `relay bench --only pipeline`), on the cores its executors start on. Executors keep
# the default tiered compilation: their C2 code doubles the records per CPU-second.
DRIVER_JIT_OPTS = "-XX:TieredStopAtLevel=1"


def scratch_properties(spark_dir: Path) -> dict[str, str]:
    """Where drivers and executors put scratch, sockets and Java temp files: ``local``, ``sock`` and
    ``tmp`` under ``spark_dir`` (never /tmp)."""
    java_opts = (
        f"-Djava.io.tmpdir={spark_dir / 'tmp'} -XX:-UsePerfData {class_archive.java_option()}".rstrip()
    )
    return {
        "spark.local.dir": str(spark_dir / "local"),
        "spark.python.unix.domain.socket.dir": str(spark_dir / "sock"),
        "spark.driver.extraJavaOptions": f"{java_opts} {DRIVER_JIT_OPTS}",
        "spark.executor.extraJavaOptions": java_opts,
    }


def driver_environment(config: RelayConfig) -> dict[str, str]:
    """environmentVariables of a submission: loopback binding and the project on PYTHONPATH."""
    return {
        "SPARK_LOCAL_IP": config.host,
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "include"), str(PROJECT_ROOT)]),
        "RELAY_STANDBY_NICE": str(config.standby_nice),
        **forwarded_env(),
    }
