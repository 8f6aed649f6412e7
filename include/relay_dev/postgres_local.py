"""A throwaway PostgreSQL cluster under the data dir, from Debian's PostgreSQL binaries.

Used for the ledger's PostgreSQL tests and an optional part of the local stack. PostgreSQL refuses to
run as root, so as root every binary runs as the ``postgres`` OS user and the cluster's folder is
handed to that user; it reaches that folder through a private mount namespace
(:mod:`relay_dev.pg_namespace`), so the data dir stays 0700. It listens on 127.0.0.1 only, with its
socket in the cluster folder (never /tmp).
"""

from __future__ import annotations

import glob
import grp
import os
import pwd
import shutil
import stat
import subprocess
from functools import cached_property
from pathlib import Path
from typing import Any

from relay.errors import StackError
from relay.polling import poll

from relay_dev.pg_namespace import MountView, mount_view, namespace_available
from relay_dev.ports import port_taken

DATABASE = "relay"
USER = "relay"
PASSWORD = "relay"  # a loopback-only throwaway cluster, not a secret


def _postgres_gid() -> int | None:
    try:
        return grp.getgrnam("postgres").gr_gid
    except KeyError:
        return None


def restrict_dir(path: Path) -> None:
    """Make ``path`` 0700 (also taking back a traverse bit an older version granted).

    One exception: as root where mount namespaces are refused, PostgreSQL (run as ``postgres``)
    must traverse the data dir to reach its cluster, so the ``postgres`` group's traverse bit that
    :func:`grant_postgres_traverse` gave is kept there.
    """
    st = path.stat()
    gid = _postgres_gid()
    granted = gid is not None and st.st_gid == gid and not namespace_available(path)
    keep = st.st_mode & 0o010 if granted else 0
    mode = 0o700 | keep
    if stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.geteuid():  # only the owner may chmod
        path.chmod(mode)


def grant_postgres_traverse(folder: Path) -> None:
    """Let the ``postgres`` user traverse ``folder`` and its ancestors (not list or read them).

    The fallback for root without mount namespaces (:mod:`relay_dev.pg_namespace`). Only folders
    that block it and that we own are changed: their group becomes ``postgres`` with ``--x``
    (others stay shut out), so a 0700 data dir becomes 0710, never world-traversable.
    """
    gid = _postgres_gid()
    if gid is None:
        return
    for d in (folder, *folder.parents):
        st = d.stat()
        if st.st_mode & 0o001 or (st.st_gid == gid and st.st_mode & 0o010) or st.st_uid != os.geteuid():
            continue
        os.chown(d, -1, gid)
        d.chmod((stat.S_IMODE(st.st_mode) & ~0o070) | 0o010)


def find_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<v>/bin`` holding initdb and pg_ctl."""
    candidates = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    candidates = [c for c in candidates if (c / "pg_ctl").exists()]
    if not candidates:
        raise StackError(
            "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin: "
            "install them (apt-get install -y postgresql, or run scripts/setup.sh)"
        )
    return max(candidates, key=lambda c: int(c.parent.name) if c.parent.name.isdigit() else 0)


class LocalPostgres:
    """initdb once; the cluster lives in ``<data_dir>/postgres``.

    The embedded stack runs :meth:`server_command` under its supervisor; :meth:`start`/:meth:`stop`
    (pg_ctl) serve the standalone throwaway clusters of tests and benchmarks.
    """

    def __init__(self, data_dir: Path | str, port: int, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.host = host
        self.root = self.data_dir / "postgres"
        self.pgdata = self.root / "data"
        self.socket_dir = self.root / "run"

    @cached_property
    def _view(self) -> MountView | None:
        """As root (where mounts work), how the binaries see the cluster folder; else None."""
        return mount_view(self.root)

    @property
    def _seen_root(self) -> Path:
        """The cluster folder as PostgreSQL's binaries see it (the same files as :attr:`root`)."""
        return self._view.path if self._view else self.root

    def _seen(self, path: Path) -> str:
        """``path`` (under :attr:`root`) as the binaries see it."""
        return str(self._seen_root / path.relative_to(self.root))

    @property
    def log_file(self) -> Path:
        """The server log of :meth:`start`: in the cluster folder when ``postgres`` cannot reach logs/."""
        if self._view:
            return self.root / "postgres.log"
        return self.data_dir / "logs" / "postgres.log"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``relay`` database."""
        return f"postgresql+psycopg2://{USER}:{PASSWORD}@{self.host}:{self.port}/{DATABASE}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _run_kwargs(self) -> dict[str, Any]:
        """As root, run as the ``postgres`` user (initdb and postgres refuse root); the mount
        namespace's wrapper switches user itself (:meth:`_command`)."""
        if os.geteuid() != 0:
            return {}
        try:
            pwd.getpwnam("postgres")
        except KeyError as exc:
            raise StackError("running as root but no 'postgres' OS user exists to run PostgreSQL") from exc
        return {} if self._view else {"user": "postgres", "group": "postgres"}

    def _command(self, argv: list[str]) -> list[str]:
        """``argv`` (paths as :meth:`_seen` gives them) in the mount namespace when there is one."""
        return self._view.wrap(argv) if self._view else argv

    def _run(self, args: list[str], what: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                self._command(args),
                check=False,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                **self._run_kwargs(),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StackError(f"PostgreSQL {what} at {self.address} failed: {exc}") from exc
        if done.returncode != 0:
            raise StackError(
                f"PostgreSQL {what} at {self.address} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-800:]}"
            )
        return done

    def _prepare_dirs(self) -> None:
        for d in (self.root, self.socket_dir, self.log_file.parent):
            d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            if self._view is None:
                grant_postgres_traverse(self.root.parent)
            for d in (self.root, self.socket_dir):
                shutil.chown(d, "postgres", "postgres")
                d.chmod(0o700)
            if not self.log_file.exists():
                self.log_file.touch()
            shutil.chown(self.log_file, "postgres", "postgres")

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def init(self) -> None:
        """initdb with a password for TCP and trust on the private socket; idempotent."""
        self._prepare_dirs()
        if self.initialized():
            return
        bin_dir = find_bin_dir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        try:
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    self._seen(self.pgdata),
                    "-U",
                    USER,
                    f"--pwfile={self._seen(pwfile)}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ],
                "initdb",
                timeout=120,
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def allow_clients(self, cidr: str) -> None:
        """Accept password logins from ``cidr`` (initdb allows loopback only); idempotent.

        For a server other hosts reach (the namespace cluster's ledger host); read at server start.
        """
        hba = self.pgdata / "pg_hba.conf"
        line = f"host all all {cidr} scram-sha-256"
        if line not in hba.read_text().splitlines():
            with hba.open("a") as out:
                out.write(line + "\n")

    def pid(self) -> int | None:
        """The postmaster's PID from ``postmaster.pid``, or None when not running."""
        try:
            first = (self.pgdata / "postmaster.pid").read_text().splitlines()[0]
            pid = int(first)
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def healthy(self) -> bool:
        """True when the server accepts TCP connections on its port (pg_isready)."""
        if self.pid() is None:
            return False
        done = subprocess.run(  # noqa: PLW1510 - the exit code is the answer
            [str(find_bin_dir() / "pg_isready"), "-h", self.host, "-p", str(self.port), "-t", "2"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return done.returncode == 0

    def server_command(self) -> list[str]:
        """``postgres`` in the foreground (the embedded stack's supervisor runs it; SIGINT = fast stop).

        As root it starts as root (``unshare``, ``mount``) and switches to ``postgres`` itself
        when in a mount namespace (:attr:`run_as` is then None); one PID throughout (exec)."""
        return self._command(
            [
                str(find_bin_dir() / "postgres"),
                "-D",
                self._seen(self.pgdata),
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-k",
                self._seen(self.socket_dir),
            ]
        )

    @property
    def run_as(self) -> str | None:
        """The OS user the server must run as (``postgres`` when we are root), else None."""
        return self._run_kwargs().get("user")

    def ensure_database(self) -> None:
        """The ``relay`` database, on a running server (idempotent)."""
        self._create_database()

    def start(self, timeout_s: float = 60) -> str:
        """Start (initdb first if needed), create the ``relay`` database; return its URL."""
        self.init()
        if not self.healthy():
            if port_taken(self.host, self.port):
                raise StackError(f"PostgreSQL port {self.host}:{self.port} is already in use")
            sock = self._seen(self.socket_dir)
            opts = f"-h {self.host} -p {self.port} -k {sock} -c listen_addresses={self.host}"
            self._run(
                [
                    str(find_bin_dir() / "pg_ctl"),
                    "start",
                    "-D",
                    self._seen(self.pgdata),
                    "-l",
                    self._seen(self.log_file) if self._view else str(self.log_file),
                    "-w",
                    "-t",
                    str(int(timeout_s)),
                    "-o",
                    opts,
                ],
                "start",
                timeout=timeout_s + 10,
            )
        self._wait_healthy(timeout_s)
        self._create_database()
        return self.url

    def _wait_healthy(self, timeout_s: float) -> None:
        poll(
            lambda: self.healthy() or None,
            timeout_s,
            0.2,
            on_timeout=lambda: StackError(
                f"PostgreSQL at {self.address} not ready after {timeout_s}s, see {self.log_file}"
            ),
        )

    def _create_database(self) -> None:
        psql = [
            str(find_bin_dir() / "psql"),
            "-h",
            self._seen(self.socket_dir),
            "-p",
            str(self.port),
            "-U",
            USER,
            "-d",
            "postgres",
            "-tAc",
        ]
        exists = self._run([*psql, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"], "check db")
        if exists.stdout.strip() != "1":
            self._run([*psql, f"CREATE DATABASE {DATABASE}"], "create database")

    def stop(self, timeout_s: float = 30) -> bool:
        """Fast shutdown (rolls back open transactions); True when it was running."""
        if self.pid() is None:
            return False
        self._run(
            [
                str(find_bin_dir() / "pg_ctl"),
                "stop",
                "-D",
                self._seen(self.pgdata),
                "-m",
                "fast",
                "-w",
                "-t",
                str(int(timeout_s)),
            ],
            "stop",
            timeout=timeout_s + 10,
        )
        return True


def database_with(server_url: str, schema: Path, name: str | None = None) -> str:
    """A new database (``name``, else a random one) on the PostgreSQL server of ``server_url`` (any
    SQLAlchemy or libpq URL), holding what ``schema`` (SQL) creates; its libpq URL (a secret)."""
    import uuid

    import psycopg2
    from sqlalchemy.engine import make_url

    url = make_url(server_url).set(drivername="postgresql")
    name = name or f"sink_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(url.render_as_string(hide_password=False))
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    finally:
        admin.close()
    target = url.set(database=name).render_as_string(hide_password=False)
    conn = psycopg2.connect(target)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(schema.read_text())
    finally:
        conn.close()
    return target
