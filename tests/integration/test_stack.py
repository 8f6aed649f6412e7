"""The embedded stack for real: health, Kafka offsets as the broker reports them, a cluster-mode
Python driver through the REST server, and a down() that stops every supervised part and
supervisord and leaves no process behind."""

from __future__ import annotations

import shutil
import stat
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer
from relay.config import RelayConfig, load_config
from relay.errors import KafkaError, StackError
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import highest_counter, produce
from relay.spark.auth import signer_for
from relay.spark.driver_properties import driver_environment, driver_properties
from relay.spark.rest import DriverState, SparkStandaloneClient
from relay_dev.pg_namespace import namespace_available
from relay_dev.stack import LocalStack, group_pids, pid_alive

from tests.conftest import wait_for
from tests.integration.conftest import private_data_dir, stack_env

pytestmark = pytest.mark.integration

APPS = Path(__file__).parent / "apps"


def test_stack_reports_every_part_healthy_and_up_is_idempotent(stack: RelayConfig) -> None:
    local = LocalStack(stack)
    status = local.status()
    assert status["healthy"], status
    assert [p["name"] for p in status["parts"]] == ["kafka", "spark-master", "spark-worker"]
    assert all(p["pid"] and pid_alive(p["pid"]) for p in status["parts"])
    assert all(p["state"] in ("STARTING", "RUNNING") for p in status["parts"]), status
    assert pid_alive(status["supervisor"]["pid"])
    again = local.up()
    assert [p["pid"] for p in again["parts"]] == [p["pid"] for p in status["parts"]]
    assert [p["restarts"] for p in again["parts"]] == [0, 0, 0]


def test_up_refuses_a_port_taken_by_someone_else(stack: RelayConfig) -> None:
    data_dir = private_data_dir("taken-")
    other = load_config({"RELAY_DATA_DIR": str(data_dir), "RELAY_KAFKA_PORT": str(stack.ports.kafka)})
    refused = LocalStack(other, health_timeout_s=5)
    with pytest.raises(StackError, match=str(stack.ports.kafka)):
        refused.up()
    assert not refused.supervisor.running(), "a refused up left a supervisord behind"
    shutil.rmtree(data_dir)


def test_kafka_offsets_follow_produce_delete_and_timestamps(stack: RelayConfig) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(stack.kafka_bootstrap) as kafka:
        assert kafka.ensure_topic(topic, 3, {"retention.ms": "3600000"}) is True
        assert kafka.ensure_topic(topic, 3) is False
        assert kafka.partitions(topic) == [0, 1, 2]
        assert kafka.earliest(topic) == kafka.latest(topic) == {0: 0, 1: 0, 2: 0}
        assert kafka.topic_config(topic)["retention.ms"] == "3600000"
        kafka.set_topic_config(topic, {"retention.ms": "7200000"})
        assert kafka.topic_config(topic)["retention.ms"] == "7200000"

        first = produce(stack.kafka_bootstrap, topic, 300, None, poison=2)
        assert (first["sent"], first["first"], first["last"], first["poison"]) == (300, 0, 299, 2)
        latest = kafka.latest(topic)
        assert sum(latest.values()) == 302
        second = produce(stack.kafka_bootstrap, topic, 10, None)
        assert (second["first"], second["last"]) == (300, 309)  # continues after the highest counter
        assert highest_counter(stack.kafka_bootstrap, topic) == 309

        kafka.delete_records(topic, {0: 5})
        assert kafka.earliest(topic)[0] == 5

        # offsets for a time: records stamped explicitly at base + i seconds, one partition
        producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
        base = int(time.time() * 1000) + 60_000
        start = kafka.latest(topic)[1]
        for i in range(5):
            producer.send(topic, key=b"t", value=b"t", partition=1, timestamp_ms=base + i * 1000)
        producer.flush()
        producer.close()
        found = kafka.offsets_for_time(topic, base + 2000)
        assert found[1] == start + 2
        assert kafka.offsets_for_time(topic, base + 3_600_000) == {0: None, 1: None, 2: None}

        with pytest.raises(KafkaError, match="does not exist"):
            kafka.partitions(f"missing-{uuid.uuid4().hex[:8]}")


def test_python_driver_submitted_through_rest_finishes(stack: RelayConfig) -> None:
    unsigned = SparkStandaloneClient(stack.spark_master_ui_url, stack.spark_rest_url)
    assert not unsigned.ready(), "the REST server requires a signed token"
    client = SparkStandaloneClient(stack.spark_master_ui_url, stack.spark_rest_url, signer=signer_for(stack))
    assert client.ready()
    props = driver_properties(stack, "relay-test-hello", supervise=False, py_files=[])
    sid = client.submit_python(str(APPS / "hello_driver.py"), ["ping"], props, driver_environment(stack))
    assert sid.startswith("driver-")
    wait_for("hello driver to finish", lambda: client.driver_status(sid).is_final, timeout=120, interval=0.5)
    assert client.driver_status(sid) is DriverState.FINISHED
    stdout = next((stack.spark_dir / "work").glob(f"{sid}/stdout")).read_text()
    assert "hello from relay test driver ['ping']" in stdout
    assert client.kill("driver-does-not-exist") is False
    assert client.driver_status("driver-does-not-exist") is DriverState.NOT_FOUND


def test_down_stops_every_recorded_process() -> None:
    """A second, private stack (with PostgreSQL) so the session stack stays up for other tests."""
    data_dir = private_data_dir("down-")
    env = stack_env(data_dir) | {"RELAY_WORKER_CORES": "1", "RELAY_WORKER_MEMORY": "512m"}
    local = LocalStack(load_config(env))
    try:
        status = local.up(with_postgres=True)
        pids = [p["pid"] for p in status["parts"]]
        supervisord = status["supervisor"]["pid"]
        assert status["healthy"] and all(pids) and pid_alive(supervisord)
        assert local.up()["parts"][-1]["name"] == "postgres"  # a later plain `up` keeps it
        sup = local.supervisor
        assert stat.S_IMODE(sup.folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(sup.conf_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(sup.socket.stat().st_mode) == 0o700
        assert "inet_http_server" not in sup.conf_file.read_text()
        if namespace_available(data_dir):  # PostgreSQL reaches its folder without traversing ours
            assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    finally:
        result = local.down()
    stopped = ["supervisor-keeper", "spark-worker", "spark-master", "kafka", "postgres"]
    assert [s["name"] for s in result["stopped"]] == stopped  # the keeper first: nothing comes back
    assert not any(pid_alive(pid) for pid in [*pids, supervisord])
    assert not any(group_pids(pid) for pid in pids)
    assert not local.supervisor.running()
    assert local.status()["healthy"] is False
    shutil.rmtree(data_dir)
