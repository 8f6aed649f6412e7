"""The collector: one scrape reads each pipeline's offsets, batches, instances, operations and last
health report, and yields Prometheus families named by its conventions (base units, ``_total``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select

from relay.config import RelayConfig
from relay.errors import RelayError
from relay.health.report import Level
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from relay.operations.status import offsets_view
from relay.operations.upgrade_state import ALL_TERMINAL

BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
Families = dict[str, GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]


def families() -> Families:
    g, c = GaugeMetricFamily, CounterMetricFamily
    part = ["pipeline", "topic", "partition"]
    return {
        "up": g(
            "relay_pipeline_up",
            "1 when the scrape could read the pipeline's ledger and Kafka",
            labels=["pipeline"],
        ),
        "lag": g("relay_lag_records", "records between the pipeline's cursor and Kafka's end", labels=part),
        "lag_s": g(
            "relay_lag_seconds", "age of the oldest unapplied record (last health check)", labels=part
        ),
        "margin": g("relay_retention_margin_records", "records between earliest and the cursor", labels=part),
        "cursor": g("relay_cursor_offset", "the next offset the pipeline applies", labels=part),
        "applied": c(
            "relay_applied_records", "records applied (written or skipped as written)", labels=["pipeline"]
        ),
        "batches": c("relay_batches", "micro-batches committed", labels=["pipeline"]),
        "dead": c("relay_dead_letters", "records sent to dead letters", labels=["pipeline"]),
        "instance": g(
            "relay_instance_info",
            "1 per instance of the last ten",
            labels=["pipeline", "instance", "version", "state", "role"],
        ),
        "live": g(
            "relay_instances_live", "live instances (an upgrade or a hot standby: 2)", labels=["pipeline"]
        ),
        "health": g(
            "relay_health_level",
            "last health check per finding: 0 OK, 1 WARN, 2 CRITICAL",
            labels=["pipeline", "check"],
        ),
        "health_at": g(
            "relay_health_timestamp_seconds", "when the last health check ran", labels=["pipeline"]
        ),
        "ops": c(
            "relay_operations",
            "ended operations by kind and end state",
            labels=["pipeline", "kind", "state"],
        ),
        "running": g(
            "relay_operations_in_progress",
            "operations in progress by kind and step",
            labels=["pipeline", "kind", "state"],
        ),
        "last_op": g(
            "relay_operation_last_timestamp_seconds",
            "when the newest operation of a kind changed",
            labels=["pipeline", "kind", "state"],
        ),
        "pause": g(
            "relay_upgrade_last_pause_seconds",
            "the newest upgrade's handoff -> green's first commit",
            labels=["pipeline"],
        ),
        "duration": HistogramMetricFamily(
            "relay_batch_duration_seconds", "micro-batch start -> commit", labels=["pipeline"]
        ),
        "commit": HistogramMetricFamily(
            "relay_commit_duration_seconds", "the ledger commit of a batch", labels=["pipeline"]
        ),
    }


class RelayCollector(Collector):
    """Every pipeline ``configs()`` names (read at each scrape: a pipelines file may change)."""

    def __init__(self, configs: Callable[[], Sequence[RelayConfig]]) -> None:
        self.configs = configs

    def collect(self) -> Iterator:
        out = families()
        for config in self.configs():
            ok = 1.0
            ledger = Ledger(config.ledger_url)
            try:
                _ledger_metrics(config, ledger, out)
                _kafka_metrics(config, ledger, out)
            except RelayError:
                ok = 0.0
            finally:
                ledger.close()
            out["up"].add_metric([config.pipeline], ok)
        yield from out.values()


def _kafka_metrics(config: RelayConfig, ledger: Ledger, out: Families) -> None:
    for row in offsets_view(config, ledger):
        labels = [config.pipeline, row["topic"], str(row["partition"])]
        if row["lag"] is not None:
            out["lag"].add_metric(labels, row["lag"])
            out["margin"].add_metric(labels, row["retention_margin"])
            out["cursor"].add_metric(labels, row["cursor"])


def _ledger_metrics(config: RelayConfig, ledger: Ledger, out: Families) -> None:
    p = config.pipeline
    b = s.batches
    with ledger.tx() as conn:
        applied, count = conn.execute(
            select(func.coalesce(func.sum(b.c.rows_applied + b.c.rows_skipped), 0), func.count()).where(
                b.c.pipeline == p
            )
        ).one()
        for name, column in (("duration", b.c.duration_ms), ("commit", b.c.commit_ms)):
            row = conn.execute(
                select(
                    *(func.sum(case((column <= le * 1000, 1), else_=0)) for le in BUCKETS_S),
                    func.count(),
                    func.coalesce(func.sum(column), 0.0),
                ).where(b.c.pipeline == p)
            ).one()
            counts = [int(v or 0) for v in row[: len(BUCKETS_S)]]
            buckets = [(str(le), n) for le, n in zip(BUCKETS_S, counts, strict=True)] + [
                ("+Inf", int(row[-2]))
            ]
            out[name].add_metric([p], buckets, float(row[-1]) / 1000)
        ops = conn.execute(
            select(
                s.operations.c.kind, s.operations.c.state, func.count(), func.max(s.operations.c.updated_at)
            )
            .where(s.operations.c.pipeline == p)
            .group_by(s.operations.c.kind, s.operations.c.state)
        ).all()
    out["applied"].add_metric([p], float(applied))
    out["batches"].add_metric([p], float(count))
    out["dead"].add_metric([p], float(ledger.dead_letter_count(p)))
    for kind, state, n, at in ops:
        out["ops" if state in ALL_TERMINAL else "running"].add_metric([p, kind, state], float(n))
        out["last_op"].add_metric([p, kind, state], float(at))
    instances = ledger.instances(p)
    for inst in instances[-10:]:
        labels = [p, str(inst.id), inst.version, inst.state.value, inst.role or ""]
        out["instance"].add_metric(labels, 1.0)
    out["live"].add_metric([p], float(sum(1 for i in instances if i.state.live)))
    # From the operation itself, which holds the figure from the gate on: the report is saved in a
    # transaction after the move to DONE, so a scrape between the two saw DONE without the pause.
    upgrades = ledger.operations(p, "upgrade", 1)
    pause = upgrades[0]["data"].get("green_first_commit_s") if upgrades else None
    if pause is not None:
        out["pause"].add_metric([p], float(pause))
    _health_metrics(config, ledger, out)


def _health_metrics(config: RelayConfig, ledger: Ledger, out: Families) -> None:
    reports = ledger.reports(config.pipeline, "health", 1)
    if not reports:
        return
    body = reports[0]["body"]
    out["health_at"].add_metric([config.pipeline], float(reports[0]["created_at"]))
    for check in body.get("checks", []):
        out["health"].add_metric([config.pipeline, check["name"]], Level(check["level"]).rank)
        if check["name"] == "lag":
            for part in check.get("data", {}).get("partitions", []):
                if part.get("lag_seconds") is not None:
                    labels = [config.pipeline, config.topic, str(part["partition"])]
                    out["lag_s"].add_metric(labels, float(part["lag_seconds"]))
