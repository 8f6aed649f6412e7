"""
### relay_recover: offset-reset recovery when retention deleted what the checkpoint points at

Calls `relay.operations.recover` (the same functions as `relay recover`). **Dry run by default**: the
`plan` task prints, per partition, the cursor, earliest and latest offsets, the target, the records
that will be declared lost (retention took them) and those skipped on purpose, and changes nothing.
With `dry_run` false, `execute` stops whatever runs (verified through the Spark master's REST view),
archives the old checkpoints (renamed, never deleted), records lost and skipped ranges as gaps with
`reason`, opens new leases at the targets, starts a fresh instance and waits for its first commit.
The pipeline's results (the count) live in the ledger and are untouched.

Strategies: `earliest` (resume at the cursor, or the earliest offset still available where retention
took it), `latest`, `timestamp` (first offset at or after `time`, ISO 8601 or epoch ms), `offsets`
(explicit, a JSON object `{"0": 42}` of partition -> offset). Targets outside earliest..latest are
clamped with a warning. Refused while an upgrade is in progress, and when it would re-apply records
unless `allow_reprocess` is set.

**Params** are validated when triggered (a bad value is refused with HTTP 400): `time` must be epoch
milliseconds or ISO 8601, `offsets` an object of non-negative partition -> non-negative offset. Rules
across params (strategy `timestamp` needs `time`, `offsets` needs `offsets`, neither may be given with
another strategy) fail the `plan` task at once with one line, before anything is read or changed.

**Retries: 0** (an operator decides after a failure; the plan is always safe to re-run).

A failed task is alerted by `RelayAlertNotifier` through the connection `relay_alerts` (see
`relay_health`; logged at ERROR without it).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import Param, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException
from relay.errors import ConfigError
from relay.inputs import OFFSETS_SCHEMA, STRATEGIES, TIME_PATTERN, recover_inputs
from relay_airflow.dag_factory import relay_dag

log = logging.getLogger("airflow.task")


def _arguments(p: dict[str, Any]) -> dict[str, Any]:
    """The recovery's arguments, checked across params first: a bad combination fails the task with
    one line before the ledger or Kafka is touched (a per-param schema cannot express these rules)."""
    try:
        checked = recover_inputs(p["strategy"], p["time"], p["offsets"])
    except ConfigError as exc:
        raise AirflowFailException(f"relay_recover refused its params: {exc}") from None
    return {
        "strategy": checked.strategy,
        "timestamp_ms": checked.timestamp_ms,
        "offsets": checked.offsets,
        "reason": p["reason"],
        "allow_reprocess": p["allow_reprocess"],
    }


with relay_dag(
    "relay_recover",
    __doc__,
    params={
        "strategy": Param("earliest", type="string", enum=list(STRATEGIES)),
        "time": Param(
            "",
            type="string",
            maxLength=40,
            pattern=TIME_PATTERN,
            description="for strategy timestamp: ISO 8601 (2024-05-01T12:00:00Z) or epoch milliseconds",
        ),
        "offsets": Param(
            {},
            description='for strategy offsets: partition -> offset, e.g. {"0": 42, "1": 7}',
            **OFFSETS_SCHEMA,
        ),
        "dry_run": Param(True, type="boolean", description="only print the plan (default)"),
        "reason": Param("", type="string", maxLength=500, description="why (recorded with the gaps)"),
        "allow_reprocess": Param(False, type="boolean", description="allow moving cursors backwards"),
    },
) as dag:

    @task(execution_timeout=timedelta(minutes=10))
    def plan() -> dict[str, Any]:
        """Always: the plan, printed as a table and returned as JSON."""
        from relay.operations.recover import recover
        from relay_airflow.config import relay_config_from_connections

        arguments = _arguments(get_current_context()["params"])  # first: refuse before reading anything
        return recover(relay_config_from_connections(), dry_run=True, progress=log.info, **arguments)

    @task(execution_timeout=timedelta(minutes=40))
    def execute(_plan: dict[str, Any]) -> dict[str, Any]:
        """Only when dry_run is false: do it, and wait for the new instance's first commit."""
        from airflow.exceptions import AirflowSkipException
        from relay.operations.recover import recover
        from relay_airflow.config import relay_config_from_connections

        p = get_current_context()["params"]
        if p["dry_run"]:
            raise AirflowSkipException("dry run: the plan above was not executed")
        return recover(relay_config_from_connections(), dry_run=False, progress=log.info, **_arguments(p))

    execute(plan())
