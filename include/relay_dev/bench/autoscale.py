"""Section ``autoscale``: a load step one executor core cannot keep up with, the lag policy off and on.

Why the shuffling Kafka-to-Kafka example (examples/kafka_to_kafka, as tests/integration/
test_autoscale.py runs it): its parse is spread over every executor core (``repartition``), so a
second executor shortens each batch; the counter's batches wait on the ledger's database instead.
Its output is counted from outside (confluent-kafka ``read_committed``): every kept input event once.
Why a heavier parse (``ROUNDS`` sha256 rounds an event in a Python UDF, filtering nothing): as the
example ships, one executor core applies ~17,000 events/s, and at that rate the embedded broker
(noida-db, persisting to one JSON file) took both cores and gigabytes: the broker, not the
executors, was the bound. At ~0.3 ms an event the executors are the bound at a few thousand a second.

One run, the same pipeline twice on its own topics, one executor at the start: first a calibration
burst measures what one executor applies per second (``cap1``); the load step is then ``STEP_FACTOR``
x ``cap1`` for the window, then nothing (the tail). Policy off: the lag (the health check's worst
partition, seconds behind) sampled every ``SAMPLE_S`` over the window and the tail, until drained.
Policy on: the same, and every ``CHECK_S`` a persisted health check and one ``autoscale(cfg)``
decision (the health DAG's cadence shortened from minutes to seconds so a window fits in a bench
run), until the tail's scale down. A handoff's pause is the longest
gap between two commits that moved a cursor during the scale, minus the median gap before it (the
records are behind anyway: a per-record latency would measure the backlog, not the handoff).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from typing import Any
from unittest import mock

from relay.config import AutoscalePolicy, RelayConfig
from relay.errors import OperationError, RelayError

from .autoscale_load import Events, package
from .cluster import wait_caught_up
from .context import Context
from .results import figure

BOOTSTRAP_ENV = "KAFKA_TO_KAFKA_BOOTSTRAP"
MAX_OFFSETS = 3000  # per batch: ~1 s of one executor's work, its fixed cost (~0.6 s here) a minor part
TRIGGER_S = 0.1  # Relay's default: back to back when behind (1 s would cap two executors at 20,000/s)
STEP_FACTOR = 1.4  # the step's rate over one executor's measured rate (two should keep up)
SAMPLE_S = 2.0
CHECK_S = 4.0  # health check + autoscale cadence (the DAG's is minutes)
TAIL_S = 240.0  # after the step: until drained (off) or scaled down (on), at most this
CAUGHT_UP_S = 5.0  # behind by at most this: caught up (a batch interval or two)
POLICY = AutoscalePolicy(max_executors=2, lag_seconds=8.0, runs=2, idle_runs=2, busy_below=0.5)


# ------------------------------------------------------------------------------- pure (unit tested)
def catch_up_s(samples: list[tuple[float, float | None]], limit: float = CAUGHT_UP_S) -> float | None:
    """The time of the first sample after the peak from which the lag stays at most ``limit``
    (None: still behind at the window's end, or never behind)."""
    known = [(t, lag) for t, lag in samples if lag is not None]
    if not known:
        return None
    peak = max(range(len(known)), key=lambda i: known[i][1])
    if known[peak][1] <= limit:
        return None
    for i in range(peak + 1, len(known)):
        if all(lag <= limit for _, lag in known[i:]):
            return known[i][0]
    return None


def handoff_pause(commits: list[float], start: float, end: float) -> dict[str, float | None]:
    """The longest gap between consecutive cursor-moving commits overlapping ``[start, end]``, the
    median gap of the commits before ``start``, and their difference (the pause)."""
    times = sorted(commits)
    gaps = list(zip(times, times[1:], strict=False))
    inside = [b - a for a, b in gaps if b >= start and a <= end]
    before = [b - a for a, b in gaps if b < start]
    longest = max(inside) if inside else None
    steady = statistics.median(before[-30:]) if before else None
    pause = longest - steady if longest is not None and steady is not None else None
    return {"longest_gap_s": longest, "steady_gap_s": steady, "pause_s": pause}


class LagSampler:
    """The health check's worst lag (seconds), not persisted, every ``SAMPLE_S`` on a thread."""

    def __init__(self, cfg: RelayConfig, t0: float) -> None:
        self.cfg, self.t0 = cfg, t0
        self.samples: list[tuple[float, float | None]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-lag", daemon=True)

    def _run(self) -> None:
        from relay.health import run_health
        from relay.operations.autoscale import worst_lag_s

        while not self._stop.is_set():
            t = time.time()
            try:
                lag = worst_lag_s(run_health(self.cfg, persist=False).to_json())
            except Exception as exc:  # noqa: BLE001 - a failed sample is a gap in the series, reported
                lag = None
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self.samples.append((round(t - self.t0, 1), None if lag is None else round(lag, 2)))
            self._stop.wait(max(0.0, t + SAMPLE_S - time.time()))

    def __enter__(self) -> LagSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _batches(cfg: RelayConfig, since: float) -> list[tuple[float, float, int]]:
    """(commit time, duration s, offsets) of the pipeline's batches that moved a cursor since ``since``."""
    from relay.ledger import schema as s
    from relay.ledger.store import Ledger
    from sqlalchemy import select

    b = s.batches
    query = select(b.c.committed_at, b.c.duration_ms, b.c.ranges).where(
        b.c.pipeline == cfg.pipeline, b.c.committed_at >= since
    )
    with Ledger(cfg.ledger_url).tx() as conn:
        rows = conn.execute(query).all()
    moved = (sum(int(x["to"]) - int(x["from"]) for x in r[2]) for r in rows)
    return sorted((float(r[0]), float(r[1] or 0) / 1000, n) for r, n in zip(rows, moved, strict=True) if r[2])


def _policy_loop(
    cfg: RelayConfig, t0: float, until: float, say: Any, decisions: list[dict[str, Any]], stop_on: str = ""
) -> None:
    """A persisted health check and one decision every ``CHECK_S`` until ``until`` or a decision
    ``stop_on`` (a scale that started runs to its end); appended to ``decisions``."""
    from relay.health import run_health
    from relay.operations.autoscale import autoscale

    while time.time() < until and not (decisions and decisions[-1]["action"] == stop_on):
        tick = time.time()
        run_health(cfg)
        started = time.time()
        body = autoscale(cfg, progress=say)
        ended = time.time()
        decisions.append({**body, "t_s": round(started - t0, 1), "ended_s": round(ended - t0, 1)})
        if body["action"] != "hold":
            say(
                f"autoscale: {body['action']} {body['executors']} -> {body['target']} ({body['why']}) "
                f"at {started - t0:.0f}s, done {ended - started:.0f}s later: {body.get('scale')}"
            )
        time.sleep(max(0.0, tick + CHECK_S - time.time()))


def _wait_drained(sampler: LagSampler, until: float) -> None:
    """Until a lag sample of 0 (every partition caught up) or ``until``."""
    seen = len(sampler.samples)
    while time.time() < until and not any(lag == 0 for _, lag in sampler.samples[seen:]):
        time.sleep(SAMPLE_S / 2)


def run_one(ctx: Context, name: str, policy: bool, rate: float | None) -> dict[str, Any]:
    """Deploy, warm up (and calibrate when ``rate`` is None), the step, the window, the outside count."""
    from relay.artifacts import build_artifact
    from relay.kafka.offsets import KafkaOffsets
    from relay.operations.deploy import deploy
    from relay.operations.stop import stop
    from relay.sinks import kafka_clients as kc
    from relay.sinks.kafka_transactional import KafkaTransactionalSink

    from relay_dev.chaos.workloads import count_kafka

    say, quick = ctx.progress, ctx.options.quick
    window_s = 150.0 if quick else 300.0
    output = f"{name}_out"
    cfg = ctx.config.with_(
        pipeline=name,
        topic=name,
        max_offsets_per_trigger=MAX_OFFSETS,
        trigger_seconds=TRIGGER_S,
        autoscale=POLICY if policy else None,
    )
    code = package(ctx.work_dir / "autoscale", name, output)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    KafkaTransactionalSink(cfg.kafka_bootstrap, output).create_topic(cfg.partitions)
    build_artifact(cfg, f"{name}-v1", pipeline_code=code)
    out: dict[str, Any] = {"pipeline": name, "policy": policy, "window_s": window_s, "tail_s": TAIL_S}
    events = Events(cfg)
    t_begin = time.time()
    try:
        with mock.patch.dict(os.environ, {BOOTSTRAP_ENV: cfg.kafka_bootstrap}):  # green's launch too
            mode = "on" if policy else "off"
            say(f"autoscale: deploying {name} (examples/kafka_to_kafka, 1 executor, policy {mode})")
            deploy(cfg, version=f"{name}-v1", wait_s=600, progress=say)
            events.burst(MAX_OFFSETS)
            wait_caught_up(cfg, say, 300, f"autoscale {name} warm-up")
            if rate is None:
                burst, t_cal = 20 * MAX_OFFSETS, time.time()
                events.burst(burst)
                wait_caught_up(cfg, say, 600, f"autoscale {name} calibration")
                batches = _batches(cfg, t_cal)  # the burst's; its first half warms the Python workers
                half = len(batches) // 2
                done = sum(n for _, _, n in batches[half + 1 :])
                out["cap1_msg_s"] = done / (batches[-1][0] - batches[half][0])
                out["calibration_batch_s"] = statistics.median(d for _, d, _ in batches[half + 1 :])
                rate = STEP_FACTOR * out["cap1_msg_s"]
                say(f"autoscale: one executor applies {out['cap1_msg_s']:.0f} msg/s; step {rate:.0f} msg/s")
            out["step_rate"] = rate
            t0 = time.time()
            decisions: list[dict[str, Any]] = []
            with LagSampler(cfg, t0) as sampler:
                events.start_step(rate, window_s)
                if policy:
                    _policy_loop(cfg, t0, t0 + window_s, say, decisions)
                else:
                    time.sleep(window_s)
                events.close()  # the step ends with the window; the tail: the backlog drains
                say(f"autoscale: {name}: the step ended; the tail (at most {TAIL_S:.0f}s)")
                if policy:
                    _policy_loop(cfg, t0, time.time() + TAIL_S, say, decisions, stop_on="down")
                else:
                    _wait_drained(sampler, time.time() + TAIL_S)
            out["lag"], out["lag_errors"], out["decisions"] = sampler.samples, sampler.errors[:5], decisions
            out["produced"], out["produce_errors"] = events.next, events.errors[:5]
            out["drain_after_window_s"] = wait_caught_up(cfg, say, 900, f"autoscale {name} (the rest)")
        out["commits"] = [round(c, 3) for c, _, _ in _batches(cfg, t0)]
        out["outside"] = count_kafka(cfg, output, {}).to_json()
    finally:
        events.close()
        with contextlib.suppress(RelayError):
            stop(cfg, timeout_s=120, progress=say)
        kc.close_all()
    out["t0"], out["t_begin"] = t0, t_begin
    return out


def lag_summary(samples: list[tuple[float, float | None]], window_s: float) -> dict[str, float | None]:
    """Over the step's window: the last lag, the peak, when it was caught up for good; after it (the
    tail, no load): seconds until a sample found every partition caught up (lag 0)."""
    window = [(t, lag) for t, lag in samples if t <= window_s]
    known = [lag for _, lag in samples if lag is not None]
    drained = next((t for t, lag in samples if t > window_s and lag == 0), None)
    return {
        "window_end": next((lag for _, lag in reversed(window) if lag is not None), None),
        "peak": max(known) if known else None,
        "caught_up_at": catch_up_s(window),
        "tail_drained_s": None if drained is None else round(drained - window_s, 1),
    }


def section_autoscale(ctx: Context) -> dict[str, Any]:
    off = run_one(ctx, "as_off", policy=False, rate=None)
    on = run_one(ctx, "as_on", policy=True, rate=off["step_rate"])
    figures = [
        figure("one executor's rate (calibration burst)", off["cap1_msg_s"], "msg/s", better="higher"),
        figure("one executor's median batch (calibration burst)", off["calibration_batch_s"], "s"),
        figure("load step rate", off["step_rate"], "msg/s", better="higher"),
    ]
    if off["calibration_batch_s"] <= TRIGGER_S:  # batches waited for the trigger: not core-bound
        ctx.progress("autoscale: WARNING: the trigger, not the executor, paced the calibration's batches")
    s_off, s_on = (lag_summary(r["lag"], r["window_s"]) for r in (off, on))
    for key, name in (
        ("window_end", "lag at the step's end"),
        ("peak", "peak lag"),
        ("caught_up_at", "step start -> caught up under load (None: never)"),
        ("tail_drained_s", "step's end -> backlog drained"),
    ):
        figures.append(figure(f"{name}, policy on", s_on[key], "s", "policy off", s_off[key]))
    scales = [d for d in on["decisions"] if d["action"] in ("up", "down")]
    figures += [
        figure("scale ups", sum(d["action"] == "up" for d in scales), "count", better="higher"),
        figure("scale downs", sum(d["action"] == "down" for d in scales), "count", better="higher"),
    ]
    handoffs, bad = [], []
    for d in scales:
        t0 = on["t0"]
        pause = handoff_pause(on["commits"], t0 + d["t_s"], t0 + d["ended_s"])
        done = d.get("scale") or {}
        label = f"scale {d['action']} {d['executors']} -> {d['target']} at {d['t_s']:.0f}s"
        handoffs.append({"label": label, **pause, **done})
        figures += [
            figure(f"{label}: pause (longest commit gap - steady)", pause["pause_s"], "s"),
            figure(f"{label}: handoff -> green's first commit", done.get("green_first_commit_s"), "s"),
            figure(f"{label}: duplicates (audit, must be 0)", done.get("duplicates"), "records"),
            figure(f"{label}: gaps (audit, must be 0)", done.get("gaps"), "records"),
        ]
        if done.get("state") != "DONE" or done.get("duplicates") or done.get("gaps"):
            bad.append(f"{label}: {done}")
    for which, run in (("off", off), ("on", on)):
        o = run["outside"]
        figures += [
            figure(f"policy {which}: events applied twice (outside, must be 0)", o["duplicates"], "records"),
            figure(f"policy {which}: events never applied (outside, must be 0)", o["missing"], "records"),
        ]
        if o["duplicates"] or o["missing"] or o["wrong"] or run["produce_errors"]:
            bad.append(f"policy {which}: {o}; produce errors {run['produce_errors']}")
    for f in figures:
        ctx.progress(f"autoscale: {f['name']} = {f['value']} {f['unit']}")
    if bad:
        raise OperationError("; ".join(bad))
    details = {
        "pipeline": "examples/kafka_to_kafka (repartition: a shuffle over every executor core)",
        "max_offsets_per_trigger": MAX_OFFSETS,
        "trigger_s": TRIGGER_S,
        "policy": POLICY.__dict__,
        "cadence": f"lag sampled every {SAMPLE_S:g}s; health check + autoscale every {CHECK_S:g}s "
        "(the health DAG's cadence shortened to fit the window)",
        "pause": "longest gap between cursor-moving commits during the scale minus the median gap before it",
        "handoffs": handoffs,
        "summary": {"off": s_off, "on": s_on},
        "off": off,
        "on": on,
    }
    return {"figures": figures, "details": details}
