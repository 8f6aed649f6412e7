"""Alternative launcher path: submit a driver through apache-airflow-providers-apache-spark.

What the provider's ``SparkSubmitHook`` can and cannot do here (read in its source, 6.3.4):

- It only runs the ``spark-submit`` binary (a JVM, ~9 s) and scrapes ``driver-...`` from its log;
  it has no REST client of its own (status and kill shell out to ``/usr/bin/curl``).
- ``spark-submit --deploy-mode cluster app.py`` is refused on standalone for Python; the provider
  passes the application through, so the trick is ``java_class=org.apache.spark.deploy.PythonRunner``
  with ``application`` = any jar of ``pyspark/jars`` and ``application_args=[app.py, "", args...]``.
- ``env_vars`` raise in standalone cluster mode, and ``spark.driverEnv.*`` properties show up in the
  worker's log and the driver's command line: no place for the ledger URL (it may hold a password)
  or the launch token.
- spark-submit's REST client cannot sign its requests, and Relay's REST server requires a signed
  token (JWS filter): through the REST port every submission is refused (403).

So this path uses the legacy submission gateway (the connection's port = the master's RPC port,
``spark.master.rest.enabled=false``): its client hands spark-submit's own environment to the driver,
which is how the secrets travel here (a minimal environment, so nothing of Airflow's reaches the
driver). ``submit()`` returns the driver id and leaves the driver running
(``spark.standalone.submit.waitAppCompletion`` is false by default). Note the RPC port has no
authentication of its own (Spark 4 refuses ``spark.authenticate`` with the REST server on): it must
stay on a trusted network (the embedded stack binds 127.0.0.1).

So it works, but it costs a JVM per submission and log scraping; the library's
:class:`relay.spark.rest.SparkStandaloneClient` posts the same CreateSubmissionRequest directly.
``relay bench --only submit`` times both on the same trivial driver (2 cores, load 4-11): submit to
driver id, median of 3, 85 ms through the REST client and 19.5 s through this module (7.4 CPU seconds
and a 179 MiB JVM per submission), and spark-submit against the signed REST port is refused with
``HTTP ERROR 403 Authorization header is missing``. This module is kept as an option for deployments
that standardise on the provider's ``spark`` connection.
"""

from __future__ import annotations

import os

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from relay.artifacts import artifact, build_artifact, check_deployable
from relay.config import RelayConfig
from relay.errors import SparkError
from relay.ledger.models import Instance
from relay.ledger.store import Ledger
from relay.spark.driver_properties import driver_properties
from relay.spark.install import spark_home
from relay.spark.launcher import driver_args, submission_environment
from relay.spark.rest import PYTHON_RUNNER

SUBMIT_CONN_ID = "relay_spark_submit"


def carrier_jar() -> str:
    """Any jar satisfies spark-submit's "not a .py file" check; PythonRunner runs the script."""
    jars = sorted((spark_home() / "jars").glob("spark-core_*.jar"))
    if not jars:
        raise SparkError(f"no spark-core jar in {spark_home() / 'jars'}")
    return str(jars[0])


def submit_with_provider(
    config: RelayConfig, ledger: Ledger, instance: Instance, conn_id: str = SUBMIT_CONN_ID
) -> str:
    """Submit the instance's driver (cluster mode, supervised) with SparkSubmitHook; record its id.

    Same contract and same artifact (frozen job file + code zip of the version) as
    :func:`relay.spark.launcher.launch`; returns the submission (driver) id.
    """
    art = artifact(config, instance.version)
    if not art.exists():
        build_artifact(config, instance.version)
    secrets = check_deployable(config, art)  # a user pipeline's: matches the config, has its settings
    code = str(art.zip_file)
    props = driver_properties(
        config,
        instance.app_name,
        supervise=True,
        py_files=[code],
        extra={"spark.driverEnv.PYTHONPATH": code, "spark.executorEnv.PYTHONPATH": code},
    )
    env = submission_environment(config, code, ledger.issue_launch_token(instance.id), secrets)
    driver_id = submit_python_driver(
        config, str(art.job_file), driver_args(config, instance, True), props, env, conn_id
    )
    ledger.set_instance(instance.id, submission_id=driver_id)
    return driver_id


def submit_python_driver(
    config: RelayConfig,
    app_file: str,
    app_args: list[str],
    props: dict[str, str],
    env: dict[str, str],
    conn_id: str = SUBMIT_CONN_ID,
) -> str:
    """One cluster-mode Python driver through SparkSubmitHook (a ``spark-submit`` JVM); its driver id.

    ``props`` as :func:`relay.spark.driver_properties.driver_properties` builds them (its ``spark.master`` is
    dropped: the connection decides), ``env`` the driver's environment (secrets included): it is
    spark-submit's own, which the legacy gateway hands to the driver. Also what ``relay bench --only
    submit`` times against :class:`relay.spark.rest.SparkStandaloneClient`.
    """
    props = {k: v for k, v in props.items() if k != "spark.master"}  # the connection decides the master URL
    props["spark.master.rest.enabled"] = "false"  # the legacy gateway forwards the environment below
    hook = SparkSubmitHook(
        conf=props,
        conn_id=conn_id,
        java_class=PYTHON_RUNNER,
        name=props.get("spark.app.name", "relay"),
        application_args=[app_file, props.get("spark.submit.pyFiles", ""), *app_args],
        deploy_mode="cluster",
        spark_binary="spark-submit",
    )
    tmp = config.spark_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # The driver inherits this whole environment: only what spark-submit and the driver need.
    full_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "JAVA_HOME")}
    full_env.update(env)
    full_env.update(SPARK_SUBMIT_OPTS=f"-Djava.io.tmpdir={tmp}", TMPDIR=str(tmp))
    driver_id = hook.submit(carrier_jar(), env=full_env)
    if not driver_id:
        raise SparkError("spark-submit finished without reporting a driver id")
    return driver_id
