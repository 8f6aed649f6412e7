"""
### relay_upgrade: blue-green upgrade to another code version, with an exact handoff

Calls `relay.operations.upgrade.upgrade` (the same function as `relay upgrade`). Preflight: exactly one
ACTIVE instance, and the Spark master's `/json/` lists exactly that application. The latest offsets H
(or the explicit `handoff`) are read; in one ledger transaction blue's leases close at H and green's open
at H. Green starts from a fresh checkpoint at H while blue drains `[cursor, H)`: no record is applied
twice and none is skipped. If green has not committed within `grace_seconds` (or crashes), the upgrade
is ABORTED: green is fenced and killed, blue gets its leases back and never stopped. Once green has
committed, only forward: blue drains, is stopped gracefully, and the master must list only green.

Every step is persisted (PREFLIGHT, GREEN_STARTING, DRAINING_BLUE, STOPPING_BLUE, DONE / ABORTED /
FAILED), so **a run that died half-way is resumed by triggering this DAG again with the same version**;
two upgrades never run at once. `relay status` shows the last upgrades and their figures.

**Params** (validated when triggered; a bad value is refused): `version` (the target version, a label
as `relay.inputs.validate_version` defines it; its artifact is built from the current code if missing),
`handoff` (`latest` or JSON `{"<topic>": {"0": 42}}`), `grace_seconds`, `drain_timeout_seconds`.

**Retries: 1.** Safe: a retry resumes the persisted upgrade where it stopped.

A failed task is alerted by `RelayAlertNotifier` through the connection `relay_alerts` (see
`relay_health`; logged at ERROR without it).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import Param, get_current_context, task
from relay.inputs import HANDOFF_PATTERN, VERSION_MAX_LENGTH, VERSION_PATTERN
from relay_airflow.dag_factory import relay_dag

log = logging.getLogger("airflow.task")

with relay_dag(
    "relay_upgrade",
    __doc__,
    retries=1,
    params={
        "version": Param(
            type="string",
            minLength=1,
            maxLength=VERSION_MAX_LENGTH,
            pattern=VERSION_PATTERN,  # the rule of relay.inputs.validate_version
            description="target code version",
        ),
        "handoff": Param(
            "latest",
            type="string",
            minLength=1,
            pattern=HANDOFF_PATTERN,
            description='"latest", or explicit offsets as JSON {"topic": {"0": 42}}',
        ),
        "grace_seconds": Param(
            300,
            type="integer",
            minimum=30,
            maximum=3600,
            description="how long green may take to commit its first batch",
        ),
        "drain_timeout_seconds": Param(
            600,
            type="integer",
            minimum=30,
            maximum=7200,
            description="how long blue may take to reach the handoff",
        ),
    },
) as dag:

    @task(execution_timeout=timedelta(hours=3))
    def upgrade_pipeline() -> dict[str, Any]:
        """Run or resume the upgrade; fails the task unless it ends DONE (ABORTED says why)."""
        from airflow.exceptions import AirflowFailException
        from relay.operations.upgrade import upgrade
        from relay_airflow.config import relay_config_from_connections

        p = get_current_context()["params"]
        result = upgrade(
            relay_config_from_connections(),
            p["version"],
            handoff=p["handoff"],
            grace_s=float(p["grace_seconds"]),
            drain_timeout_s=float(p["drain_timeout_seconds"]),
            progress=log.info,
        )
        if result["state"] != "DONE":
            raise AirflowFailException(
                f"upgrade {result['upgrade_id']} ended {result['state']}: {result['error']}"
            )
        return result

    upgrade_pipeline()
