"""Security defaults without services: masked URLs, strict ledger opening, file modes, signed REST
requests, and no secret in a driver's command line or Spark options."""

from __future__ import annotations

import grp
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from kafka_source_options import SourceSettings
from relay import cli
from relay.artifacts import artifact, build_artifact, require_env_interface
from relay.config import load_config
from relay.config.secret_files import ensure_user_password
from relay.errors import ConfigError, LedgerError, LedgerNotFoundError, SparkError
from relay.ledger.engine import create_ledger, ledger_exists, safe_url
from relay.ledger.models import Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.spark.auth import RestSigner, decode_key, ensure_secret_file, signer_for
from relay.spark.driver_properties import driver_properties
from relay.spark.launcher import LEDGER_URL_ENV, driver_args, submission_environment
from relay.spark.rest import MasterState, SparkStandaloneClient
from relay_dev import pg_namespace, postgres_local
from relay_dev.airflow_local import ADMIN_USER, airflow_env, passwords_file
from relay_dev.postgres_local import restrict_dir
from relay_dev.stack import LocalStack, Part
from relay_dev.stack_setup import REST_UNPROTECTED, master_properties_file, prepare_data_dir
from relay_dev.supervision import Program, Supervisor
from sqlalchemy import create_engine

PASSWORD = "p@ss/w:rd@x"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- masked URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (
            "postgresql+psycopg2://relay:p%40ss%2Fw%3Ard@db:5432/relay",
            "postgresql+psycopg2://relay:***@db:5432/relay",
        ),
        # not URL-encoded: SQLAlchemy alone would show "ss/w:rd@x..." as part of the host
        (
            f"postgresql+psycopg2://relay:{PASSWORD}@db:5432/relay",
            "postgresql+psycopg2://relay:***@db:5432/relay",
        ),
        ("postgresql+psycopg2://relay:a/b:c@db/relay", "postgresql+psycopg2://relay:***@db/relay"),
        ("postgresql+psycopg2://db/relay", "postgresql+psycopg2://db/relay"),
        ("sqlite:////var/relay/ledger.db", "sqlite:////var/relay/ledger.db"),
    ],
)
def test_safe_url_shows_no_part_of_the_password(url: str, masked: str) -> None:
    assert safe_url(url) == masked
    assert Ledger(url).safe_url == masked  # no connection is made for that


# -- strict opening ----------------------------------------------------------------------------------


def test_opening_a_missing_sqlite_ledger_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "typo" / "ledger.db"
    with pytest.raises(LedgerNotFoundError, match=r"no ledger at sqlite:///.*typo/ledger.db; create one"):
        Ledger(f"sqlite:///{db}").instances("p")
    assert not db.exists() and not db.parent.exists()
    assert ledger_exists(f"sqlite:///{db}") is False and not db.parent.exists()


def test_a_file_without_relay_schema_is_not_a_ledger(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    engine.dispose()
    with pytest.raises(LedgerNotFoundError, match="relay ledger init"):
        Ledger(f"sqlite:///{db}").instances("p")
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        tables = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")}
    engine.dispose()
    assert tables == {"t"}, "refusing must not migrate a foreign database"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"], "nor switch it to WAL"


def test_explicit_create_makes_a_0600_ledger_and_opening_it_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'ledger.db'}"
    assert create_ledger(url) is True
    assert mode(tmp_path / "new" / "ledger.db") == 0o600
    assert create_ledger(url) is False  # idempotent
    ledger = Ledger(url)
    with ledger.tx() as conn:
        ledger.create_instance(conn, "p", "v1", Color.BLUE, "", "relay-p-1")
    assert [i.state for i in ledger.instances("p")] == [InstanceState.STARTING]
    for path in (tmp_path / "new").iterdir():  # WAL and SHM files copy the file's mode
        assert mode(path) == 0o600, path


def test_a_ledger_of_the_hand_written_migrations_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """Before Alembic, ``relay_schema`` held the version (7 to 9): such a ledger is refused, unchanged.
    The Alembic migrations themselves: ``test_ledger_migrations.py``."""
    db = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:  # as a version 9 ledger says
        conn.exec_driver_sql("CREATE TABLE relay_schema (version INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO relay_schema VALUES (9)")
    assert ledger_exists(f"sqlite:///{db}") is True  # a ledger, not a typo: refused for its age instead
    for open_it in (
        lambda: Ledger(f"sqlite:///{db}").instances("p"),
        lambda: create_ledger(f"sqlite:///{db}"),
    ):
        with pytest.raises(LedgerError, match=r"schema version 9.*create a new ledger"):
            open_it()
    with engine.connect() as conn:
        tables = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")}
    engine.dispose()
    assert tables == {"relay_schema"}


def test_cli_refuses_a_mistyped_ledger_url_and_ledger_init_creates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledgr.db"
    monkeypatch.setenv("RELAY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RELAY_LEDGER_URL", f"sqlite:///{db}")
    assert cli.main(["status"]) == 1
    assert "no ledger at" in capsys.readouterr().err and not db.exists()
    assert cli.main(["--json", "ledger", "init"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] is True and mode(db) == 0o600


# -- file modes --------------------------------------------------------------------------------------


def test_stack_prepares_a_private_data_dir_and_a_0600_signing_key(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path / "var")})
    (tmp_path / "var").mkdir(mode=0o755)
    prepare_data_dir(config, lambda _: None)
    assert mode(config.data_dir) == 0o700
    key_file = config.spark_rest_secret_path
    assert mode(key_file) == 0o600 and mode(key_file.parent) == 0o700
    key = key_file.read_text().strip()
    assert len(decode_key(key)) == 32
    prepare_data_dir(config, lambda _: None)
    assert key_file.read_text().strip() == key, "generated once"
    props = master_properties_file(config)
    assert mode(props) == 0o600
    text = props.read_text()
    assert "spark.master.rest.filters=org.apache.spark.ui.JWSFilter" in text
    assert f"spark.org.apache.spark.ui.JWSFilter.param.secretKey={key}" in text
    assert "spark.ui.killEnabled=false" in text
    assert "spark.deploy.recoveryMode=FILESYSTEM" in text
    assert f"spark.deploy.recoveryDirectory={config.spark_dir / 'recovery'}" in text


def test_supervisor_files_are_private_and_secrets_stay_off_command_lines(tmp_path: Path) -> None:
    """supervisord: 0700 folder, 0600 conf, socket only (0700, password), each part's environment
    (the Airflow one holds connection URLs with passwords) in a 0600 file, never in ``command=``."""
    config = load_config(
        {"RELAY_DATA_DIR": str(tmp_path), "RELAY_LEDGER_URL": f"postgresql://u:{PASSWORD}@h/d"}
    )
    sup = Supervisor(config.data_dir, config.logs_dir)
    sup.write_conf()
    env = airflow_env(config)
    assert PASSWORD in json.dumps(env)
    sup.write_program(Program("airflow-scheduler", ["airflow", "scheduler"], env, tmp_path))
    assert mode(sup.folder) == mode(sup.programs_dir) == 0o700
    conf = sup.conf_file.read_text()
    assert mode(sup.conf_file) == mode(sup.key_file) == 0o600
    assert "inet_http_server" not in conf and "chmod=0700" in conf and "password={SHA}" in conf
    program = sup.program_file("airflow-scheduler").read_text()
    assert mode(sup.program_file("airflow-scheduler")) == mode(sup.env_file("airflow-scheduler")) == 0o600
    assert PASSWORD not in program and "AIRFLOW_CONN" not in program
    assert json.loads(sup.env_file("airflow-scheduler").read_text()) == env
    assert "stopasgroup=true" in program and "killasgroup=true" in program and "autorestart=true" in program


def test_restrict_dir_makes_the_data_dir_0700_and_takes_back_the_postgres_traverse_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root, a local PostgreSQL reaches its cluster through a mount namespace: the data dir is
    0700 even if an older version gave the ``postgres`` group a traverse bit. Only where mounts are
    refused is that bit kept (the fallback)."""
    folder = tmp_path / "d"
    folder.mkdir(mode=0o755)
    restrict_dir(folder)
    assert mode(folder) == 0o700
    try:
        gid = grp.getgrnam("postgres").gr_gid
    except KeyError:
        pytest.skip("no postgres group on this machine")
    os.chown(folder, -1, gid)
    monkeypatch.setattr(postgres_local, "namespace_available", lambda _: True)
    folder.chmod(0o751)
    restrict_dir(folder)
    assert mode(folder) == 0o700
    monkeypatch.setattr(postgres_local, "namespace_available", lambda _: False)
    folder.chmod(0o751)
    restrict_dir(folder)
    assert mode(folder) == 0o710


def test_postgres_mount_view_runs_as_postgres_without_the_data_dir_path(tmp_path: Path) -> None:
    """The wrapper binds the cluster folder under a folder ``postgres`` can traverse and drops to
    that user; the tmpfs never covers the folder the bind comes from."""
    view = pg_namespace.MountView(tmp_path / "postgres", Path("/mnt"))
    argv = view.wrap(["postgres", "-D", str(view.path / "data")])
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert argv[-5:] == ["/mnt", str(tmp_path / "postgres"), "postgres", "-D", "/mnt/pg/data"]
    script = argv[argv.index("-c") + 1]
    assert "setpriv --reuid=postgres --regid=postgres --clear-groups --no-new-privs" in script
    assert pg_namespace._base_for(Path("/mnt/x/var/postgres")) != Path("/mnt")


def test_airflow_password_file_is_written_0600_before_airflow_runs(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    env = airflow_env(config)
    path = passwords_file(config)
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(path)
    assert mode(path) == 0o600
    password = json.loads(path.read_text())[ADMIN_USER]
    assert len(password) >= 24
    airflow_env(config)
    assert json.loads(path.read_text())[ADMIN_USER] == password, "kept across starts"
    assert mode(path.parent / "secrets.json") == 0o600


def test_a_password_file_without_the_user_gets_one_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "passwords.json"
    path.write_text(json.dumps({"viewer": "v"}))
    path.chmod(0o644)
    assert ensure_user_password(path, "admin") is True
    found = json.loads(path.read_text())
    assert found["viewer"] == "v" and found["admin"] and mode(path) == 0o600


# -- signed REST requests ----------------------------------------------------------------------------


def test_signer_makes_short_lived_hs256_tokens_and_never_shows_the_key(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    ensure_secret_file(key_file)
    raw = decode_key(key_file.read_text())
    signer = RestSigner(raw)
    claims = jwt.decode(signer.token(), raw, algorithms=["HS256"])
    assert 0 < claims["exp"] - time.time() <= 60
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(signer.token(), b"x" * 32, algorithms=["HS256"])
    assert key_file.read_text().strip() not in repr(signer)
    with pytest.raises(ConfigError, match="at least 32"):
        RestSigner.from_text("c2hvcnQ")


def test_signer_for_reads_the_configured_key_file(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    assert signer_for(config) is None  # no key generated yet: unsigned (a protected server says 403)
    ensure_secret_file(config.spark_rest_secret_path)
    assert isinstance(signer_for(config), RestSigner)
    explicit = load_config(
        {"RELAY_DATA_DIR": str(tmp_path), "RELAY_SPARK_REST_SECRET_FILE": str(tmp_path / "no")}
    )
    with pytest.raises(ConfigError, match="cannot read the Spark REST key file"):
        signer_for(explicit)


class _Reply:
    def __init__(self, body: Any, status: int = 200, reason: str = "OK") -> None:
        self.body, self.status_code, self.reason, self.text = body, status, reason, json.dumps(body)

    def json(self) -> Any:
        return self.body


def test_client_signs_rest_requests_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every /v1/submissions call carries a fresh token; the master's /json/ gets none."""
    raw = b"k" * 32
    seen: list[tuple[str, dict[str, str]]] = []

    def fake(self: requests.Session, method: str, url: str, **kwargs: Any) -> _Reply:
        seen.append((url, dict(kwargs.get("headers") or {})))
        if url.endswith("/json/"):
            return _Reply({"status": "ALIVE"})
        return _Reply({"success": True, "submissionId": "driver-1", "driverState": "RUNNING"})

    monkeypatch.setattr(requests.Session, "request", fake)
    monkeypatch.setattr(requests.Session, "get", lambda self, url, **kw: fake(self, "GET", url, **kw))
    client = SparkStandaloneClient("http://m", "http://r", signer=RestSigner(raw))
    client.submit_python("app.py", [], {})
    client.driver_status("driver-1")
    client.kill("driver-1")
    assert client.ready()
    client.master_state()
    rest = [(u, h) for u, h in seen if u.startswith("http://r/v1/submissions/")]
    assert len(rest) == 4
    for _, headers in rest:
        token = headers["Authorization"].removeprefix("Bearer ")
        assert jwt.decode(token, raw, algorithms=["HS256"])["iss"] == "relay"
    assert all("Authorization" not in h for u, h in seen if u.endswith("/json/"))


def test_stack_refuses_to_reuse_a_master_whose_rest_server_takes_unsigned_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master started before security was on (no JWS filter) is reported, never silently reused."""
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    monkeypatch.setattr(SparkStandaloneClient, "master_state", lambda self: MasterState("ALIVE", 1, 4, 0))
    monkeypatch.setattr(SparkStandaloneClient, "ready", lambda self: True)  # signed or not
    assert LocalStack(config).probe(Part.SPARK_MASTER) == (False, REST_UNPROTECTED)
    monkeypatch.setattr(SparkStandaloneClient, "ready", lambda self: self.signer is not None)
    ensure_secret_file(config.spark_rest_secret_path)
    healthy, detail = LocalStack(config).probe(Part.SPARK_MASTER)
    assert healthy and "signed requests only" in detail


def test_a_refused_request_says_what_to_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        requests.Session,
        "request",
        lambda self, m, u, **kw: _Reply({}, 403, "Authorization header is missing."),
    )
    with pytest.raises(SparkError, match="RELAY_SPARK_REST_SECRET_FILE"):
        SparkStandaloneClient("http://m", "http://r").submit_python("app.py", [], {})
    with pytest.raises(SparkError, match="token was rejected"):
        SparkStandaloneClient("http://m", "http://r", signer=RestSigner(b"k" * 32)).kill("driver-1")


# -- no secret on a command line or in a Spark option -------------------------------------------------


def test_the_ledger_url_travels_in_the_environment_only(tmp_path: Path) -> None:
    url = f"postgresql+psycopg2://relay:{PASSWORD}@db:5432/relay"
    config = load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_LEDGER_URL": url})
    inst = Instance(
        7, "p", "v1", Color.BLUE, InstanceState.STARTING, "/c", 0, False, None, "relay-p-7", None, 0, 0
    )
    args = driver_args(config, inst, supervised=True)
    props = driver_properties(config, "relay-p-7", supervise=True, py_files=[])
    assert not any("ss/w" in a or "relay:" in a for a in args)
    assert not any("ss/w" in v for v in props.values())
    assert props["spark.ui.killEnabled"] == "false"
    env = submission_environment(config, "/code.zip", "tok")
    assert env[LEDGER_URL_ENV] == url and env["RELAY_LAUNCH_TOKEN"] == "tok"
    assert PASSWORD not in repr(config)


def test_the_source_takes_the_name_of_a_variable_never_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    with pytest.raises(ConfigError, match="relay.ledgerUrl is not accepted"):
        SourceSettings.from_options({**base, "relay.ledgerurl": "sqlite:///x", "relay.instanceid": "1"})
    monkeypatch.delenv("RELAY_LEDGER_URL", raising=False)
    with pytest.raises(ConfigError, match="RELAY_LEDGER_URL"):
        SourceSettings.from_options({**base, "relay.instanceid": "1"})
    monkeypatch.setenv("RELAY_LEDGER_URL", "sqlite:///x")
    settings = SourceSettings.from_options({**base, "relay.instanceid": "1"})
    assert settings.ledger_url_env == "RELAY_LEDGER_URL" and "sqlite" not in repr(settings)
    with pytest.raises(ConfigError, match="needs relay.instanceId"):
        SourceSettings.from_options({**base, "relay.ledgerurlenv": "X"})


def test_an_artifact_built_before_env_passing_is_refused(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    art = build_artifact(config, "v1")
    require_env_interface(art)
    meta = json.loads((art.folder / "artifact.json").read_text())
    del meta["driver_interface"]
    (art.folder / "artifact.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="relay build --version v1 --force"):
        require_env_interface(artifact(config, "v1"))
