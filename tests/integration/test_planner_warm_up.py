"""The driver's planner warm-up (issue #31: a start's seconds) with a real broker and local Spark.

What a user would check: the Python processes the warm-up starts are the ones Relay's Kafka source
then uses, so its first batch does not start them again. After ``warm_planners`` the driver's JVM
has one ``create_data_source`` daemon and one ``plan_data_source_read`` daemon; a query on Relay's
source then loads, plans and reads its first batch (every record) and the JVM still has exactly
those two daemons, the same processes. The script runs in a Python process of its own, so the JVM
and its daemons are the test's alone.
"""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaProducer
from relay.config import RelayConfig
from relay.kafka.offsets import KafkaOffsets

from tests.integration.conftest import private_data_dir
from tests.integration.helpers import script_result

pytestmark = pytest.mark.integration

RECORDS = 40

SCRIPT = r"""
import json, os, sys, threading
from pathlib import Path
from local_session import local_session
import kafka_source
from planner_warm_up import warm_planners

MODULES = ("pyspark.sql.worker.create_data_source", "pyspark.sql.worker.plan_data_source_read")


def daemons(jvm_pid):
    # the JVM's own children running pyspark.daemon for a planner module: {module: [pid, ...]}
    found = {m: [] for m in MODULES}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        args = [a.decode() for a in cmd if a]
        if ppid == jvm_pid and "pyspark.daemon" in args and args[-1] in found:
            found[args[-1]].append(int(pid))
    return {m: sorted(p) for m, p in found.items()}


spark = local_session("test_planner_warm_up", Path(sys.argv[1]))
jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
before = daemons(jvm_pid)
seconds = warm_planners(spark)
warmed = daemons(jvm_pid)

kafka_source.register(spark)
rows, done = [], threading.Event()


def batch(df, batch_id):
    rows.extend(r.offset for r in df.select("offset").collect())
    if len(rows) >= int(sys.argv[4]):
        done.set()


query = (
    spark.readStream.format("relaykafka")
    .option("kafka.bootstrap.servers", sys.argv[2])
    .option("subscribe", sys.argv[3])
    .option("startingOffsets", "earliest")
    .load()
    .writeStream.foreachBatch(batch)
    .option("checkpointLocation", str(Path(sys.argv[1]) / "checkpoint"))
    .start()
)
finished = done.wait(180)
query.stop()
after = daemons(jvm_pid)
print("RESULT " + json.dumps(
    {"before": before, "warmed": warmed, "after": after, "rows": sorted(rows), "finished": finished,
     "seconds": seconds}
))
spark.stop()
"""


def test_the_warm_up_starts_the_planner_processes_the_first_batch_then_uses(stack: RelayConfig) -> None:
    topic = f"planner-warm-up-{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(stack.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, 2)
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
    try:
        for i in range(RECORDS):
            producer.send(topic, value=str(i).encode(), partition=i % 2)
        producer.flush(timeout=30)
    finally:
        producer.close()

    work = private_data_dir("planner-warm-up")
    result = script_result(SCRIPT, work, stack.kafka_bootstrap, topic, str(RECORDS))

    assert all(pids == [] for pids in result["before"].values()), result  # the check can see none
    warmed = result["warmed"]
    assert all(len(pids) == 1 for pids in warmed.values()), f"one daemon per planner step: {result}"
    assert result["finished"] and result["rows"] == sorted([*range(20), *range(20)]), result
    assert result["after"] == warmed, f"the query started planner processes of its own: {result}"
