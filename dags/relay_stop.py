"""
### relay_stop: stop the pipeline gracefully and verify nothing of it runs

```
stop -> verify_none_runs
```

The same steps as `relay stop` (`relay.operations.stop`), one task each:

* **stop**: every live instance is asked to stop between batches (offsets == commits); the task then
  waits **deferred** (no worker held; the triggerer polls the Spark master for their drivers) up to
  `timeout_seconds`; an instance still running then is fenced in the ledger (it can no longer
  commit) and killed.
* **verify_none_runs** (deferrable): the Spark master's `/json/` must list no application of the
  pipeline within 60 s, and the ledger no live instance, else the task fails.

**Params**: `pipeline` (the pipeline the run acts on, one of the declared ones: see the README's
"Several pipelines"), `timeout_seconds` (5..900): graceful-stop wait.

**Clearing:** both tasks may be cleared and rerun: `stop` finds nothing live and moves on, the check
looks again.

**Retries: 0.** A failed stop leaves a state someone must look at (an application the master still
lists); retrying blindly would fence/kill again without a human noticing. Stopping twice is safe, so
re-trigger (or clear `stop`) by hand after reading the log.

A failed task is alerted by `RelayAlertNotifier` through the connection `relay_alerts` (see
`relay_health`; logged at ERROR without it).
"""

from __future__ import annotations

from airflow.sdk import Param
from relay_airflow.dag_factory import pipeline_param, relay_dag
from relay_airflow.tasks import stop as steps

with relay_dag(
    "relay_stop",
    __doc__,
    params={
        "pipeline": pipeline_param(),
        "timeout_seconds": Param(
            120,
            type="integer",
            minimum=5,
            maximum=900,
            description="graceful-stop wait before fencing and killing what still runs",
        ),
    },
) as dag:
    stop, verify = steps.stop_and_verify()
    stop >> verify
