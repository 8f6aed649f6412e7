"""Section ``submit``: submitting a driver until its driver id is known, through Relay's REST client
and through the Spark provider's ``SparkSubmitHook`` (``relay_airflow.provider_submit``).

Both sides submit the same trivial cluster-mode Python driver (it prints a line and exits: no
SparkContext, no executors) with the same properties from
:func:`relay.spark.driver_properties.driver_properties`,
``SUBMITS`` times each, one after the other: each driver must end (FINISHED) before the next
submission, so one driver's JVM does not slow the next submission down. Timed: from the call to the
returned driver id, the client's CPU time for it, and for spark-submit its JVM's peak RSS.

- REST: :class:`relay.spark.rest.SparkStandaloneClient` (as :func:`relay.spark.launcher.launch` builds it,
  a fresh client per submission, signed ``POST /v1/submissions/create``), in this process.
- Provider: :func:`relay_airflow.provider_submit.submit_python_driver`, in a subprocess with the
  stack's Airflow environment (the ``relay_spark_submit`` connection), so that this package never
  imports Airflow; Airflow's import is not timed (a worker has it loaded). The subprocess also tries
  spark-submit once against the signed REST port (``spark.master.rest.enabled=true``): its REST
  client cannot sign, so the master must refuse it.

Never a driver left behind: every driver id the section learns is waited for and killed by its id when
it has not ended, and at the end any driver the master lists that was not there before is killed by
its id too (the section's own; a supervised pipeline driver keeps its id across relaunches).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import OperationError

from .context import Context, kill_child
from .results import figure
from .stats import fmt_number, summarize

SUBMITS = 3
DRIVER_END_TIMEOUT_S = 180.0
APP_NAME = "relay-bench-submit"
CHILD = "import sys; from relay_dev.bench.submit import main; main(sys.argv[1:])"
TRIVIAL_DRIVER = '''"""relay bench --only submit: a cluster-mode Python driver that starts and exits."""
print("relay bench submit: the trivial driver ran")
'''


def trivial_driver(work_dir: Path) -> Path:
    path = work_dir / "submit" / "trivial_driver.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TRIVIAL_DRIVER)
    return path


def submission(config: RelayConfig, app_file: Path, label: str) -> tuple[dict[str, str], dict[str, str]]:
    """(sparkProperties, environment) of the trivial driver: unsupervised, nothing secret."""
    from relay.spark.driver_properties import driver_environment, driver_properties

    return driver_properties(config, f"{APP_NAME}-{label}", supervise=False, py_files=[]), driver_environment(
        config
    )


def end_driver(
    config: RelayConfig, driver_id: str, timeout_s: float = DRIVER_END_TIMEOUT_S
) -> dict[str, Any]:
    """Wait for the driver to end; kill it by its id when it has not (never left running)."""
    from relay.polling import poll
    from relay.spark.launcher import spark_client
    from relay.spark.rest import DriverState

    client = spark_client(config)
    t0 = time.monotonic()
    state = client.driver_status(driver_id)

    def ended() -> bool | None:
        nonlocal state
        state = client.driver_status(driver_id)
        return True if state.is_final else None

    if not state.is_final:
        poll(ended, timeout_s)
    killed = False
    if not state.is_final:
        killed = client.kill(driver_id)
    return {
        "driver_id": driver_id,
        "state": state.value,
        "ended_after_s": round(time.monotonic() - t0, 2),
        "killed": killed,
        "ok": state == DriverState.FINISHED,
    }


def rest_submits(config: RelayConfig, app_file: Path, n: int, known: list[str]) -> list[dict[str, Any]]:
    """``n`` submissions through Relay's REST client, timed in this process (this thread's CPU)."""
    from relay.spark.launcher import spark_client

    out = []
    for i in range(n):
        props, env = submission(config, app_file, f"rest-{i}")
        t0, cpu0 = time.perf_counter(), time.thread_time()
        client = spark_client(config)  # as launch() does: a fresh client, its key read, requests signed
        driver_id = client.submit_python(str(app_file), [], props, env)
        seconds, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        client.close()
        known.append(driver_id)
        out.append({"ms": seconds * 1000, "cpu_ms": cpu * 1000, **end_driver(config, driver_id)})
    return out


def _children_rusage() -> tuple[float, float]:
    """(user + system CPU seconds, peak RSS in MiB) of the waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss / 1024


def provider_child(spec_path: Path) -> None:
    """The subprocess side: ``n`` timed submissions through the provider's hook, one JSON line each,
    then one spark-submit against the signed REST port (a JSON line ``{"rest_port_probe": ...}``)."""
    from relay.config import load_config

    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))
    from relay_airflow.provider_submit import submit_python_driver

    spec = json.loads(spec_path.read_text())
    config = load_config(os.environ)
    app_file = Path(spec["app_file"])
    for i in range(int(spec["n"])):
        props, env = submission(config, app_file, f"provider-{i}")
        cpu0, _ = _children_rusage()
        t0 = time.perf_counter()
        driver_id = submit_python_driver(config, str(app_file), [], props, env)
        seconds = time.perf_counter() - t0
        cpu1, rss = _children_rusage()
        print(json.dumps({"driver_id": driver_id}), flush=True)  # known to the parent before the wait
        row = {"ms": seconds * 1000, "cpu_ms": (cpu1 - cpu0) * 1000, "jvm_peak_rss_mb": rss}
        print(json.dumps({**row, **end_driver(config, driver_id)}), flush=True)
    print(json.dumps({"rest_port_probe": rest_port_probe(config, app_file)}), flush=True)


def rest_port_probe(config: RelayConfig, app_file: Path) -> dict[str, Any]:
    """spark-submit (through the hook) to the REST submission server, which requires signed tokens."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from relay.spark.rest import PYTHON_RUNNER
    from relay_airflow.provider_submit import carrier_jar

    host, port = config.spark_rest_url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    conn = {
        "conn_type": "spark",
        "host": f"spark://{host}",
        "port": int(port),
        "extra": {"deploy-mode": "cluster", "spark-binary": "spark-submit"},
    }
    os.environ["AIRFLOW_CONN_RELAY_BENCH_SPARK_REST"] = json.dumps(conn)
    props, env = submission(config, app_file, "provider-rest-port")
    props = {k: v for k, v in props.items() if k != "spark.master"}
    props["spark.master.rest.enabled"] = "true"
    hook = SparkSubmitHook(
        conf=props,
        conn_id="relay_bench_spark_rest",
        java_class=PYTHON_RUNNER,
        name=props["spark.app.name"],
        application_args=[str(app_file), ""],
        deploy_mode="cluster",
        spark_binary="spark-submit",
    )
    tmp = config.spark_dir / "tmp"
    full_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "JAVA_HOME")}
    full_env.update(env, SPARK_SUBMIT_OPTS=f"-Djava.io.tmpdir={tmp}", TMPDIR=str(tmp))
    t0 = time.perf_counter()
    try:
        driver_id = hook.submit(carrier_jar(), env=full_env)
        error = None
    except Exception as exc:  # noqa: BLE001 - the refusal is the expected outcome
        driver_id, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    lines = [ln for ln in (error or "").splitlines() if "403" in ln or "Forbidden" in ln or "Exception" in ln]
    out: dict[str, Any] = {"ms": seconds * 1000, "refused": driver_id is None, "evidence": lines[-5:]}
    if driver_id:
        print(json.dumps({"driver_id": driver_id}), flush=True)
        out.update(end_driver(config, driver_id, timeout_s=5))  # not expected: killed at once
    return out


def provider_submits(ctx: Context, app_file: Path, n: int, known: list[str]) -> tuple[list[dict], dict]:
    """Run the provider side in a subprocess (own session, killed by its PID on any failure)."""
    from relay_dev.airflow_local import airflow_env

    spec = ctx.work_dir / "submit" / "spec.json"
    spec.write_text(json.dumps({"app_file": str(app_file), "n": n}))
    log_path = ctx.work_dir / "logs" / "submit-provider.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = airflow_env(ctx.config)  # AIRFLOW_HOME under the bench's data dir, the relay_spark_submit conn
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, "--provider-child", str(spec)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(PROJECT_ROOT),
            env=env,
        )
    ctx.children.append(proc)
    rows: list[dict[str, Any]] = []
    probe: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("{"):
                continue
            item = json.loads(line)
            if set(item) == {"driver_id"}:
                known.append(item["driver_id"])
            elif "rest_port_probe" in item:
                probe = item["rest_port_probe"]
            else:
                rows.append(item)
                ctx.progress(f"submit: provider {len(rows)}/{n}: {item['driver_id']} in {item['ms']:.0f} ms")
        proc.wait(timeout=60)
    finally:
        kill_child(proc)
    if proc.returncode != 0 or len(rows) != n:
        raise OperationError(
            f"the provider's submissions failed (exit {proc.returncode}, {len(rows)} of {n}); see {log_path}"
        )
    return rows, probe


def leftover_drivers(config: RelayConfig, before: set[str], known: list[str]) -> list[str]:
    """Kill by id every driver of this section that has not ended: the ids it learnt, and any driver
    the master lists as active that was not there before the section."""
    from relay.spark.launcher import spark_client

    client = spark_client(config)
    active = {d.id for d in client.master_state().active_drivers}
    killed = []
    for driver_id in sorted((active - before) | (set(known) & active)):
        if client.kill(driver_id):
            killed.append(driver_id)
    return killed


def _headline(evidence: list[str]) -> str:
    """The line of spark-submit's output that says why (Jetty's "HTTP ERROR 403 ..."), else the last."""
    why = next((ln for ln in evidence if "HTTP ERROR" in ln), evidence[-1] if evidence else "")
    return why.replace("<h2>", "").replace("</h2>", "").strip()[:160]


def section_submit(ctx: Context) -> dict[str, Any]:
    from relay.spark.launcher import spark_client

    cfg = ctx.config
    app_file = trivial_driver(ctx.work_dir)
    before = {d.id for d in spark_client(cfg).master_state().active_drivers}
    known: list[str] = []
    try:
        ctx.progress(f"submit: {SUBMITS} trivial drivers through Relay's REST client (relay.spark.rest)")
        rest = rest_submits(cfg, app_file, SUBMITS, known)
        for r in rest:
            ms, state, later = f"{r['ms']:.1f}", r["state"], r["ended_after_s"]
            ctx.progress(f"submit: REST {r['driver_id']} in {ms} ms ({state} {later} s later)")
        ctx.progress(
            f"submit: {SUBMITS} through SparkSubmitHook (relay_airflow.provider_submit), a subprocess"
        )
        provider, probe = provider_submits(ctx, app_file, SUBMITS, known)
    finally:
        killed = leftover_drivers(cfg, before, known)
        if killed:
            ctx.progress(f"submit: killed leftover driver(s) {', '.join(killed)}")
    bad = [r["driver_id"] + " " + r["state"] for r in rest + provider if not r["ok"]]
    if bad:
        raise OperationError(f"trivial drivers did not finish cleanly: {', '.join(bad)}")
    r_ms, p_ms = summarize([r["ms"] for r in rest]), summarize([r["ms"] for r in provider])
    r_cpu, p_cpu = summarize([r["cpu_ms"] for r in rest]), summarize([r["cpu_ms"] for r in provider])
    rss = max(r["jvm_peak_rss_mb"] for r in provider)
    ctx.progress(
        f"submit: median to driver id REST {fmt_number(r_ms['median'])} ms, "
        f"SparkSubmitHook {fmt_number(p_ms['median'])} ms; spark-submit to the signed REST port: "
        + ("refused" if probe.get("refused") else "ACCEPTED")
        + (f" ({_headline(probe.get('evidence', []))})" if probe.get("evidence") else "")
    )
    figures = [
        figure("submit -> driver id, REST client, median", r_ms["median"], "ms"),
        figure("submit -> driver id, REST client, max", r_ms["max"], "ms"),
        figure(
            "submit -> driver id, SparkSubmitHook, median",
            p_ms["median"],
            "ms",
            "REST client median",
            r_ms["median"],
        ),
        figure(
            "submit -> driver id, SparkSubmitHook, max", p_ms["max"], "ms", "REST client max", r_ms["max"]
        ),
        figure(
            "client CPU per submit, SparkSubmitHook, median",
            p_cpu["median"],
            "ms",
            "REST client",
            r_cpu["median"],
        ),
        figure("spark-submit JVM peak RSS", rss, "MiB"),
        figure(
            "spark-submit to the signed REST port: refused",
            1 if probe.get("refused") else 0,
            "yes=1",
            better="higher",
        ),
    ]
    return {
        "figures": figures,
        "details": {
            "submits": SUBMITS,
            "rest": {"ms": r_ms, "cpu_ms": r_cpu, "runs": rest},
            "provider": {"ms": p_ms, "cpu_ms": p_cpu, "jvm_peak_rss_mb": rss, "runs": provider},
            "rest_port_probe": probe,
            "killed_leftovers": killed,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the provider side of `relay bench --only submit`")
    parser.add_argument("--provider-child", type=Path, required=True, help="the section's spec.json")
    provider_child(parser.parse_args(argv).provider_child)


if __name__ == "__main__":
    main()
