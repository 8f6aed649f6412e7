"""What a chaos run does and when: its options and the seeded fault schedule (pure, no I/O).

Why a schedule fixed up front: the same ``--seed`` gives the same kinds at the same offsets into the
fault window, so a run that broke something can be repeated; only the system's reactions differ.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from relay.errors import ConfigError
from relay.pipeline import load_package
from relay.pipeline.sink_declares import sink_declares

from relay_dev.chaos.workloads import workload_of

#: Every fault kind, in the order the table prints them.
KINDS: tuple[str, ...] = (
    "driver",
    "executor",
    "worker",
    "master",
    "broker",
    "scheduler",
    "ledger-lock",
    "ledger",
)
#: Kinds of the short run that ``make test`` runs (Airflow is heavy: the scheduler is left out).
SHORT_KINDS: tuple[str, ...] = ("driver", "executor", "worker", "master", "broker", "ledger-lock", "ledger")
#: Kinds that need the PostgreSQL ledger (``ledger``: its server SIGKILLed and restarted).
POSTGRES_KINDS = frozenset({"ledger"})
#: Healed by Spark itself (supervised driver relaunch, executor replacement): no human action.
SPARK_HEALED = frozenset({"driver", "executor"})
#: Parts of the embedded stack: supervisord brings them back (a human action only when it gives up).
STACK_PARTS = frozenset({"worker", "master", "broker", "scheduler", "ledger"})
#: The driver's SQLite busy timeout (PRAGMA busy_timeout in relay.ledger.engine): a longer lock fails it.
SQLITE_BUSY_TIMEOUT_S = 60.0
FULL_RUN_S = 600.0
FULL_RUN_PER_KIND = 22  # the issue asks for at least 20 of every kind; 2 spare for skipped ones
DRIVER_TARGETS = ("jvm", "python", "both")


@dataclass(frozen=True)
class ChaosOptions:
    """One chaos run. ``seconds`` is the fault window (setup, catch-up and audit come on top)."""

    seconds: float = FULL_RUN_S
    kinds: tuple[str, ...] = KINDS
    seed: int = 1
    rate: float = 200.0  # counter messages per second, produced all through the fault window
    poison_every: int = 100  # every N-th message is a poison record (dead letter)
    postgres: bool = False
    lock_seconds: float = 65.0
    per_kind: int = FULL_RUN_PER_KIND
    pipeline_code: Path | None = None
    """A pipeline package run instead of Relay's default (``examples/counter`` under the chaos
    pipeline's name and topic): examples/kafka_to_kafka, examples/json_upsert or the counter. Its
    sink decides the workload; the broker check compares the counter's rows when there are any."""
    workload: str = "counter"
    """What the load is and how the result is counted from outside (``relay_dev.chaos.workloads``)."""
    warmup_s: float = 10.0  # steady commits before the first fault
    grace_s: float = 240.0  # past the window, a kind never injected yet may still wait for a target
    min_up_s: float = 30.0
    """After a fault ended (a worker, master, broker or scheduler: once it is back), its kind's next
    fault waits at least this long: a part killed again in the second it came back (faults overdue
    when restarts are slow) measures a permanent outage, not recovery under faults."""
    catch_up_timeout_s: float = 420.0
    max_offsets_per_trigger: int = 5000
    stall_s: float = 240.0  # no commit for this long (no lock held): the pipeline needs a human
    standby: bool = False
    """Two workers and ``standby = "hot"``: worker and driver faults aim at the active's, which the
    standby on the other worker takes over (issues #18, #20)."""

    @classmethod
    def build(
        cls,
        seconds: float | None = None,
        minutes: float | None = None,
        kinds: str | None = None,
        seed: int | None = None,
        rate: float | None = None,
        postgres: bool = False,
        lock_seconds: float | None = None,
        per_kind: int | None = None,
        pipeline_code: Path | None = None,
        standby: bool = False,
    ) -> ChaosOptions:
        """Options from CLI flags; the defaults depend on the length (short run vs full run).

        Full run (>= 10 minutes): every kind, Airflow's scheduler included, 22 faults per kind, a
        65 s ledger lock (past SQLite's 60 s busy timeout). Shorter runs: no scheduler by default,
        one fault per kind per 40 s (at least one), and a 15 s lock (a stall, not a driver failure).
        """
        if seconds is not None and minutes is not None:
            raise ConfigError("give --seconds or --minutes, not both")
        window = seconds if seconds is not None else (minutes * 60 if minutes is not None else FULL_RUN_S)
        if window < 30:
            raise ConfigError(f"the fault window must be at least 30 s, got {window:g}")
        full = window >= FULL_RUN_S
        chosen = parse_kinds(kinds) if kinds else (KINDS if full else SHORT_KINDS)
        count = (
            per_kind if per_kind is not None else (FULL_RUN_PER_KIND if full else max(1, int(window // 40)))
        )
        if count < 1:
            raise ConfigError(f"--per-kind must be >= 1, got {count}")
        lock = lock_seconds if lock_seconds is not None else (SQLITE_BUSY_TIMEOUT_S + 5 if full else 15.0)
        if lock <= 0 or lock >= window:
            raise ConfigError(f"--lock-seconds must be within (0, {window:g}), got {lock:g}")
        workload = "counter"
        if pipeline_code is not None:
            try:
                _, pipeline = load_package(Path(pipeline_code))  # relay build's check, before any stack
            except ConfigError as exc:
                raise ConfigError(f"--pipeline-code must be a pipeline package folder: {exc}") from None
            workload = workload_of(sink_declares(pipeline).get("type"))
            postgres = postgres or workload == "upsert"  # the upsert's table lives on the stack's PostgreSQL
        if not postgres:  # a SQLite ledger has no server to kill
            asked = sorted(POSTGRES_KINDS & set(chosen)) if kinds else []
            if asked:
                raise ConfigError(f"--kinds {','.join(asked)} kills the PostgreSQL ledger: add --postgres")
            chosen = tuple(k for k in chosen if k not in POSTGRES_KINDS)
        msg_rate = 200.0 if rate is None else rate
        if msg_rate <= 0:
            raise ConfigError(f"--rate must be > 0, got {msg_rate:g}")
        return cls(
            seconds=float(window),
            kinds=chosen,
            seed=1 if seed is None else seed,
            rate=msg_rate,
            postgres=postgres,
            lock_seconds=float(lock),
            per_kind=count,
            pipeline_code=Path(pipeline_code).resolve() if pipeline_code is not None else None,
            workload=workload,
            standby=standby,
        )

    @property
    def airflow(self) -> bool:
        """Airflow is started only when its scheduler is one of the kinds (~700 MB, a lot of CPU)."""
        return "scheduler" in self.kinds

    def to_json(self) -> dict[str, Any]:
        code = str(self.pipeline_code) if self.pipeline_code else None
        return {**asdict(self), "kinds": list(self.kinds), "pipeline_code": code}


def parse_kinds(text: str) -> tuple[str, ...]:
    """``"driver,broker"`` -> the kinds in table order; ``all`` means every kind."""
    wanted = [w.strip().lower() for w in text.split(",") if w.strip()]
    if wanted == ["all"]:
        return KINDS
    unknown = sorted(set(wanted) - set(KINDS))
    if unknown or not wanted:
        raise ConfigError(
            f"--kinds takes a comma-separated list of {', '.join(KINDS)} (or all); got {text!r}"
        )
    return tuple(k for k in KINDS if k in wanted)


@dataclass(frozen=True)
class PlannedFault:
    """One fault ``at`` seconds into the fault window; ``target`` refines it (driver: jvm/python/both)."""

    kind: str
    at: float
    index: int
    target: str = ""


@dataclass
class FaultPlan:
    faults: list[PlannedFault] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[PlannedFault]:
        return [f for f in self.faults if f.kind == kind]

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.faults]


LOCKED_SHARE = 0.4  # at most this share of the fault window is spent with the ledger locked


def lock_count(options: ChaosOptions) -> int:
    """How many ledger locks: they cannot overlap, and they may fill at most 40% of the window.

    A lock is not a kill: 22 locks of 65 s do not fit in 10 minutes, and a ledger locked most of
    the time would leave the other faults nothing to hit but a stalled pipeline.
    """
    fit = int(options.seconds * LOCKED_SHARE // options.lock_seconds)
    return max(1, min(options.per_kind, fit, int(options.seconds // (options.lock_seconds + 5))))


def make_plan(options: ChaosOptions) -> FaultPlan:
    """Seeded, stratified schedule: each kind's window is cut into equal slots, one fault per slot.

    Stratified rather than uniform so that a kind never bunches all its faults in one corner of the
    window (the time to the next commit would then measure one long outage, not N faults), while the
    moment inside each slot stays random. Each kind has its own RNG stream, so adding a kind does not
    move the faults of the others.
    """
    faults: list[PlannedFault] = []
    for kind in options.kinds:
        rng = random.Random(f"{options.seed}:{kind}")
        if kind == "ledger-lock":
            n = lock_count(options)
            slot = options.seconds / n
            spread = max(0.0, slot - options.lock_seconds - 5)  # the lock must end inside its slot
        else:
            n = options.per_kind
            slot = options.seconds / n
            spread = slot
        for i in range(n):
            at = round(i * slot + rng.uniform(0, spread), 2)
            target = rng.choice(DRIVER_TARGETS) if kind == "driver" else ""
            faults.append(PlannedFault(kind, min(at, math.floor(options.seconds) - 1), i, target))
    faults.sort(key=lambda f: (f.at, KINDS.index(f.kind)))
    return FaultPlan(faults)


def next_fault_at(planned_at: float, healed_at: float | None, min_up_s: float) -> float:
    """When a kind's next fault may run: at its planned time, but not before ``min_up_s`` after its
    kind's previous fault ended (``healed_at`` None: none was injected yet)."""
    return planned_at if healed_at is None else max(planned_at, healed_at + min_up_s)
