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
(explicit JSON `{"0": 42}`). Targets outside earliest..latest are clamped with a warning. Refused while
an upgrade is in progress, and when it would re-apply records unless `allow_reprocess` is set.

**Retries: 0** (an operator decides after a failure; the plan is always safe to re-run).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task

log = logging.getLogger("airflow.task")


def _arguments(p: dict[str, Any]) -> dict[str, Any]:
    from relay.cli import parse_partition_offsets, parse_time_ms

    return {
        "strategy": p["strategy"],
        "timestamp_ms": parse_time_ms(p["time"]) if p["time"] else None,
        "offsets": parse_partition_offsets(p["offsets"]),
        "reason": p["reason"],
        "allow_reprocess": p["allow_reprocess"],
    }


with DAG(
    dag_id="relay_recover",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["relay"],
    default_args={"retries": 0},
    params={
        "strategy": Param("earliest", type="string", enum=["earliest", "latest", "timestamp", "offsets"]),
        "time": Param(
            "", type="string", description="for strategy timestamp: ISO 8601 or epoch milliseconds"
        ),
        "offsets": Param("", type="string", description='for strategy offsets: JSON {"0": 42, "1": 7}'),
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

        p = get_current_context()["params"]
        return recover(relay_config_from_connections(), dry_run=True, progress=log.info, **_arguments(p))

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
