"""Section ``upgrade``: an upgrade and its rollback under steady load, with each record's latency.

Why both windows in one run: the processing pause (an operation's longest production -> application
latency minus steady state's) only means something against a steady state of the same machine and
load, measured minutes before. The rollback is an upgrade to the previous version.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from relay.config import RelayConfig
from relay.errors import OperationError
from relay.polling import poll

from .cluster import cursors, latest_offsets, wait_caught_up
from .context import Context, ensure_running
from .pause import (
    Sample,
    application_times,
    exactly_once_counts,
    in_flight,
    join_samples,
    latency_summary,
    pause_s,
    read_applications,
    read_production_times,
)
from .results import figure


class RateProducer:
    """Counter messages at a steady rate on a thread, until stopped (the upgrade runs under load)."""

    def __init__(self, config: RelayConfig, rate: float) -> None:
        self.config = config
        self.rate = rate
        self.sent = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.sent

    def _run(self) -> None:
        from kafka import KafkaProducer
        from relay.kafka.producer import highest_counter

        try:
            previous = highest_counter(self.config.kafka_bootstrap, self.config.topic)
            first = 0 if previous is None else previous + 1
            producer = KafkaProducer(bootstrap_servers=self.config.kafka_bootstrap, acks="all", linger_ms=5)
        except Exception as exc:  # noqa: BLE001 - reported by the section
            self.errors.append(exc)
            return
        t0 = time.monotonic()
        try:
            while not self._stop.is_set():
                text = str(first + self.sent).encode()
                producer.send(self.config.topic, key=text, value=text).add_errback(self.errors.append)
                self.sent += 1
                ahead = t0 + self.sent / self.rate - time.monotonic()
                if ahead > 0:
                    self._stop.wait(ahead)
            producer.flush()
        finally:
            producer.close()


# The upgrade result's timings, printed when the running code reports them (newer code adds keys).
TIMINGS: tuple[tuple[str, str], ...] = (
    ("green_ready_s", "submission -> green READY"),
    ("ready_to_first_commit_s", "green READY -> first commit"),
    ("green_first_commit_s", "handoff -> green's first commit"),
    ("blue_drain_s", "blue drain"),
    ("total_s", "total"),
)


def timing_figures(label: str, result: dict[str, Any], cold_s: float | None) -> list[dict[str, Any]]:
    """The known timing keys in order, then any other numeric ``*_s`` key the result carries."""
    out = []
    for key, name in TIMINGS:
        if result.get(key) is not None:
            base = ("cold deploy first commit", cold_s) if key in ("green_first_commit_s", "total_s") else ()
            out.append(figure(f"{label}: {name}", float(result[key]), "s", *base))
    known = {k for k, _ in TIMINGS} | {"grace_s", "drain_timeout_s"}
    for key, value in result.items():
        if key.endswith("_s") and key not in known and isinstance(value, int | float):
            out.append(figure(f"{label}: {key}", float(value), "s"))
    return out


def _timed_upgrade(ctx: Context, version: str, label: str) -> tuple[dict[str, Any], float, float]:
    """Run one upgrade; its result and the call's wall-clock window."""
    from relay.operations.upgrade import upgrade

    ctx.progress(f"{label}: -> {version} under {ctx.options.upgrade_rate:.0f} msg/s")
    t0 = time.time()
    result = upgrade(ctx.config, version, grace_s=600, drain_timeout_s=600, progress=ctx.progress)
    t1 = time.time()
    if result.get("state") != "DONE":
        raise OperationError(f"{label} ended {result.get('state')}: {result.get('error')}")
    return result, t0, t1


def wait_applied(cfg: RelayConfig, offsets: dict[int, int], timeout_s: float) -> None:
    """Wait until every cursor passed ``offsets`` (under load the cursors never equal the latest)."""
    poll(
        lambda: all(cursors(cfg).get(p, -1) >= off for p, off in offsets.items()) or None,
        timeout_s,
        on_timeout=lambda: OperationError(f"the job did not apply up to {offsets} within {timeout_s:.0f}s"),
    )


def section_upgrade(ctx: Context) -> dict[str, Any]:
    from relay.artifacts import artifact, build_artifact
    from relay.ledger.store import Ledger

    cfg, opts = ctx.config, ctx.options
    ensure_running(ctx)
    previous = Ledger(cfg.ledger_url).instances(cfg.pipeline, live_only=True)[-1].version
    target = "v2" if previous != "v2" else "v3"
    for version in (target, previous):  # built before the windows: a build is no part of the pause
        if not artifact(cfg, version).exists():
            ctx.progress(f"upgrade: building artifact {version}")
            build_artifact(cfg, version)
    start = latest_offsets(cfg)
    t_begin = time.time()
    producer = RateProducer(cfg, opts.upgrade_rate)
    producer.start()
    ops: dict[str, tuple[dict[str, Any], float, float]] = {}
    try:
        time.sleep(opts.pause_settle_seconds)
        wait_applied(cfg, latest_offsets(cfg), 300)  # the first batch's worker start is no steady state
        time.sleep(opts.pause_settle_seconds)
        ctx.progress(
            f"upgrade: steady state for {opts.pause_steady_seconds:.0f}s at {opts.upgrade_rate:.0f} msg/s"
        )
        s0 = time.time()
        time.sleep(opts.pause_steady_seconds)
        s1 = time.time()
        time.sleep(opts.pause_settle_seconds)
        ops["upgrade"] = _timed_upgrade(ctx, target, "upgrade")
        time.sleep(opts.pause_settle_seconds)
        ops["rollback"] = _timed_upgrade(ctx, previous, "rollback")
        time.sleep(opts.pause_settle_seconds)
    finally:
        sent = producer.stop()
    ctx.windows["upgrade"] = (ops["upgrade"][1], ops["rollback"][2])
    if producer.errors:
        raise OperationError(f"the producer failed during the upgrade: {producer.errors[0]}")
    wait_caught_up(cfg, ctx.progress, 300, "upgrade (the last records)")
    end = latest_offsets(cfg)
    produced, ts_types = read_production_times(cfg.kafka_bootstrap, cfg.topic, start, end)
    messages, batches = read_applications(cfg.ledger_url, cfg.pipeline, cfg.topic, start, t_begin)
    applied, unmatched = application_times(messages, batches, cfg.topic)
    windows = {"steady": (s0, s1), **{k: (v[1], v[2]) for k, v in ops.items()}}
    details: dict[str, Any] = {
        "rate": opts.upgrade_rate,
        "produced": sent,
        "versions": {"upgrade": target, "rollback": previous},
        "windows": windows,
        "timestamp_types": ts_types,
        "unmatched_message_rows": unmatched,
        "exactly_once": exactly_once_counts(produced, applied),
        **{label: dict(v[0]) for label, v in ops.items()},
    }
    figures, bad = _figures(ctx, join_samples(produced, applied), windows, ops, details)
    eo = details["exactly_once"]
    if eo["duplicates"] or eo["gaps"] or unmatched:
        bad.append(f"per record: {eo['duplicates']} duplicate(s), {eo['gaps']} gap(s), {unmatched} unmatched")
    if ts_types != [0]:
        bad.append(f"Kafka timestamp types {ts_types}: production times need CreateTime (0)")
    for f in figures:
        ctx.progress(f"upgrade: {f['name']} = {f['value']} {f['unit']}")
    if bad:
        raise OperationError("; ".join(bad))
    return {"figures": figures, "details": details}


def _figures(
    ctx: Context,
    samples: list[Sample],
    windows: dict[str, tuple[float, float]],
    ops: dict[str, tuple[dict[str, Any], float, float]],
    details: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Steady latency, then per operation its latency, pause and timings; what must fail the section."""
    lat = {name: latency_summary(in_flight(samples, *win)) for name, win in windows.items()}
    details["latency"] = lat
    steady = lat["steady"]
    figures = [
        figure("steady latency p50", steady["p50_s"], "s"),
        figure("steady latency p99", steady["p99_s"], "s"),
        figure("steady latency max", steady["max_s"], "s"),
    ]
    bad: list[str] = []
    for label, (result, _t0, _t1) in ops.items():
        dups, gaps = int(result.get("duplicates", -1)), int(result.get("gaps", -1))
        figures += [
            figure(f"{label}: latency max", lat[label]["max_s"], "s", "steady max", steady["max_s"]),
            figure(f"{label}: pause (max - steady max)", pause_s(lat[label], steady), "s", "target", 2.0),
            *_phase_pauses(label, result, samples, steady, lat),
            *timing_figures(label, result, ctx.deploy_first_commit_s),
            figure(f"{label}: duplicates (must be 0)", dups, "records"),
            figure(f"{label}: gaps (must be 0)", gaps, "records"),
        ]
        if dups != 0 or gaps != 0:
            bad.append(f"{label} applied {dups} record(s) twice and missed {gaps}")
    eo = details["exactly_once"]
    figures += [
        figure("per record, whole run: records produced", eo["records"], "records"),
        figure("per record: applied twice (must be 0)", eo["duplicates"], "records"),
        figure("per record: never applied (must be 0)", eo["gaps"], "records"),
    ]
    return figures, bad


def _phase_pauses(
    label: str, result: dict[str, Any], samples: list[Sample], steady: dict[str, Any], lat: dict[str, Any]
) -> list[dict[str, Any]]:
    """The operation's two phases apart. Green's start-up (submission to the handoff): a second
    driver and executor on the same cores slow blue's batches (``relay.spark.standby_priority``); its p50
    against steady state's says how much. The handoff (to green's catching up): the records the
    handoff itself held."""
    t0, h0, h1 = result.get("started_at"), result.get("handoff_at"), result.get("caught_up_at")
    if not t0 or not h0 or not h1:
        return []
    start_up = lat[f"{label} start-up"] = latency_summary(in_flight(samples, float(t0), float(h0)))
    at_handoff = lat[f"{label} handoff"] = latency_summary(in_flight(samples, float(h0), float(h1)))
    return [
        figure(
            f"{label}: latency p50 during green's start-up",
            start_up["p50_s"],
            "s",
            "steady p50",
            steady["p50_s"],
        ),
        figure(f"{label}: pause during green's start-up", pause_s(start_up, steady), "s", "target", 2.0),
        figure(
            f"{label}: latency max at the handoff", at_handoff["max_s"], "s", "steady max", steady["max_s"]
        ),
        figure(f"{label}: pause at the handoff", pause_s(at_handoff, steady), "s", "target", 2.0),
    ]
