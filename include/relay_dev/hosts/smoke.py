"""Checks of a namespace cluster run ON one of its hosts (normally the client), printing JSON.

``python -m relay_dev.hosts.smoke master|spark-app|kafka|postgres [...]``, with the RELAY_* settings
of the host (``ClusterInfo.client_env``). Why a command and not a function: it proves the client
host reaches the master, the REST server, the broker and the ledger over the namespace network,
with Relay's own clients, exactly as Relay's CLI on that host would.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import requests
from relay.config import RelayConfig, load_config
from relay.errors import SparkError
from relay.polling import poll
from relay.spark.driver_properties import driver_environment, driver_properties
from relay.spark.launcher import spark_client
from relay.spark.rest import MasterState, SparkStandaloneClient


def _emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


def master(cfg: RelayConfig) -> dict[str, Any]:
    """The master's ``/json/`` as the client reads it: status and workers (address, state, size)."""
    client = spark_client(cfg)
    state = poll(client.master_state, 60, transient=(SparkError,))  # a loaded machine: one slow answer
    assert state is not None
    workers = [
        {"host": w.host, "state": w.state, "cores": w.cores, "memory_mb": w.memory_mb, "webui": w.webui}
        for w in state.workers
    ]
    return {"status": state.status, "url": state.url, "workers": workers}


def host_neutral_properties(cfg: RelayConfig, name: str, host_local: Path) -> dict[str, str]:
    """sparkProperties of a driver that may land on any worker: no client address, no client folder.

    The driver and executors inherit SPARK_LOCAL_IP from the worker that starts them; scratch,
    sockets and Java temp files go to ``host_local``, the path every host mounts over its own folder.
    """
    spark = host_local / "spark"
    java_opts = f"-Djava.io.tmpdir={spark / 'tmp'} -XX:-UsePerfData"
    props = driver_properties(cfg, name, supervise=False, py_files=[])
    for key in ("spark.driverEnv.SPARK_LOCAL_IP", "spark.executorEnv.SPARK_LOCAL_IP"):
        props.pop(key, None)
    props.update(
        {
            "spark.local.dir": str(spark / "local"),
            "spark.python.unix.domain.socket.dir": str(spark / "sock"),
            "spark.driver.extraJavaOptions": java_opts,
            "spark.executor.extraJavaOptions": java_opts,
            "spark.driver.memory": "512m",
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",  # one executor per worker (the master spreads them out)
        }
    )
    return props


def executor_hosts(state: MasterState, app_id: str) -> list[str]:
    """Addresses of the workers running an executor of ``app_id`` (each worker's ``/json/``)."""
    hosts = []
    for worker in state.workers:
        if worker.state != "ALIVE" or not worker.webui:
            continue
        raw = requests.get(f"{worker.webui.rstrip('/')}/json/", timeout=10).json()
        if any(e.get("appid") == app_id for e in raw.get("executors", [])):
            hosts.append(worker.host)
    return sorted(hosts)


def spark_app(
    cfg: RelayConfig, app: Path, host_local: Path, seconds: int, timeout_s: float
) -> dict[str, Any]:
    """Submit ``app`` in cluster mode through the REST server; wait for executors on every worker;
    kill it through REST (also when waiting failed) and wait until its driver is final."""
    name = f"hosts-smoke-{secrets.token_hex(3)}"
    client = spark_client(cfg)
    env = {k: v for k, v in driver_environment(cfg).items() if k != "SPARK_LOCAL_IP"}
    t0 = time.monotonic()
    props = host_neutral_properties(cfg, name, host_local)
    submission = client.submit_python(str(app), [str(seconds)], props, env)
    deadline = t0 + timeout_s
    found: dict[str, Any] = {}
    try:

        def everywhere() -> bool | None:
            try:
                return _executors_everywhere(client, submission, name, found) or None
            except (SparkError, requests.RequestException) as exc:  # a loaded machine: poll again
                found["last_error"] = f"{type(exc).__name__}: {exc}"
                return None

        poll(everywhere, deadline - time.monotonic())
        found["seconds_to_executors"] = round(time.monotonic() - t0, 2)
    finally:
        found["killed"] = client.kill(submission)
        final = client.driver_status(submission)

        def ended() -> bool | None:
            nonlocal final
            final = client.driver_status(submission)
            return True if final.is_final else None

        if not final.is_final:
            poll(ended, deadline + 60 - time.monotonic())
    return {"submission": submission, "name": name, **found, "final_state": final.value}


def _executors_everywhere(
    client: SparkStandaloneClient, submission: str, name: str, found: dict[str, Any]
) -> bool:
    """Update ``found`` (app id, executor and driver hosts); True once every live worker has one."""
    state = client.master_state()
    apps = [a for a in state.active_apps if a.name == name]
    if not apps:
        return False
    hosts = executor_hosts(state, apps[0].id)
    driver = state.driver(submission)
    worker = next((w for w in state.workers if driver and w.id == driver.worker), None)
    found.update(app_id=apps[0].id, executor_hosts=hosts, driver_host=worker.host if worker else "")
    alive = sorted(w.host for w in state.workers if w.state == "ALIVE")
    return len(hosts) >= 2 and hosts == alive


def kafka(cfg: RelayConfig, count: int, timeout_s: float) -> dict[str, Any]:
    """Create a topic, produce ``count`` records and read them back, all from this host."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from relay.kafka.offsets import KafkaOffsets

    topic = f"hosts-smoke-{secrets.token_hex(3)}"
    t0 = time.monotonic()
    with KafkaOffsets(cfg.kafka_bootstrap) as offsets:
        offsets.ensure_topic(topic, 2)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap)
    sent = [f"record-{i}".encode() for i in range(count)]
    for value in sent:
        producer.send(topic, value=value)
    producer.flush(timeout=timeout_s)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=cfg.kafka_bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in (0, 1)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += [r.value for r in records]
    consumer.close()
    return {
        "topic": topic,
        "produced": count,
        "consumed": len(got),
        "same": sorted(got) == sorted(sent),
        "seconds": round(time.monotonic() - t0, 2),
    }


def postgres(cfg: RelayConfig) -> dict[str, Any]:
    """Create the ledger on the ledger host; report both ends of the connection as the server sees them."""
    from relay.ledger.engine import create_ledger, make_engine
    from sqlalchemy import text

    created = create_ledger(cfg.ledger_url)
    engine = make_engine(cfg.ledger_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT host(inet_server_addr()), host(inet_client_addr()), version()")
            ).one()
    finally:
        engine.dispose()
    return {"created": created, "server_addr": row[0], "client_addr": row[1], "version": row[2]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="relay_dev.hosts.smoke")
    sub = parser.add_subparsers(dest="check", required=True)
    sub.add_parser("master")
    app = sub.add_parser("spark-app")
    app.add_argument("app", type=Path)
    app.add_argument("--host-local", type=Path, required=True)
    app.add_argument("--seconds", type=int, default=300)
    app.add_argument("--timeout", type=float, default=180)
    kaf = sub.add_parser("kafka")
    kaf.add_argument("--count", type=int, default=10)
    kaf.add_argument("--timeout", type=float, default=60)
    sub.add_parser("postgres")
    args = parser.parse_args(argv)
    cfg = load_config()
    if args.check == "master":
        _emit(master(cfg))
    elif args.check == "spark-app":
        _emit(spark_app(cfg, args.app, args.host_local, args.seconds, args.timeout))
    elif args.check == "kafka":
        _emit(kafka(cfg, args.count, args.timeout))
    else:
        _emit(postgres(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
