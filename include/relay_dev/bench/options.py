"""What a bench run does and how big: the CLI's flags as a frozen value every section reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from relay.errors import ConfigError

Progress = Callable[[str], None]
SECTIONS: tuple[str, ...] = (
    "throughput",
    "overhead",
    "ledger",
    "upgrade",
    "recovery",
    "memory",
    "submit",
    "pipeline",
    "latency",
    "smallbatch",
    "failover",
    "failover-hosts",
    "autoscale",
)


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
    upgrade_rate: float = 100.0
    pause_steady_seconds: float = 30.0  # the steady-state latency window before the upgrade
    pause_settle_seconds: float = 10.0  # load without an operation before and after each window
    recovery_messages: int = 3000
    quick: bool = False
    only: tuple[str, ...] = SECTIONS
    trigger_seconds: float | None = None
    """``--trigger-seconds``: every pipeline's trigger. None: 1 s for the counter's sections (what
    ``overhead`` and ``smallbatch`` describe), Relay's default for ``pipeline`` and ``latency``."""

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
                pause_steady_seconds=15.0,
                pause_settle_seconds=5.0,
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
