"""The scheduled health check of one pipeline (DAG ``relay_health`` and ``relay health``).

Health compares the ledger's inside view (instances, attempts, leases, batches) with the outside views
(the Spark master's applications, Kafka's offsets) and turns every finding into a :class:`Check` with
a level and a next step an operator can run. It never raises because something is down: a job that is
not running, an unreachable broker or master are exactly what it must report. Each check is a small
pure function over plain inputs, so the rules are unit-tested on real ledgers without a cluster.

Progress follows Burrow's consumer-lag evaluation rules (OK, WARN, STALL, STOP, ERR) over a sliding
window of the cursor history (the ``batches`` table) and the lag history (previous health reports).

Modules: ``report`` (levels, Check, HealthReport, Thresholds), ``apps`` (the master's applications,
each filed by what the ledger says of it), ``checks_instance`` (single instance, stopped on purpose),
``checks_driver`` (restarts, crash loops, failures), ``checks_progress`` (Burrow's rules, rates),
``checks_kafka`` (lag, retention, topic identity), ``checks_batches`` (latency, dead letters),
``checks_airflow``, ``checks_standby``, ``views`` (both views gathered once), ``run`` (``run_health``:
the checks in order, the report), ``run_kafka`` (its Kafka side). Every function is at most 60 lines
(tests/unit/test_health_size.py): one small function per finding or situation, its inputs gathered
before it judges.
"""

from relay.health.apps import instance_of_app
from relay.health.checks_batches import check_dead_letters, check_latency
from relay.health.checks_driver import check_driver
from relay.health.checks_instance import check_single_instance, is_upgrade, live_attempts
from relay.health.checks_kafka import check_lag, check_retention
from relay.health.checks_progress import (
    check_progress,
    cursor_moves,
    earliest_rates,
    history_samples,
    produce_rates,
    window_samples,
)
from relay.health.report import (
    DEPLOY,
    REFUSAL_WINDOW_S,
    REPORT_KIND,
    STOP,
    Check,
    HealthReport,
    Level,
    PartitionStatus,
    RunState,
    Thresholds,
)
from relay.health.run import run_health

__all__ = [
    "DEPLOY",
    "REFUSAL_WINDOW_S",
    "REPORT_KIND",
    "STOP",
    "Check",
    "HealthReport",
    "Level",
    "PartitionStatus",
    "RunState",
    "Thresholds",
    "check_dead_letters",
    "check_driver",
    "check_lag",
    "check_latency",
    "check_progress",
    "check_retention",
    "check_single_instance",
    "cursor_moves",
    "earliest_rates",
    "history_samples",
    "instance_of_app",
    "is_upgrade",
    "live_attempts",
    "produce_rates",
    "run_health",
    "window_samples",
]
