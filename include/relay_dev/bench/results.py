"""The result's JSON document: its shape, its figures, the machine it ran on, its atomic write.

Why machine facts: a reader comparing two result files must know the cores, memory and versions.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .options import SECTIONS, BenchOptions
from .stats import ratio

RESULT_SCHEMA = 1


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


def write_result(result: dict[str, Any], path: Path) -> None:
    """Atomically (rename) so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str, sort_keys=False))
    tmp.replace(path)


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
