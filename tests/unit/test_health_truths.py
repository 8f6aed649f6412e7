"""Every health finding's level per situation, in one table (issue: health that pages wrongly or not at all).

Each row builds its situation on a real SQLite ledger through the commit protocol, with the master's
and Kafka's views given (Airflow's is a real HTTP server in the two Airflow rows), then checks the level
of the findings an operator would be paged on. A row that pages is CRITICAL or WARN overall.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from relay.config import RelayConfig
from relay.errors import KafkaError
from relay.health import Level, run_health
from relay.ledger.models import AttemptState, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import Inventory

from tests.conftest import free_port
from tests.unit.health_support import (
    FakeKafka,
    app,
    batch,
    fake_kafka,
    make_config,
    new_instance,
    open_ledger,
    running,
)

OK, WARN, CRIT = Level.OK, Level.WARN, Level.CRITICAL


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    return make_config(tmp_path)


@pytest.fixture()
def ledger(config: RelayConfig) -> Iterator[Ledger]:
    yield from open_ledger(config)


@pytest.fixture()
def kafka(monkeypatch: pytest.MonkeyPatch) -> type[FakeKafka]:
    return fake_kafka(monkeypatch)


def committed(ledger: Ledger, kafka: type[FakeKafka], waiting: int = 0):
    """An instance that committed [0, 10) on both partitions; ``waiting`` records produced after."""
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 10, 1: 10})
    kafka.latest_offsets = {0: 10 + waiting, 1: 10}
    return inst, att


def stopped(ledger: Ledger, kafka: type[FakeKafka], graceful: bool, asked: bool = True):
    inst, att = committed(ledger, kafka, waiting=500)
    if asked:
        ledger.request_stop(inst.id)
    ledger.end_attempt(att.id, AttemptState.STOPPED if graceful else AttemptState.FENCED)
    ledger.set_instance(inst.id, state=InstanceState.STOPPED if graceful else InstanceState.FENCED)
    return inst


# --------------------------------------------------------------------------------------- situations
def running_caught_up(ledger, kafka, config):
    inst, _ = committed(ledger, kafka)
    return {"inventory": running(ledger, inst)}


def stopped_on_purpose(ledger, kafka, config):
    stopped(ledger, kafka, graceful=True)
    return {"inventory": Inventory()}


def stopped_on_purpose_by_fencing(ledger, kafka, config):
    stopped(ledger, kafka, graceful=False)  # the driver did not stop in time: `relay stop` fenced it
    return {"inventory": Inventory()}


def stop_in_progress(ledger, kafka, config):
    inst = stopped(ledger, kafka, graceful=True)  # the ledger says STOPPED, the application is finishing
    return {"inventory": Inventory(apps=[app(inst.id)])}


def crashed_with_lag(ledger, kafka, config):
    stopped(ledger, kafka, graceful=True, asked=False)  # ended without anyone asking
    return {"inventory": Inventory()}


def master_restart_while_committing(ledger, kafka, config):
    inst, _ = committed(ledger, kafka)
    return {"inventory": Inventory(live=[ledger.instance(inst.id)], master_error="connection refused")}


def master_down_and_no_commit(ledger, kafka, config):
    inst, _ = committed(ledger, kafka)
    inventory = Inventory(live=[ledger.instance(inst.id)], master_error="connection refused")
    return {"inventory": inventory, "now": time.time() + 600}


def beat(ledger: Ledger, attempt_id: int, at: float) -> None:
    """The attempt's heartbeat at ``at`` (a running driver beats every second)."""
    from relay.ledger import schema as s

    with ledger.tx() as conn:
        conn.execute(s.attempts.update().where(s.attempts.c.id == attempt_id).values(heartbeat_at=at))


def one_off_delete_records(ledger, kafka, config):
    inst, att = committed(ledger, kafka, waiting=100)
    kafka.retention_ms = 7 * 24 * 3600 * 1000
    t0 = time.time()
    run_health(config, ledger, inventory=running(ledger, inst), now=t0)  # the earlier report (history)
    kafka.earliest_offsets = {0: 9, 1: 9}  # delete_records moved the earliest offset once, just below
    kafka.latest_offsets = {0: 110, 1: 10}
    kafka.record_ms = {0: int((t0 + 290) * 1000)}  # the record at the cursor is 10 s old
    beat(ledger, att.id, t0 + 299)
    return {"inventory": running(ledger, inst), "now": t0 + 300}


def driver_relaunched_after_its_worker_died(ledger, kafka, config):
    """The worker took the driver with it; supervision relaunched it: a new attempt, no batch yet."""
    inst, att = committed(ledger, kafka, waiting=100)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))  # supersedes the dead one
    return {"inventory": running(ledger, inst)}


def driver_silent(ledger, kafka, config):
    """The driver stopped beating 30 s ago (its host lost, or the process stopped): the master has not
    noticed yet."""
    inst, att = committed(ledger, kafka)
    beat(ledger, att.id, time.time() - 30)
    return {"inventory": running(ledger, inst)}


def kafka_unreachable(ledger, kafka, config):
    inst, _ = committed(ledger, kafka)

    def refuse(*_a, **_k):
        raise KafkaError("cannot reach Kafka at 127.0.0.1:1")

    kafka.earliest = refuse  # type: ignore[method-assign]
    return {"inventory": running(ledger, inst)}


def airflow_whole(ledger, kafka, config):
    inst, _ = committed(ledger, kafka)
    return {"inventory": running(ledger, inst), "airflow": dict.fromkeys(AIRFLOW_PARTS, "healthy")}


def airflow_triggerer_dead(ledger, kafka, config):
    inst, _ = committed(ledger, kafka)
    parts = dict.fromkeys(AIRFLOW_PARTS, "healthy") | {"triggerer": "unhealthy"}
    return {"inventory": running(ledger, inst), "airflow": parts}


def airflow_down(ledger, kafka, config):
    inst, _ = committed(ledger, kafka)
    return {"inventory": running(ledger, inst), "airflow": None}


AIRFLOW_PARTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")

# situation -> the level of each named check, and whether the report pages (overall not OK)
TABLE: list[tuple[Callable, dict[str, Level], bool]] = [
    (running_caught_up, {"single_instance": OK, "progress": OK, "lag": OK, "driver": OK}, False),
    (stopped_on_purpose, {"single_instance": OK, "progress": OK, "lag": OK, "driver": OK}, False),
    (stopped_on_purpose_by_fencing, {"single_instance": OK, "progress": OK, "driver": OK}, False),
    (stop_in_progress, {"single_instance": OK, "progress": OK}, False),
    (crashed_with_lag, {"single_instance": OK, "progress": CRIT}, True),
    (master_restart_while_committing, {"single_instance": WARN, "progress": OK}, True),
    (master_down_and_no_commit, {"single_instance": CRIT}, True),
    (one_off_delete_records, {"retention": OK, "driver": OK}, False),
    (driver_relaunched_after_its_worker_died, {"driver": WARN, "single_instance": OK}, True),
    (driver_silent, {"driver": WARN}, True),
    (kafka_unreachable, {"kafka": CRIT}, True),
    (airflow_whole, {"airflow": OK}, False),
    (airflow_triggerer_dead, {"airflow": CRIT}, True),
    (airflow_down, {"airflow": CRIT}, True),
]


@pytest.mark.parametrize(("situation", "levels", "pages"), TABLE, ids=[row[0].__name__ for row in TABLE])
def test_each_finding_has_the_level_its_situation_deserves(situation, levels, pages, config, ledger, kafka):
    given = situation(ledger, kafka, config)
    airflow_url = None
    server = None
    if "airflow" in given:
        server, airflow_url = _airflow(given["airflow"])
    try:
        report = run_health(
            config, ledger, inventory=given["inventory"], now=given.get("now"), airflow_url=airflow_url
        )
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    found = {name: report.check(name).level for name in levels}
    assert found == levels, report.summary()
    assert (report.status is not Level.OK) == pages, report.summary()


def test_a_stopped_pipeline_says_so_and_how_to_start_it(config, ledger, kafka):
    stopped(ledger, kafka, graceful=True)
    report = run_health(config, ledger, inventory=Inventory())
    assert report.data["run_state"] == "STOPPED" and not report.down
    assert "STOPPED on purpose" in report.check("single_instance").message
    assert "500 record(s) wait" in report.check("lag").message


def test_a_stopped_pipeline_is_not_paged_for_the_latency_of_its_last_batches(config, ledger, kafka):
    """Seen on a slow host: a pipeline stopped on purpose paged latency WARN, its last batches having
    taken over the 1 s floor. Running, the same batches are a finding; stopped, they are history."""
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 10, 1: 10}, started_at=time.time() - 3)
    batch(ledger, att, 1, {0: 10, 1: 10}, {0: 20, 1: 10}, started_at=time.time() - 3)
    kafka.latest_offsets = {0: 20, 1: 10}
    while_running = run_health(config, ledger, inventory=running(ledger, inst))
    assert while_running.check("latency").level is Level.WARN, while_running.summary()

    ledger.request_stop(inst.id)
    ledger.end_attempt(att.id, AttemptState.STOPPED)
    ledger.set_instance(inst.id, state=InstanceState.STOPPED)
    report = run_health(config, ledger, inventory=Inventory())
    assert report.data["run_state"] == "STOPPED"
    latency = report.check("latency")
    assert latency.level is Level.OK and "stopped on purpose" in latency.message, latency.message
    assert latency.data["duration_ms"]["median"] >= 2900  # the figures are still reported
    assert report.status is Level.OK, report.summary()


def _airflow(components: dict[str, str] | None) -> tuple[ThreadingHTTPServer | None, str]:
    """A real HTTP server answering Airflow's monitor/health with ``components``; None: nothing listens."""
    if components is None:
        return None, f"http://127.0.0.1:{free_port()}"
    body = json.dumps({c: {"status": s} for c, s in components.items()}).encode()

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/api/v2/monitor/health" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_airflow_is_checked_when_the_stack_runs_it(config, ledger, kafka, monkeypatch):
    inst, _ = committed(ledger, kafka)
    assert "airflow" not in [
        c.name for c in run_health(config, ledger, inventory=running(ledger, inst)).checks
    ]
    programs = config.data_dir / "supervisor" / "programs"
    programs.mkdir(parents=True)
    (programs / "airflow-scheduler.conf").write_text("[program:airflow-scheduler]\n")  # `relay stack up`
    monkeypatch.setattr(RelayConfig, "airflow_url", property(lambda self: f"http://127.0.0.1:{free_port()}"))
    report = run_health(config, ledger, inventory=running(ledger, inst))
    assert report.check("airflow").level is CRIT and "does not answer" in report.check("airflow").message
