"""Security on by default, against the real embedded stack: the REST submission server refuses what is
not signed with the stack's key; a ledger password reaches the driver and shows nowhere else; the
Airflow admin password is never logged; a URL that names no PostgreSQL ledger is refused."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import jwt
import pytest
import requests
from relay.config import PROJECT_ROOT, RelayConfig
from relay.config.env import config_env
from relay.errors import LedgerNotFoundError
from relay.kafka.producer import produce
from relay.ledger.engine import create_ledger, sqlite_path
from relay.ledger.models import InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.spark.auth import decode_key
from relay.spark.driver_properties import driver_environment, driver_properties
from relay.spark.launcher import spark_client
from relay.spark.rest import create_request
from relay_dev.airflow_local import ADMIN_USER, AirflowApi, LocalAirflow, passwords_file
from relay_dev.pg_namespace import namespace_available
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import URL, make_url

from tests.conftest import free_port

pytestmark = pytest.mark.integration


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _driver_ids(cfg: RelayConfig) -> set[str]:
    state = spark_client(cfg).master_state()
    return {d.id for d in [*state.active_drivers, *state.completed_drivers]}


def _ps() -> str:
    """Every process's full command line: ``-ww``, or ps cuts lines at the terminal width (80
    columns without one) and a secret at the end of a long java command line would go unseen."""
    return subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, check=True).stdout


def _pids_running(*parts: str) -> list[int]:
    """Processes whose command line holds every one of ``parts``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if all(p in cmd for p in parts):
                found.append(int(entry.name))
    return found


def _cwd(pid: int) -> Path | None:
    """A worker starts each driver in ``<work dir>/<driver id>``: tells our driver from others'."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _files_containing(root: Path, needles: list[bytes]) -> list[str]:
    """Every file under ``root`` holding one of ``needles`` (read as bytes: logs, scripts, zips)."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path}: {n!r}" for n in needles if n in data]
    return found


def test_rest_server_refuses_unsigned_and_badly_signed_submissions(stack: RelayConfig) -> None:
    key_text = stack.spark_rest_secret_path.read_text().strip()
    key = decode_key(key_text)
    assert _mode(stack.spark_rest_secret_path) == 0o600 and _mode(stack.data_dir) & 0o077 in (0, 0o010)
    name = f"unsigned-{uuid.uuid4().hex[:6]}"
    app = str(PROJECT_ROOT / "tests" / "integration" / "apps" / "rogue_app.py")
    body = create_request(
        app, ["30"], driver_properties(stack, name, supervise=False, py_files=[]), driver_environment(stack)
    )
    create = f"{stack.spark_rest_url}/v1/submissions/create"
    now = int(time.time())
    other_key = secrets.token_bytes(32)
    attempts = {
        "no header": {},
        "another key": {"Authorization": f"Bearer {jwt.encode({'exp': now + 60}, other_key, 'HS256')}"},
        "expired": {"Authorization": f"Bearer {jwt.encode({'exp': now - 120}, key, 'HS256')}"},
        "unsigned alg none": {"Authorization": f"Bearer {jwt.encode({'exp': now + 60}, None, 'none')}"},
        "not a Bearer": {"Authorization": jwt.encode({"exp": now + 60}, key, "HS256")},
        "garbage": {"Authorization": "Bearer not.a.jws"},
    }
    before = _driver_ids(stack)
    for what, headers in attempts.items():
        reply = requests.post(create, json=body, headers=headers, timeout=10)
        assert reply.status_code == 403, (what, reply.status_code, reply.text[:300])
    for path in ("status/driver-0-0", "kill/driver-0-0", "readyz"):
        method = "POST" if path.startswith("kill") else "GET"
        reply = requests.request(method, f"{stack.spark_rest_url}/v1/submissions/{path}", timeout=10)
        assert reply.status_code == 403, (path, reply.status_code)
    # The filter answers before the servlet: nothing was submitted, so nothing can start later.
    assert _driver_ids(stack) == before
    assert not [a for a in spark_client(stack).master_state().active_apps if a.name == name]
    # Relay's client signs: the same server answers it.
    client = spark_client(stack)
    assert client.ready()
    assert client.driver_status("driver-00000000000000-9999").value == "NOT_FOUND"
    # The key is in a 0600 properties file, never on the master's command line or in its log.
    props = stack.secrets_dir / "spark-master.properties"
    ps = _ps()
    master = [line for line in ps.splitlines() if "deploy.master.Master" in line and str(props) in line]
    assert len(master) == 1, "the master reads its settings from the properties file"
    assert key_text not in ps
    assert _mode(props) == 0o600 and "JWSFilter" in props.read_text()
    assert _files_containing(stack.logs_dir, [key_text.encode()]) == []


@pytest.fixture
def secret_ledger(stack: RelayConfig, postgres_url: str) -> Iterator[tuple[str, str]]:
    """A PostgreSQL role and database whose password holds '@', '/' and ':' (URL, password)."""
    marker = uuid.uuid4().hex
    password = f"Pw@{marker[:10]}/{marker[10:20]}:x%"
    role = f"sec_{marker[:8]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD %(pw)s", {"pw": password})
            conn.exec_driver_sql(f"CREATE DATABASE {role} OWNER {role}")
    finally:
        admin.dispose()
    pg = make_url(postgres_url)
    url = URL.create(
        "postgresql+psycopg2", username=role, password=password, host=pg.host, port=pg.port, database=role
    ).render_as_string(hide_password=False)
    yield url, password


def test_an_empty_postgres_database_is_not_a_ledger_until_created(secret_ledger: tuple[str, str]) -> None:
    url, _ = secret_ledger
    with pytest.raises(LedgerNotFoundError, match=r"no ledger at postgresql\+psycopg2://sec_\w+:\*\*\*@"):
        Ledger(url).instances("p")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert inspect(conn).get_table_names() == [], "refusing created tables"
    finally:
        engine.dispose()
    assert create_ledger(url) is True
    assert Ledger(url).instances("p") == []


def test_ledger_password_shows_in_no_command_line_log_or_status(
    stack: RelayConfig, secret_ledger: tuple[str, str]
) -> None:
    url, password = secret_ledger
    create_ledger(url)
    name = f"sec{uuid.uuid4().hex[:6]}"
    cfg = stack.with_(pipeline=name, topic=name, ledger_url=url, partitions=2, max_offsets_per_trigger=5000)
    produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
    # what would identify the password in any encoding (its random parts are plain hex)
    needles = [password.encode(), password[3:13].encode(), password[14:24].encode()]
    result = deploy(cfg, version="v1", wait_s=300)
    try:
        ledger = Ledger(url)
        inst = ledger.instances(name)[-1]
        assert inst.state is InstanceState.ACTIVE, result
        driver = inst.submission_id or ""
        assert driver.startswith("driver-")
        # The driver got the URL from its environment (it committed through the ledger), and so did
        # the planner process: the source read its lease caps and stop flag there for every batch.
        assert ledger.recent_batches(name, 10, inst.id)

        ps = _ps()
        assert f"--instance-id {inst.id}" in ps, "the driver's command line is visible to everyone"
        assert not [n for n in needles if n.decode() in ps]
        # Positive control: the URL, password included, is in the Python driver's environment.
        driver_dir = cfg.spark_dir / "work" / driver
        pids = [
            p
            for p in _pids_running("pipeline_driver.py", f"--instance-id {inst.id}")
            if _cwd(p) == driver_dir
        ]
        assert pids and all(f"RELAY_LEDGER_URL={url}".encode() in _environ(p) for p in pids)
        assert (driver_dir / "stderr").stat().st_size > 0
        leaks = _files_containing(cfg.logs_dir, needles) + _files_containing(cfg.spark_dir / "work", needles)
        assert leaks == []

        env = {**os.environ, **config_env(cfg), "RELAY_PIPELINE": name, "RELAY_TOPIC": name}
        shown = subprocess.run(
            [str(Path(sys.executable).parent / "relay"), "--json", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr[-2000:]
        status = json.loads(shown.stdout)
        assert status["ledger"].startswith(f"postgresql+psycopg2://{make_url(url).username}:***@")
        assert not [n for n in needles if n.decode() in shown.stdout + shown.stderr]
    finally:
        stopped = stop(cfg, timeout_s=120)
    assert stopped["stopped"], stopped
    assert _files_containing(cfg.logs_dir, needles) + _files_containing(cfg.spark_dir / "work", needles) == []


@pytest.mark.slow  # make test-long (the suite stays near 30 min)
def test_airflow_admin_password_is_never_logged_and_files_are_private(stack: RelayConfig) -> None:
    config = stack.with_(ports=replace(stack.ports, airflow=free_port()))
    airflow = LocalAirflow(config)
    started = airflow.start()
    try:
        assert started["healthy"], started
        path = passwords_file(config)
        assert _mode(path) == 0o600
        password = json.loads(path.read_text())[ADMIN_USER]
        assert AirflowApi(config).dag("relay_deploy") is not None  # logs in with that password
        api_log = config.logs_dir / "airflow-api-server.log"
        assert api_log.stat().st_size > 0
        assert "Password for user" not in api_log.read_text(errors="replace")
        leaks = _files_containing(config.logs_dir, [password.encode()])
        leaks += _files_containing(config.data_dir / "airflow" / "logs", [password.encode()])
        assert leaks == []
    finally:
        airflow.stop()
    ledger_file = sqlite_path(config.ledger_url)
    assert ledger_file is not None and _mode(ledger_file) == 0o600
    if namespace_available(config.data_dir):
        assert _mode(config.data_dir) == 0o700
    else:  # root where mounts are refused: PostgreSQL's group may traverse, nobody else
        assert _mode(config.data_dir) & 0o077 in (0, 0o010)
