"""``relay bench``: Relay's costs on a private embedded stack, each next to a baseline from the same run.

Why baselines: absolute figures from a shared 2-core machine mean little on their own; a ratio
against a baseline measured minutes apart on the same machine (a plain kafka-python consumer, Spark's
``rate`` source, a bare INSERT, a cold deploy, the idle stack) says what Relay itself costs.

Sections (each can be run alone with ``--only``): throughput, overhead, ledger, upgrade, recovery,
memory. The stack (noida-db, Spark master + worker, and PostgreSQL for the ledger section) runs on
free loopback ports under ``var/bench/<timestamp>/`` and is always stopped by PID at the end, also on
failure. Results go to ``var/bench/results-<timestamp>.json``. This module imports neither pyspark nor
Airflow: the Spark baseline runs as a subprocess (``bench/rate_overhead.py``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT, RelayConfig, load_config
from relay.errors import ConfigError, OperationError, RelayError

Progress = Callable[[str], None]

SECTIONS: tuple[str, ...] = ("throughput", "overhead", "ledger", "upgrade", "recovery", "memory")
RESULT_SCHEMA = 1
BENCH_DIR = PROJECT_ROOT / "var" / "bench"
RATE_SCRIPT = PROJECT_ROOT / "bench" / "rate_overhead.py"
TOPIC = "bench"
PIPELINE = "bench"


# ------------------------------------------------------------------------------------------ options
@dataclass(frozen=True)
class BenchOptions:
    """What to run and how big; ``--quick`` shrinks everything to a few minutes on a laptop."""

    messages: int = 500_000
    max_offsets_per_trigger: int = 50_000
    partitions: int = 3
    overhead_seconds: float = 30.0
    overhead_rate: float = 20.0
    ledger_commits: int = 200
    ledger_sizes: tuple[int, ...] = (10, 1000)
    upgrade_rate: float = 50.0
    recovery_messages: int = 3000
    quick: bool = False
    only: tuple[str, ...] = SECTIONS

    @classmethod
    def build(cls, quick: bool = False, messages: int | None = None, only: str | None = None) -> BenchOptions:
        """Options from the CLI flags; ``only`` is a comma-separated list of section names."""
        sections = parse_sections(only)
        if quick:
            base = cls(
                messages=50_000,
                max_offsets_per_trigger=10_000,
                overhead_seconds=15.0,
                ledger_commits=100,
                quick=True,
                only=sections,
            )
        else:
            base = cls(only=sections)
        if messages is not None:
            if messages < 1:
                raise ConfigError(f"--messages must be >= 1, got {messages}")
            base = replace(
                base,
                messages=messages,
                max_offsets_per_trigger=min(base.max_offsets_per_trigger, max(messages // 5, 1)),
            )
        return base


def parse_sections(only: str | None) -> tuple[str, ...]:
    """``"throughput,ledger"`` -> the sections in run order; unknown names are a ConfigError."""
    if not only:
        return SECTIONS
    wanted = [w.strip().lower() for w in only.split(",") if w.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown or not wanted:
        raise ConfigError(f"--only takes a comma-separated list of {', '.join(SECTIONS)}; got {only!r}")
    return tuple(s for s in SECTIONS if s in wanted)


# ------------------------------------------------------------------------------- pure statistics
def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, median, p95, min, max, mean: what every timing figure reports."""
    vals = [float(v) for v in values]
    return {
        "n": len(vals),
        "median": percentile(vals, 50),
        "p95": percentile(vals, 95),
        "min": min(vals) if vals else None,
        "max": max(vals) if vals else None,
        "mean": sum(vals) / len(vals) if vals else None,
    }


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, None when either is missing or the baseline is zero."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def fmt_number(value: float | None) -> str:
    """Readable width-stable numbers: thousands separators for big ones, 2 decimals for small ones."""
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if float(value).is_integer():
        return str(int(value))  # counts (batches, records) read as counts
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def throughput_from_batches(batches: Iterable[dict[str, Any]], latest: dict[int, int]) -> dict[str, Any]:
    """Applied msg/s from the ``batches`` rows of one instance.

    From the first committed batch's start to the commit of the first batch after which every
    partition's cursor reached ``latest`` (the end of the backlog); rows are the rows read by those
    batches. Returns also the batch count and the largest batch (to show maxOffsetsPerTrigger holds).
    """
    rows = sorted((b for b in batches if b["rows_read"] > 0), key=lambda b: (b["started_at"], b["batch_id"]))
    if not rows:
        return {
            "batches": 0,
            "rows": 0,
            "seconds": None,
            "msg_s": None,
            "max_batch_rows": None,
            "reached_latest": False,
        }
    reach: dict[int, int] = {}
    used: list[dict[str, Any]] = []
    reached = False
    for b in rows:
        used.append(b)
        for r in b.get("ranges") or []:
            reach[int(r["partition"])] = max(reach.get(int(r["partition"]), 0), int(r["to"]))
        if latest and all(reach.get(p, 0) >= off for p, off in latest.items()):
            reached = True
            break
    seconds = used[-1]["committed_at"] - used[0]["started_at"]
    total = sum(int(b["rows_read"]) for b in used)
    warm = used[1:]  # the first batch pays the Python workers' start: shown apart
    warm_s = warm[-1]["committed_at"] - warm[0]["started_at"] if warm else 0.0
    return {
        "batches": len(used),
        "rows": total,
        "seconds": seconds,
        "msg_s": total / seconds if seconds > 0 else None,
        "max_batch_rows": max(int(b["rows_read"]) for b in used),
        "first_batch_s": (used[0]["committed_at"] - used[0]["started_at"]),
        "warm_msg_s": sum(int(b["rows_read"]) for b in warm) / warm_s if warm_s > 0 else None,
        "read_ms": summarize([b["duration_ms"] - b["commit_ms"] for b in used if "duration_ms" in b]),
        "commit_ms": summarize([b["commit_ms"] for b in used if "commit_ms" in b]),
        "reached_latest": reached,
    }


# ------------------------------------------------------------------------------- result and table
def figure(
    name: str,
    value: float | None,
    unit: str,
    baseline_name: str | None = None,
    baseline: float | None = None,
    better: str = "lower",
) -> dict[str, Any]:
    """One printed figure; ``better`` says which direction is good (for readers of the JSON)."""
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline_name": baseline_name,
        "baseline": baseline,
        "ratio": ratio(value, baseline),
        "better": better,
    }


def new_result(options: BenchOptions, started: str, data_dir: Path) -> dict[str, Any]:
    """The JSON document every run writes, before any section ran."""
    return {
        "schema": RESULT_SCHEMA,
        "started": started,
        "finished": None,
        "data_dir": str(data_dir),
        "options": {
            **asdict(options),
            "only": list(options.only),
            "ledger_sizes": list(options.ledger_sizes),
        },
        "machine": {},
        "sections": {
            name: {"status": "skipped", "figures": [], "details": {}, "error": None, "seconds": None}
            for name in SECTIONS
        },
        "ok": True,
        "results_file": None,
    }


def render_table(result: dict[str, Any]) -> str:
    """The human summary: one line per figure, then machine facts and load."""
    cols = ["section", "figure", "value", "unit", "baseline", "base value", "ratio"]
    rows: list[list[str]] = []
    for name in SECTIONS:
        sec = result["sections"].get(name, {})
        status = sec.get("status", "skipped")
        if status != "ok":
            why = f": {sec.get('error')}" if sec.get("error") else ""
            rows.append([name, f"{status.upper()}{why}"[:90], "", "", "", "", ""])
            if status == "skipped":
                continue
        for f in sec.get("figures", []):
            rows.append(
                [
                    name,
                    f["name"],
                    fmt_number(f["value"]),
                    f["unit"],
                    f.get("baseline_name") or "-",
                    fmt_number(f.get("baseline")),
                    fmt_ratio(f.get("ratio")),
                ]
            )
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    right = {2, 5, 6}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [line(cols), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    m = result.get("machine", {})
    if m:
        out.append("")
        out.append(
            f"machine: {m.get('cores')} cores, {fmt_number(m.get('memory_gib'))} GiB, "
            f"Python {m.get('python')}, pyspark {m.get('pyspark')}, Java {m.get('java')}, "
            f"kafka-python {m.get('kafka_python')} (crc32c {'yes' if m.get('crc32c') else 'no'})"
        )
        out.append(f"load average (1/5/15 min): start {m.get('load_start')}, end {m.get('load_end')}")
    if result.get("results_file"):
        out.append(f"results: {result['results_file']}")
    out.append("overall: " + ("OK" if result.get("ok") else "FAILED (see sections above)"))
    return "\n".join(out)


# ----------------------------------------------------------------------------------- machine facts
def machine_facts() -> dict[str, Any]:
    """Cores, memory, versions: what a reader needs to compare two result files."""
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    java = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
        first = (done.stderr or done.stdout).splitlines()
        java = first[0].strip() if first else None
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": version("pyspark"),
        "kafka_python": version("kafka-python"),
        "crc32c": version("crc32c") is not None,
        "sqlalchemy": version("SQLAlchemy"),
        "java": java,
        "load_start": load_average(),
        "load_end": None,
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------------------------------ memory
def classify_process(cmdline: Sequence[str]) -> str:
    """Which part of the stack a process is, from its command line."""
    text = " ".join(cmdline)
    exe = Path(cmdline[0]).name if cmdline else ""
    if "noida-db" in text:
        return "kafka"
    if exe == "java" or exe.startswith("java"):
        if "DriverWrapper" in text or "PythonRunner" in text:
            return "driver_jvm"
        if "CoarseGrainedExecutorBackend" in text:
            return "executor_jvm"
        if "deploy.master.Master" in text:
            return "spark_master"
        if "deploy.worker.Worker" in text:
            return "spark_worker"
        return "other_jvm"
    if exe.startswith("python") or "python" in exe:
        if "reference_job.py" in text:
            return "python_driver"
        return "python_workers"
    if "postgres" in exe or "postgres" in text[:40]:
        return "postgres"
    return "other"


def _proc_memory(pid: int) -> tuple[float, float, float] | None:
    """(VmRSS, VmHWM, Pss) of one process in MiB; None when it is gone."""
    rss = hwm = pss = 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) / 1024
                    break
    except OSError:
        return None
    return rss, hwm, pss


class MemorySampler:
    """Samples every process in the stack's sessions (drivers are children of the worker's session).

    Peak of a category = the largest sum of VmRSS of its processes seen in one sample; ``hwm_mb`` is
    the sum of each process's own VmHWM (an upper bound: processes need not peak together).
    """

    def __init__(self, sessions: Callable[[], list[int]], interval_s: float = 0.5) -> None:
        self.sessions = sessions
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._hwm: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def sample_once(self) -> dict[str, Any]:
        from relay_dev.stack import session_pids

        cats: dict[str, dict[str, float]] = {}
        for sid in self.sessions():
            for pid in session_pids(sid):
                mem = _proc_memory(pid)
                if mem is None:
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                cat = classify_process([c.decode(errors="replace") for c in cmd if c])
                agg = cats.setdefault(cat, {"rss": 0.0, "pss": 0.0, "procs": 0})
                agg["rss"] += mem[0]
                agg["pss"] += mem[2]
                agg["procs"] += 1
                self._hwm[pid] = (cat, max(mem[1], self._hwm.get(pid, (cat, 0.0))[1]))
        sample = {
            "at": time.time(),
            "categories": cats,
            "total_rss": sum(c["rss"] for c in cats.values()),
            "total_pss": sum(c["pss"] for c in cats.values()),
        }
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a sampling hiccup must never fail the benchmark
                self.sample_once()
            self._stop.wait(self.interval_s)

    def peaks(self, since: float | None = None, until: float | None = None) -> dict[str, Any]:
        return memory_peaks(
            [
                s
                for s in self.samples
                if (since is None or s["at"] >= since) and (until is None or s["at"] <= until)
            ],
            self._hwm if since is None and until is None else None,
        )


def memory_peaks(
    samples: list[dict[str, Any]], hwm: dict[int, tuple[str, float]] | None = None
) -> dict[str, Any]:
    """Per category the peak summed RSS/PSS over samples, and the whole stack's peak."""
    out: dict[str, Any] = {"samples": len(samples), "categories": {}}
    for s in samples:
        for cat, agg in s["categories"].items():
            cur = out["categories"].setdefault(cat, {"peak_rss_mb": 0.0, "peak_pss_mb": 0.0, "max_procs": 0})
            cur["peak_rss_mb"] = max(cur["peak_rss_mb"], round(agg["rss"], 1))
            cur["peak_pss_mb"] = max(cur["peak_pss_mb"], round(agg["pss"], 1))
            cur["max_procs"] = max(cur["max_procs"], int(agg["procs"]))
    for cat, peak in (hwm or {}).values():
        if cat in out["categories"]:
            cur = out["categories"][cat]
            cur["hwm_sum_mb"] = round(cur.get("hwm_sum_mb", 0.0) + peak, 1)
    out["stack_peak_rss_mb"] = round(max((s["total_rss"] for s in samples), default=0.0), 1) or None
    out["stack_peak_pss_mb"] = round(max((s["total_pss"] for s in samples), default=0.0), 1) or None
    return out


# ------------------------------------------------------------------------------------------ helpers
def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def bench_config(data_dir: Path, options: BenchOptions, host: str = "127.0.0.1") -> RelayConfig:
    """A private stack: its own data dir and free loopback ports, the bench pipeline and topic."""
    env = {
        "RELAY_DATA_DIR": str(data_dir),
        "RELAY_HOST": host,
        "RELAY_KAFKA_PORT": str(free_port(host)),
        "RELAY_SPARK_MASTER_PORT": str(free_port(host)),
        "RELAY_SPARK_MASTER_UI_PORT": str(free_port(host)),
        "RELAY_SPARK_REST_PORT": str(free_port(host)),
        "RELAY_SPARK_WORKER_UI_PORT": str(free_port(host)),
        "RELAY_POSTGRES_PORT": str(free_port(host)),
        "RELAY_AIRFLOW_PORT": str(free_port(host)),
        "RELAY_WORKER_CORES": "4",
        "RELAY_WORKER_MEMORY": "2g",
        "RELAY_PIPELINE": PIPELINE,
        "RELAY_TOPIC": TOPIC,
        "RELAY_PARTITIONS": str(options.partitions),
        "RELAY_MAX_OFFSETS_PER_TRIGGER": str(options.max_offsets_per_trigger),
        "RELAY_TRIGGER_SECONDS": "1",
    }
    return load_config(env)


def cursors(config: RelayConfig) -> dict[int, int]:
    """Per partition the lowest cursor of the pipeline's unfinished leases."""
    from relay.ledger.store import Ledger

    out: dict[int, int] = {}
    for lease in Ledger(config.ledger_url).pipeline_leases(config.pipeline):
        if lease.topic == config.topic and not lease.drained:
            out[lease.partition] = min(out.get(lease.partition, lease.next_offset), lease.next_offset)
    return out


def latest_offsets(config: RelayConfig) -> dict[int, int]:
    from relay.kafka_offsets import KafkaOffsets

    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        return kafka.latest(config.topic)


def wait_caught_up(config: RelayConfig, progress: Progress, timeout_s: float, what: str) -> float:
    """Wait until every cursor reached the latest offsets; return the seconds waited."""
    t0 = time.monotonic()
    last = t0
    while True:
        latest = latest_offsets(config)
        cur = cursors(config)
        if latest and all(cur.get(p, -1) >= off for p, off in latest.items()):
            return time.monotonic() - t0
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise OperationError(
                f"{what}: not caught up after {timeout_s:.0f}s (cursors {cur}, latest {latest})"
            )
        if now - last >= 10:
            done, total = sum(cur.values()), sum(latest.values())
            progress(f"{what}: {done:,}/{total:,} offsets applied ({now - t0:.0f}s)")
            last = now
        time.sleep(0.5)


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
        from relay.producer import highest_counter

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


@dataclass
class Context:
    """What sections share: configuration, stack, timings other sections use as baselines."""

    config: RelayConfig
    options: BenchOptions
    progress: Progress
    sampler: MemorySampler
    work_dir: Path
    deploy_first_commit_s: float | None = None
    idle_stack_rss_mb: float | None = None
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)


def ensure_running(ctx: Context) -> int:
    """The pipeline's live instance id; deploys v1 (recording its first-commit time) when none runs."""
    from relay.ledger.store import Ledger
    from relay.operations.deploy import deploy

    live = Ledger(ctx.config.ledger_url).instances(ctx.config.pipeline, live_only=True)
    if live:
        return live[-1].id
    ctx.progress("deploying the reference job (v1) on the bench cluster")
    info = deploy(ctx.config, version="v1", wait_s=600, progress=ctx.progress)
    if ctx.deploy_first_commit_s is None:
        ctx.deploy_first_commit_s = float(info["first_commit_s"])
    return int(info["instance_id"])


def instance_batches(config: RelayConfig, instance_id: int) -> list[dict[str, Any]]:
    from relay.ledger.store import Ledger

    return Ledger(config.ledger_url).recent_batches(config.pipeline, 1_000_000, instance_id)


# ----------------------------------------------------------------------------------------- sections
def plain_consumer(bootstrap: str, topic: str, check_crcs: bool = True) -> dict[str, Any]:
    """Baseline: one kafka-python consumer, all partitions assigned, from beginning to end."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, check_crcs=check_crcs
    )
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        rows = 0
        t0 = time.monotonic()
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for recs in consumer.poll(timeout_ms=1000, max_records=10_000).values():
                rows += len(recs)
        seconds = time.monotonic() - t0
    finally:
        consumer.close()
    return {"rows": rows, "seconds": seconds, "msg_s": rows / seconds if seconds > 0 else None}


def section_throughput(ctx: Context) -> dict[str, Any]:
    from relay.producer import produce

    cfg, opts = ctx.config, ctx.options
    ctx.progress(f"throughput: producing {opts.messages:,} messages over {cfg.partitions} partitions")
    produced = produce(cfg.kafka_bootstrap, cfg.topic, opts.messages, None, partitions=cfg.partitions)
    produce_rate = produced["sent"] / produced["seconds"] if produced["seconds"] else None
    ctx.progress(
        f"throughput: produced in {produced['seconds']:.1f}s ({fmt_number(produce_rate)} msg/s); "
        "baseline: plain kafka-python consumer"
    )
    base = plain_consumer(cfg.kafka_bootstrap, cfg.topic)
    ctx.progress(
        f"throughput: kafka-python read {base['rows']:,} in {base['seconds']:.1f}s "
        f"({fmt_number(base['msg_s'])} msg/s); now the reference job "
        f"(maxOffsetsPerTrigger {cfg.max_offsets_per_trigger:,})"
    )
    latest = latest_offsets(cfg)
    t0 = time.time()
    instance_id = ensure_running(ctx)
    waited = wait_caught_up(cfg, ctx.progress, max(600.0, opts.messages / 200), "throughput")
    t1 = time.time()
    ctx.windows["throughput"] = (t0, t1)
    stats = throughput_from_batches(instance_batches(cfg, instance_id), latest)
    ctx.progress(
        f"throughput: reference job applied {stats['rows']:,} in {stats['batches']} batches, "
        f"{fmt_number(stats['msg_s'])} msg/s"
    )
    figures = [
        figure(
            "applied end to end (ledger commit incl.)",
            stats["msg_s"],
            "msg/s",
            "kafka-python consumer",
            base["msg_s"],
            better="higher",
        ),
        figure(
            "applied, batches after the first",
            stats["warm_msg_s"],
            "msg/s",
            "kafka-python consumer",
            base["msg_s"],
            better="higher",
        ),
        figure("first batch (Python workers start)", stats["first_batch_s"], "s"),
        figure("backlog batch: reading rows, median", stats["read_ms"]["median"], "ms"),
        figure("backlog batch: ledger commit, median", stats["commit_ms"]["median"], "ms"),
        figure(
            "max rows per batch",
            stats["max_batch_rows"],
            "rows",
            "maxOffsetsPerTrigger",
            cfg.max_offsets_per_trigger,
        ),
        figure("batches for the backlog", stats["batches"], "batches"),
        figure("deploy call -> backlog applied", t1 - t0, "s"),
    ]
    if stats["max_batch_rows"] and stats["max_batch_rows"] > cfg.max_offsets_per_trigger:
        raise OperationError(
            f"a batch read {stats['max_batch_rows']} rows, above maxOffsetsPerTrigger "
            f"{cfg.max_offsets_per_trigger}"
        )
    return {
        "figures": figures,
        "details": {
            "produce": produced,
            "produce_msg_s": produce_rate,
            "kafka_python": base,
            "relay": stats,
            "latest": latest,
            "instance_id": instance_id,
            "caught_up_wait_s": waited,
        },
    }


def checkpoint_spans(checkpoint: str | Path, batch_ids: Iterable[int]) -> dict[int, float]:
    """Per batch, ms between Spark's writes of ``offsets/N`` (planned) and ``commits/N`` (done)."""
    root = Path(checkpoint)
    out = {}
    for b in batch_ids:
        o, c = root / "offsets" / str(b), root / "commits" / str(b)
        if o.is_file() and c.is_file():
            out[int(b)] = (c.stat().st_mtime_ns - o.stat().st_mtime_ns) / 1e6
    return out


def run_rate_baseline(ctx: Context, seconds: float) -> dict[str, Any]:
    """bench/rate_overhead.py in a subprocess of its own session; killed by its PID on any failure."""
    work = ctx.work_dir / "rate-baseline"
    work.mkdir(parents=True, exist_ok=True)
    (work / "tmp").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": ctx.config.host,
        "TMPDIR": str(work / "tmp"),
        "PYSPARK_PYTHON": sys.executable,
    }
    log_path = ctx.work_dir / "logs" / "rate-baseline.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(RATE_SCRIPT), "--seconds", str(seconds), "--work-dir", str(work)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(PROJECT_ROOT),
            env=env,
        )
    ctx.children.append(proc)
    try:
        out, _ = proc.communicate(timeout=seconds + 240)
    except subprocess.TimeoutExpired:
        kill_child(proc)
        raise OperationError(f"the rate-source baseline did not finish; see {log_path}") from None
    finally:
        kill_child(proc)
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise OperationError(f"the rate-source baseline failed (exit {proc.returncode}); see {log_path}")
    return json.loads(lines[-1])


def kill_child(proc: subprocess.Popen[bytes]) -> None:
    """Stop a subprocess this benchmark started (and its session, which it leads) by its PID."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def section_overhead(ctx: Context) -> dict[str, Any]:
    from relay.ledger.store import Ledger
    from relay.producer import produce

    cfg, opts = ctx.config, ctx.options
    instance_id = ensure_running(ctx)
    wait_caught_up(cfg, ctx.progress, 600, "overhead (draining first)")
    count = int(opts.overhead_rate * opts.overhead_seconds)
    ctx.progress(
        f"overhead: producing {opts.overhead_rate:.0f} msg/s for {opts.overhead_seconds:.0f}s "
        "while the job runs with a 1 s trigger"
    )
    t0 = time.time()
    produce(cfg.kafka_bootstrap, cfg.topic, count, opts.overhead_rate, partitions=cfg.partitions)
    wait_caught_up(cfg, ctx.progress, 120, "overhead")
    small = [b for b in instance_batches(cfg, instance_id) if b["started_at"] >= t0 and b["rows_read"] > 0]
    if not small:
        raise OperationError("no batch committed while producing: cannot measure the overhead")
    ckpt = Ledger(cfg.ledger_url).instance(instance_id).checkpoint_dir
    spans = checkpoint_spans(ckpt, [b["batch_id"] for b in small])
    dur = summarize([b["duration_ms"] for b in small])
    com = summarize([b["commit_ms"] for b in small])
    span = summarize(list(spans.values()))
    rows = summarize([b["rows_read"] for b in small])
    ctx.progress(
        f"overhead: {dur['n']} small batches (median {fmt_number(rows['median'])} rows), median "
        f"{fmt_number(dur['median'])} ms; baseline: Spark rate source, no-op foreachBatch"
    )
    base = run_rate_baseline(ctx, max(opts.overhead_seconds, 10.0))
    if not base.get("trigger_ms"):
        raise OperationError("the rate-source baseline reported no batch")
    trig = summarize(base["trigger_ms"])
    bspan = summarize(base["span_ms"])
    figures = [
        figure(
            "small batch, foreachBatch median",
            dur["median"],
            "ms",
            "rate+no-op trigger median",
            trig["median"],
        ),
        figure("small batch, foreachBatch p95", dur["p95"], "ms", "rate+no-op trigger p95", trig["p95"]),
        figure("  of which ledger commit, median", com["median"], "ms"),
        figure("  of which ledger commit, p95", com["p95"], "ms"),
        figure(
            "offsets/N -> commits/N median", span["median"], "ms", "same span, rate+no-op", bspan["median"]
        ),
        figure("offsets/N -> commits/N p95", span["p95"], "ms", "same span, rate+no-op", bspan["p95"]),
    ]
    return {
        "figures": figures,
        "details": {
            "batches": dur,
            "commit_ms": com,
            "checkpoint_span_ms": span,
            "rows_per_batch": rows,
            "rate_baseline": {
                "trigger_ms": trig,
                "checkpoint_span_ms": bspan,
                "foreach_ms": summarize(base["foreach_ms"]),
                "rows_per_second": 5,
            },
        },
    }


class PhaseTimer:
    """Time spent per SQL statement kind and in COMMIT, from SQLAlchemy's cursor events.

    Why from the outside: ``commit_batch`` is one function; this shows where its time goes (locks,
    lease reads, message inserts, cursor CAS, batch row, commit) without touching its code.
    """

    _TABLE = re.compile(
        r"^\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|BEGIN\w*)\s*(?:.*?\bFROM\s+)?(\w+)?",
        re.IGNORECASE | re.DOTALL,
    )

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.enabled = False

    @classmethod
    def key(cls, statement: str) -> str:
        """``"UPDATE leases SET ..."`` -> ``"UPDATE leases"``; SELECTs are keyed by their first table."""
        m = cls._TABLE.match(statement)
        if not m:
            return statement.split(None, 1)[0].upper() if statement.strip() else "?"
        verb = m.group(1).split()[0].upper()
        table = (m.group(2) or "").strip('"')
        if verb == "BEGIN":
            return "BEGIN"
        return f"{verb} {table}".strip()

    def attach(self, engine: Any) -> None:
        from sqlalchemy import event

        def before(conn: Any, _cursor: Any, _stmt: str, _params: Any, _context: Any, _many: bool) -> None:
            conn.info["bench_t0"] = time.perf_counter()

        def after(conn: Any, _cursor: Any, stmt: str, _params: Any, _context: Any, _many: bool) -> None:
            t0 = conn.info.pop("bench_t0", None)
            if self.enabled and t0 is not None:
                k = self.key(stmt)
                self.totals[k] = self.totals.get(k, 0.0) + (time.perf_counter() - t0) * 1000

        event.listen(engine, "before_cursor_execute", before)
        event.listen(engine, "after_cursor_execute", after)
        dialect = engine.dialect
        original = dialect.do_commit

        def timed_commit(dbapi_connection: Any) -> None:
            t0 = time.perf_counter()
            try:
                original(dbapi_connection)
            finally:
                if self.enabled:
                    self.totals["COMMIT"] = self.totals.get("COMMIT", 0.0) + (time.perf_counter() - t0) * 1000

        dialect.do_commit = timed_commit  # this engine only: a private Ledger of the benchmark


def _ledger_run(url: str, size: int, commits: int, warmup: int, tag: str) -> dict[str, Any]:
    """commit_batch ``commits`` times with ``size`` records each; and the bare INSERT baseline."""
    from relay.ledger import schema as s
    from relay.ledger.models import Color
    from relay.ledger.store import Ledger
    from relay.protocol import Record, commit_batch
    from relay.reference_sink import ReferenceSink

    ledger = Ledger(url, create=True)  # a private ledger of the benchmark
    timer = PhaseTimer()
    timer.attach(ledger.engine)
    pipeline = f"ledger-{tag}-{size}-{time.time_ns() % 10**9}"
    topic, parts = "bench", 3
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, pipeline, "bench", Color.BLUE, "", pipeline)
        for p in range(parts):
            ledger.open_lease(conn, inst, topic, p, 0)
    attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    sink = ReferenceSink("bench")
    pos = dict.fromkeys(range(parts), 0)
    counter = 0
    protocol_ms: list[float] = []
    inside_ms: list[float] = []
    for batch_id in range(commits + warmup):
        start = {topic: dict(pos)}
        records = []
        for i in range(size):
            p = i % parts
            records.append(Record(topic, p, pos[p], str(counter).encode(), str(counter).encode()))
            pos[p] += 1
            counter += 1
        end = {topic: dict(pos)}
        timer.enabled = batch_id >= warmup
        t0 = time.perf_counter()
        result = commit_batch(ledger, attempt, batch_id, start, end, records, sink)
        elapsed = (time.perf_counter() - t0) * 1000
        if batch_id >= warmup:
            protocol_ms.append(elapsed)
            inside_ms.append(result.commit_ms)
    timer.enabled = False
    phases = {k: v / commits for k, v in sorted(timer.totals.items(), key=lambda kv: -kv[1])}
    phases["python and driver (rest)"] = max(0.0, sum(protocol_ms) / commits - sum(phases.values()))
    # Baseline: the same message rows in one bare transaction (no lock, no leases, no CAS, no batch row).
    bare_ms: list[float] = []
    base_pipeline = pipeline + "-bare"
    for batch_id in range(commits + warmup):
        rows = [
            dict(
                pipeline=base_pipeline,
                topic=topic,
                partition=i % parts,
                offset=batch_id * size + i,
                key=str(i),
                value=str(i),
                instance_id=inst.id,
                version="bench",
                batch_id=batch_id,
            )
            for i in range(size)
        ]
        t0 = time.perf_counter()
        with ledger.tx() as conn:
            conn.execute(s.messages.insert(), rows)
        if batch_id >= warmup:
            bare_ms.append((time.perf_counter() - t0) * 1000)
    ledger.close()
    return {
        "protocol_ms": summarize(protocol_ms),
        "inside_tx_ms": summarize(inside_ms),
        "bare_insert_ms": summarize(bare_ms),
        "phases_mean_ms": {k: round(v, 3) for k, v in phases.items()},
    }


def section_ledger(ctx: Context) -> dict[str, Any]:
    from relay_dev.postgres_local import LocalPostgres

    opts = ctx.options
    pg = LocalPostgres(ctx.config.data_dir, ctx.config.ports.postgres, ctx.config.host)
    backends = [("sqlite", f"sqlite:///{ctx.config.data_dir / 'ledger-bench.db'}")]
    figures: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    try:
        ctx.progress(f"ledger: starting PostgreSQL on {pg.address}")
        backends.append(("postgresql", pg.start()))
        for backend, url in backends:
            for size in opts.ledger_sizes:
                ctx.progress(f"ledger: {backend}, {opts.ledger_commits} commits of {size} records")
                r = _ledger_run(url, size, opts.ledger_commits, warmup=5, tag=backend)
                details[f"{backend}/{size}"] = r
                p, b = r["protocol_ms"], r["bare_insert_ms"]
                figures.append(
                    figure(
                        f"{backend} commit_batch {size} rec, median",
                        p["median"],
                        "ms",
                        "bare INSERT tx median",
                        b["median"],
                    )
                )
                figures.append(
                    figure(
                        f"{backend} commit_batch {size} rec, p95",
                        p["p95"],
                        "ms",
                        "bare INSERT tx p95",
                        b["p95"],
                    )
                )
    finally:
        with contextlib.suppress(RelayError):
            pg.stop()
    return {"figures": figures, "details": details}


def section_upgrade(ctx: Context) -> dict[str, Any]:
    from relay.ledger.store import Ledger
    from relay.operations.upgrade import upgrade

    cfg, opts = ctx.config, ctx.options
    ensure_running(ctx)
    live = Ledger(cfg.ledger_url).instances(cfg.pipeline, live_only=True)
    target = "v2" if live[-1].version != "v2" else "v3"
    producer = RateProducer(cfg, opts.upgrade_rate)
    producer.start()
    ctx.progress(f"upgrade: {live[-1].version} -> {target} while producing {opts.upgrade_rate:.0f} msg/s")
    t0 = time.time()
    try:
        time.sleep(2)  # records in flight when the handoff is taken
        result = upgrade(cfg, target, grace_s=600, drain_timeout_s=600, progress=ctx.progress)
    finally:
        sent = producer.stop()
    ctx.windows["upgrade"] = (t0, time.time())
    if producer.errors:
        raise OperationError(f"the producer failed during the upgrade: {producer.errors[0]}")
    if result.get("state") != "DONE":
        raise OperationError(f"upgrade ended {result.get('state')}: {result.get('error')}")
    dups, gaps = int(result.get("duplicates", -1)), int(result.get("gaps", -1))
    figures = [
        figure(
            "handoff -> green's first commit",
            result.get("green_first_commit_s"),
            "s",
            "cold deploy first commit",
            ctx.deploy_first_commit_s,
        ),
        figure("blue drain", result.get("blue_drain_s"), "s"),
        figure(
            "upgrade total", result.get("total_s"), "s", "cold deploy first commit", ctx.deploy_first_commit_s
        ),
        figure("duplicates (must be 0)", dups, "records"),
        figure("gaps (must be 0)", gaps, "records"),
    ]
    if dups != 0 or gaps != 0:
        raise OperationError(f"upgrade applied {dups} record(s) twice and missed {gaps}")
    keep = {
        k: result.get(k)
        for k in (
            "upgrade_id",
            "state",
            "blue_id",
            "green_id",
            "handoff",
            "green_first_commit_s",
            "blue_drain_s",
            "total_s",
            "applied_by_blue",
            "applied_by_green",
            "duplicates",
            "gaps",
        )
    }
    return {"figures": figures, "details": {"result": keep, "produced_during": sent, "version": target}}


def section_recovery(ctx: Context) -> dict[str, Any]:
    from relay.kafka_offsets import KafkaOffsets
    from relay.operations.recover import recover
    from relay.operations.stop import stop
    from relay.producer import produce

    cfg, opts = ctx.config, ctx.options
    ensure_running(ctx)
    wait_caught_up(cfg, ctx.progress, 600, "recovery (draining first)")
    ctx.progress("recovery: stopping the pipeline, producing, deleting records behind the cursor")
    stop(cfg, progress=ctx.progress)
    produce(cfg.kafka_bootstrap, cfg.topic, opts.recovery_messages, None, partitions=cfg.partitions)
    cur = cursors(cfg)
    latest = latest_offsets(cfg)
    cut = {p: cur[p] + (latest[p] - cur[p]) // 2 for p in latest if p in cur and latest[p] > cur[p]}
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.delete_records(cfg.topic, cut)
    ctx.progress(f"recovery: deleted below {cut} (cursors {cur}); executing recover(earliest)")
    t0 = time.time()
    result = recover(
        cfg, strategy="earliest", dry_run=False, reason="relay bench", wait_s=600, progress=ctx.progress
    )
    seconds = time.time() - t0
    lost = int(result["plan"]["total_lost"])
    expected = sum(cut[p] - cur[p] for p in cut)
    figures = [
        figure(
            "recover() call -> new instance's first commit",
            seconds,
            "s",
            "cold deploy first commit",
            ctx.deploy_first_commit_s,
        ),
        figure("records declared lost", lost, "records", "records deleted", expected),
    ]
    if lost != expected:
        raise OperationError(f"recovery declared {lost} record(s) lost, {expected} were deleted")
    return {
        "figures": figures,
        "details": {
            "cut": cut,
            "cursors_before": cur,
            "latest": latest,
            "first_commit_s": result.get("first_commit_s"),
            "instance_id": result.get("instance_id"),
        },
    }


def section_memory(ctx: Context) -> dict[str, Any]:
    window = ctx.windows.get("throughput")
    scope = "throughput run" if window else "whole run (throughput not run)"
    peaks = ctx.sampler.peaks(*window) if window else ctx.sampler.peaks()
    whole = ctx.sampler.peaks()
    cats = peaks["categories"]

    def peak(cat: str) -> float | None:
        return cats.get(cat, {}).get("peak_rss_mb")

    figures = [
        figure("driver JVM peak RSS", peak("driver_jvm"), "MiB"),
        figure("executor JVM peak RSS", peak("executor_jvm"), "MiB"),
        figure("Python driver peak RSS", peak("python_driver"), "MiB"),
        figure("Python workers peak RSS (sum)", peak("python_workers"), "MiB"),
        figure("Python workers peak PSS (sum)", cats.get("python_workers", {}).get("peak_pss_mb"), "MiB"),
        figure(
            "whole stack peak RSS",
            peaks["stack_peak_rss_mb"],
            "MiB",
            "idle stack (no job)",
            ctx.idle_stack_rss_mb,
        ),
        figure(
            "whole stack peak RSS, whole run",
            whole["stack_peak_rss_mb"],
            "MiB",
            "idle stack (no job)",
            ctx.idle_stack_rss_mb,
        ),
    ]
    if not peaks["samples"]:
        raise OperationError("no memory sample was taken")
    return {"figures": figures, "details": {"scope": scope, "window": peaks, "whole_run": whole}}


SECTION_FUNCS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "throughput": section_throughput,
    "overhead": section_overhead,
    "ledger": section_ledger,
    "upgrade": section_upgrade,
    "recovery": section_recovery,
    "memory": section_memory,
}
NEEDS_STACK = {"throughput", "overhead", "upgrade", "recovery", "memory"}


# --------------------------------------------------------------------------------------------- run
def write_result(result: dict[str, Any], path: Path) -> None:
    """Atomically (rename) so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str, sort_keys=False))
    tmp.replace(path)


def run_bench(
    options: BenchOptions, progress: Progress | None = None, host: str = "127.0.0.1"
) -> dict[str, Any]:
    """Start a private stack, run the chosen sections, stop it (always), write and return the result."""
    from relay_dev.stack import LocalStack, Part

    say = progress or (lambda _m: None)
    t_start = time.monotonic()

    def note(msg: str) -> None:
        say(f"[bench {time.monotonic() - t_start:6.1f}s] {msg}")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    data_dir = BENCH_DIR / stamp
    data_dir.mkdir(parents=True, exist_ok=False)
    data_dir.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    result = new_result(options, stamp, data_dir)
    result_path = BENCH_DIR / f"results-{stamp}.json"
    result["results_file"] = str(result_path)
    result["machine"] = machine_facts()
    note(
        f"machine: {result['machine']['cores']} cores, load {result['machine']['load_start']}; "
        f"sections {', '.join(options.only)}; data in {data_dir}"
    )
    config = bench_config(data_dir, options, host)
    stack = LocalStack(config, progress=note)

    def sessions() -> list[int]:
        try:
            state = json.loads(stack.state_file.read_text())
        except (OSError, ValueError):
            return []
        return [int(v["pid"]) for k, v in state.items() if v.get("pid") and k != Part.POSTGRES.value]

    sampler = MemorySampler(sessions)
    ctx = Context(config=config, options=options, progress=note, sampler=sampler, work_dir=data_dir)
    try:
        if NEEDS_STACK & set(options.only):
            note("starting the bench stack (noida-db, Spark master + worker) on free loopback ports")
            stack.up()
            ctx.idle_stack_rss_mb = sampler.sample_once()["total_rss"]
            sampler.samples.clear()
            sampler.start()
        for name in options.only:
            sec = result["sections"][name]
            t0 = time.monotonic()
            note(f"== {name}")
            try:
                out = SECTION_FUNCS[name](ctx)
                sec.update(status="ok", figures=out["figures"], details=out["details"])
            except Exception as exc:  # noqa: BLE001 - one section failing must not lose the others
                sec.update(status="failed", error=f"{type(exc).__name__}: {exc}")
                result["ok"] = False
                note(f"{name} FAILED: {type(exc).__name__}: {exc}")
            sec["seconds"] = round(time.monotonic() - t0, 1)
            write_result(result, result_path)  # partial results survive a crash of a later section
    finally:
        sampler.stop()
        for proc in ctx.children:
            kill_child(proc)
        try:
            if stack.state_file.exists():
                note("stopping the bench stack")
                stack.down()
        except RelayError as exc:
            result["ok"] = False
            result["stack_down_error"] = str(exc)
            note(f"stopping the stack: {exc}")
        result["machine"]["load_end"] = load_average()
        result["finished"] = time.strftime("%Y%m%d-%H%M%S")
        result["seconds"] = round(time.monotonic() - t_start, 1)
        write_result(result, result_path)
    note(f"done in {result['seconds']}s; results in {result_path}")
    return result
