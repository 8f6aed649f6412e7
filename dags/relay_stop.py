"""
### relay_stop: stop the pipeline gracefully and verify nothing of it runs

Calls `relay.operations.stop.stop` (the same function as `relay stop`): every live instance is asked
to stop between batches (offsets == commits); one that does not within `timeout_seconds` is fenced
in the ledger (it can no longer commit) and killed. Then the Spark master's `/json/` must list no
application of the pipeline, else the run fails.

**Params**: `timeout_seconds` (5..900): graceful-stop wait per instance.

**Retries: 0.** A failed stop leaves a state someone must look at (an application the master still
lists); retrying blindly would fence/kill again without a human noticing. Stopping twice is safe, so
re-trigger by hand after reading the log. The task times out after 20 minutes.

A failed task is alerted by `RelayAlertNotifier` through the connection `relay_alerts` (see
`relay_health`; logged at ERROR without it).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import Param, get_current_context, task
from relay_airflow.dag_factory import relay_dag

log = logging.getLogger("airflow.task")

with relay_dag(
    "relay_stop",
    __doc__,
    params={
        "timeout_seconds": Param(
            120,
            type="integer",
            minimum=5,
            maximum=900,
            description="graceful-stop wait per instance before fencing and killing it",
        ),
    },
) as dag:

    @task(execution_timeout=timedelta(minutes=20))
    def stop_pipeline() -> dict[str, Any]:
        """Stop; the returned summary (instances, graceful or not, seconds) is the task's XCom."""
        from relay.operations.stop import stop
        from relay_airflow.config import relay_config_from_connections

        params = get_current_context()["params"]
        return stop(
            relay_config_from_connections(), timeout_s=float(params["timeout_seconds"]), progress=log.info
        )

    stop_pipeline()
