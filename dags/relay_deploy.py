"""
### relay_deploy: start the pipeline if nothing of it runs

Calls `relay.operations.deploy.deploy` (the same function as `relay deploy`): preflight (the ledger and
the Spark master's `/json/` must both show nothing running, else the run fails with "already running"
and starts nothing), create an instance holding the ledger's unfinished ranges (or the `starting`
position on a first start), submit its driver in cluster mode through the Spark REST server
(supervised), and wait up to `wait_seconds` for its first committed batch.

**Params** (validated when triggered; a bad value is refused): `version` (code version label as
`relay.inputs.validate_version` defines it, or empty for the version that ran last),
`starting` (`earliest` | `latest`, first start only), `wait_seconds` (30..1800).

**Retries: 0.** A retry after a failure in the middle (driver submitted, no first commit yet) would
meet the instance it just started and fail with "already running", hiding the first error; deciding
what to do is an operator's call (`relay_stop`, then deploy again). The task times out after
35 minutes, beyond the longest allowed wait.

Addresses come from the connections `relay_spark`, `relay_kafka`, `relay_ledger` over `RELAY_*`.

A failed task is alerted by `RelayAlertNotifier` through the connection `relay_alerts` (see
`relay_health`; logged at ERROR without it).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import Param, get_current_context, task
from relay.inputs import OPTIONAL_VERSION_PATTERN, VERSION_MAX_LENGTH
from relay_airflow.dag_factory import relay_dag

log = logging.getLogger("airflow.task")

with relay_dag(
    "relay_deploy",
    __doc__,
    params={
        "version": Param(
            "",
            type="string",
            maxLength=VERSION_MAX_LENGTH,
            pattern=OPTIONAL_VERSION_PATTERN,  # the rule of relay.inputs.validate_version, or empty
            description=(
                "code version label of the new instance; empty = the version the pipeline ran last "
                "(v1 on a first deploy)"
            ),
        ),
        "starting": Param(
            "earliest",
            type="string",
            enum=["earliest", "latest"],
            description="where a first start reads from (later starts resume from the ledger)",
        ),
        "wait_seconds": Param(
            300,
            type="integer",
            minimum=30,
            maximum=1800,
            description="how long to wait for the first committed batch",
        ),
    },
) as dag:

    @task(execution_timeout=timedelta(minutes=35))
    def deploy_pipeline() -> dict[str, Any]:
        """Deploy; the returned summary (instance, driver, leases, timings) is the task's XCom."""
        from relay.operations.deploy import deploy
        from relay_airflow.config import relay_config_from_connections

        params = get_current_context()["params"]
        return deploy(
            relay_config_from_connections(),
            version=params["version"] or None,
            starting=params["starting"],
            wait_s=float(params["wait_seconds"]),
            progress=log.info,
        )

    deploy_pipeline()
