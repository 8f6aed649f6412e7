"""The private stack: its configuration on free ports, and where its pipeline's cursors stand.

Shared with ``relay chaos``, which reads cursors and offsets of its own private stack the same way.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from relay.config import RelayConfig, load_config
from relay.errors import OperationError
from relay.polling import poll

from .options import BenchOptions, Progress

TOPIC = "bench"
PIPELINE = "bench"


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
        "RELAY_SPARK_WORKER2_UI_PORT": str(free_port(host)),
        "RELAY_POSTGRES_PORT": str(free_port(host)),
        "RELAY_AIRFLOW_PORT": str(free_port(host)),
        "RELAY_WORKER_CORES": "6",  # the embedded default: a pipeline, its standby or green, another
        "RELAY_WORKER_MEMORY": "3g",
        "RELAY_PIPELINE": PIPELINE,
        "RELAY_TOPIC": TOPIC,
        "RELAY_PARTITIONS": str(options.partitions),
        "RELAY_MAX_OFFSETS_PER_TRIGGER": str(options.max_offsets_per_trigger),
        "RELAY_TRIGGER_SECONDS": str(options.trigger_seconds or 1.0),
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
    from relay.kafka.offsets import KafkaOffsets

    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        return kafka.latest(config.topic)


def wait_caught_up(config: RelayConfig, progress: Progress, timeout_s: float, what: str) -> float:
    """Wait until every cursor reached the latest offsets; return the seconds waited."""
    t0 = time.monotonic()
    latest: dict[int, int] = {}
    cur: dict[int, int] = {}

    def caught_up() -> bool | None:
        nonlocal latest, cur
        latest, cur = latest_offsets(config), cursors(config)
        return True if latest and all(cur.get(p, -1) >= off for p, off in latest.items()) else None

    def note(waited: float) -> None:
        done, total = sum(cur.values()), sum(latest.values())
        progress(f"{what}: {done:,}/{total:,} offsets applied ({waited:.0f}s)")

    poll(
        caught_up,
        timeout_s,
        note=note,
        on_timeout=lambda: OperationError(
            f"{what}: not caught up after {timeout_s:.0f}s (cursors {cur}, latest {latest})"
        ),
    )
    return time.monotonic() - t0
