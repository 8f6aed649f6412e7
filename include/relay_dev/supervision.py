"""One supervisord per data dir runs every part of the embedded stack and brings back what dies.

Why supervisord: a part that crashes must come back without a person, a crash loop must back off
and end FATAL instead of spinning, and stopping must take the part's whole process group. Relay only
writes the configuration and talks XML-RPC over a unix socket; it never starts a part itself.

Layout under ``<data_dir>/supervisor`` (0700): ``supervisord.conf`` (0600; no inet server), the
socket (0700, and a password from ``rpc.key``, 0600; ``supervisorctl -c <conf>`` works too), the pid
file, ``programs/<name>.conf`` (one file per part, so parts are added and removed one by one),
``<name>.env.json`` (the part's environment, 0600, read by the wrapper: no secret on a command line)
and ``<name>.pgid`` (the group the wrapper recorded). supervisord's own log is
``<data_dir>/logs/supervisord.log``; each part logs to ``<data_dir>/logs/<name>.log``.

Restarts are counted from supervisord's log (its ``spawned: '<name>'`` lines) after the offset
recorded when Relay last started the program (``relay stack up`` / ``relay airflow up``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import secrets
import subprocess
import sys
import xmlrpc.client
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.config.secret_files import create_private, write_private
from relay.errors import StackError
from relay.polling import poll
from supervisor.xmlrpc import SupervisorTransport

from relay_dev import supervised_exec

RUNNING_STATES = ("STARTING", "RUNNING", "BACKOFF", "STOPPING")
STOP_WAIT_S = 30
RPC_USER = "relay"
WRAPPER = Path(supervised_exec.__file__)


@dataclass(frozen=True)
class Program:
    """One part as supervisord runs it."""

    name: str
    command: list[str]
    env: dict[str, str]
    cwd: Path
    stopsignal: str = "TERM"
    user: str | None = None
    startsecs: int = 8
    startretries: int = 5
    stopwaitsecs: int = STOP_WAIT_S
    priority: int = 500


@dataclass
class ProgramInfo:
    """What supervisord reports about one program."""

    name: str
    state: str
    pid: int | None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (a part and every child it left behind)."""
    return supervised_exec.group_members(pgid, None)


class Supervisor:
    """The supervisord of one data dir: configuration, start, programs, restart counts, shutdown."""

    def __init__(self, data_dir: Path, logs_dir: Path, launch_prefix: Sequence[str] = ()) -> None:
        """``launch_prefix`` runs supervisord (and so every part) elsewhere, e.g. ``ip netns exec``."""
        self.data_dir = data_dir
        self.launch_prefix = list(launch_prefix)
        self.logs_dir = logs_dir
        self.folder = data_dir / "supervisor"
        self.conf_file = self.folder / "supervisord.conf"
        self.programs_dir = self.folder / "programs"
        self.socket = self.folder / "sock"
        self.pid_file = self.folder / "supervisord.pid"
        self.log_file = logs_dir / "supervisord.log"
        self.baseline_file = self.folder / "baseline.json"
        self.key_file = self.folder / "rpc.key"

    # -- supervisord itself ----------------------------------------------------------------------

    def _rpc(self) -> Any:
        password = self.key_file.read_text().strip() if self.key_file.exists() else None
        transport = SupervisorTransport(RPC_USER, password, f"unix://{self.socket}")
        return xmlrpc.client.ServerProxy("http://localhost", transport=transport).supervisor

    def running(self) -> bool:
        """True when supervisord answers on the socket."""
        if not self.socket.exists():
            return False
        try:
            return self._rpc().getState()["statename"] == "RUNNING"
        except (OSError, xmlrpc.client.Error):
            return False

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def write_conf(self) -> None:
        """The private folder and the main configuration (0600; unix socket only, 0700)."""
        for d in (self.folder, self.programs_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            d.chmod(0o700)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.socket)) > 100:
            raise StackError(f"supervisor socket path too long for a unix socket: {self.socket}")
        create_private(self.key_file, secrets.token_urlsafe(24))
        digest = hashlib.sha1(self.key_file.read_text().strip().encode()).hexdigest()  # noqa: S324
        user = f"user={pwd.getpwuid(0).pw_name}\n" if os.geteuid() == 0 else ""  # root on purpose
        conf = f"""[unix_http_server]
file={_q(self.socket)}
chmod=0700
username={RPC_USER}
password={{SHA}}{digest}

[supervisord]
logfile={_q(self.log_file)}
logfile_maxbytes=0
pidfile={_q(self.pid_file)}
directory={_q(self.data_dir)}
childlogdir={_q(self.logs_dir)}
umask=077
nodaemon=false
silent=true
identifier=relay-{_q(self.data_dir.name)}
{user}
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{_q(self.socket)}
username={RPC_USER}
password={_q(self.key_file.read_text().strip())}

[include]
files = {_q(self.programs_dir)}/*.conf
"""
        write_private(self.conf_file, conf)

    def ensure_running(self, timeout_s: float = 30) -> None:
        """Start supervisord (it daemonizes) unless it answers; programs on file start with it."""
        if self.running():
            return
        self.write_conf()
        old = self.pid()
        if old and _alive(old):
            raise StackError(f"supervisord pid {old} runs but does not answer on {self.socket}")
        self.socket.unlink(missing_ok=True)
        env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "HOME", "TZ") if k in os.environ}
        done = subprocess.run(
            [*self.launch_prefix, sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf_file)],
            env=env,
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(f"supervisord did not start: {(done.stderr or done.stdout).strip()[-800:]}")
        poll(
            lambda: self.running() or None,
            timeout_s,
            0.2,
            on_timeout=lambda: StackError(
                f"supervisord not answering after {timeout_s}s; see {self.log_file}"
            ),
        )

    def shutdown(self, timeout_s: float = 60) -> None:
        """Ask supervisord to exit (it stops what still runs) and wait until its PID is gone."""
        pid = self.pid()
        if self.running():
            with contextlib.suppress(OSError, xmlrpc.client.Error):
                self._rpc().shutdown()
        if pid:
            poll(
                lambda: None if _alive(pid) else True,
                timeout_s,
                0.2,
                on_timeout=lambda: StackError(
                    f"supervisord pid {pid} still running {timeout_s}s after shutdown"
                ),
            )

    # -- programs --------------------------------------------------------------------------------

    def program_file(self, name: str) -> Path:
        return self.programs_dir / f"{name}.conf"

    def env_file(self, name: str) -> Path:
        return self.folder / f"{name}.env.json"

    def group_file(self, name: str) -> Path:
        return self.folder / f"{name}.pgid"

    def configured(self) -> list[str]:
        """Programs that have a configuration file (what supervisord runs, or will at its start)."""
        return sorted(p.stem for p in self.programs_dir.glob("*.conf"))

    def write_program(self, program: Program) -> None:
        """The program's section and its environment file, both 0600."""
        write_private(self.env_file(program.name), json.dumps(program.env))
        log = self.logs_dir / f"{program.name}.log"
        wrapper = [sys.executable, "-I", str(WRAPPER), "--group-file", str(self.group_file(program.name))]
        wrapper += ["--env-file", str(self.env_file(program.name)), "--log", str(log)]
        if program.user:
            wrapper += ["--user", program.user]
        command = " ".join(_arg(a) for a in [*wrapper, "--", *program.command])
        section = f"""[program:{program.name}]
command={command}
directory={_q(program.cwd)}
priority={program.priority}
autostart=true
autorestart=true
startsecs={program.startsecs}
startretries={program.startretries}
stopsignal={program.stopsignal}
stopwaitsecs={program.stopwaitsecs}
stopasgroup=true
killasgroup=true
redirect_stderr=true
stdout_logfile={_q(log)}
stdout_logfile_maxbytes=0
"""
        write_private(self.program_file(program.name), section)

    def ensure_program(self, program: Program) -> str:
        """Configure ``program`` and make it run; returns what was done (running, started, ...)."""
        self.write_program(program)
        rpc = self._rpc()
        added, changed, _removed = rpc.reloadConfig()[0]
        if program.name in changed:
            self._remove(program.name)
            added = [*added, program.name]
        info = self.info(program.name)
        if info is not None and info.state in RUNNING_STATES:
            return "running"
        self.clear_history(program.name)  # an explicit start by a person: a new crash-loop budget
        if program.name in added or info is None:
            rpc.addProcessGroup(program.name)  # autostart=true: supervisord starts it now
            return "added"
        rpc.startProcess(program.name, False)
        return "started"

    def clear_history(self, name: str) -> None:
        """Forget the wrapper's start history (keep the recorded group: it must still be cleared)."""
        record = self._record(name)
        if record is None:
            return
        record["starts"] = []
        write_private(self.group_file(name), json.dumps(record))

    def _remove(self, name: str) -> None:
        rpc = self._rpc()
        with contextlib.suppress(xmlrpc.client.Fault):
            rpc.stopProcessGroup(name, True)
        with contextlib.suppress(xmlrpc.client.Fault):
            rpc.removeProcessGroup(name)

    def remove_program(self, name: str) -> str:
        """Stop ``name`` (its group: TERM/INT, KILL after stopwaitsecs) and forget it; returns how."""
        info = self.info(name)
        try:
            conf = self.program_file(name).read_text()
            sig = "SIG" + conf.split("stopsignal=", 1)[1].split()[0]
        except (OSError, IndexError):
            sig = "its stop signal"
        self.program_file(name).unlink(missing_ok=True)
        if info is None:
            return "not running"
        self._remove(name)
        with contextlib.suppress(OSError, xmlrpc.client.Error):
            self._rpc().reloadConfig()
        if info.state not in RUNNING_STATES:
            return f"was {info.state}"
        return f"{sig} to its process group (SIGKILL after {STOP_WAIT_S}s), was {info.state}"

    def infos(self) -> dict[str, ProgramInfo]:
        """Every program supervisord knows; {} when it does not run."""
        if not self.running():
            return {}
        try:
            rows = self._rpc().getAllProcessInfo()
        except (OSError, xmlrpc.client.Error):
            return {}
        return {
            r["name"]: ProgramInfo(r["name"], r["statename"], r["pid"] or None, r["description"], r)
            for r in rows
        }

    def info(self, name: str) -> ProgramInfo | None:
        return self.infos().get(name)

    # -- groups and restart counts ---------------------------------------------------------------

    def _record(self, name: str) -> dict[str, Any] | None:
        """What the wrapper recorded for ``name``'s latest run (pid, pgid, start, starts), or None."""
        try:
            record = json.loads(self.group_file(name).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def recorded_group(self, name: str) -> tuple[int, int | None] | None:
        """(pgid, leader start time) the wrapper recorded for ``name``'s latest run."""
        record = self._record(name) or {}
        try:
            return int(record["pgid"]), record.get("start")
        except (KeyError, TypeError, ValueError):
            return None

    def part_pid(self, name: str, info: ProgramInfo | None = None) -> int | None:
        """The PID of ``name``'s part, None when down: supervisord's, or, when the wrapper it runs
        adopted a part that outlived the previous supervisord, the adopted part's. ``info``: what
        supervisord reported for it, when the caller has it already (else it is asked)."""
        info = info if info is not None else self.info(name)
        if info is None or not info.pid or not _alive(info.pid):
            return None
        record = self._record(name) or {}
        try:
            recorded = int(record["pid"])
        except (KeyError, TypeError, ValueError):
            return info.pid
        if recorded != info.pid and supervised_exec.running(recorded, record.get("start")):
            return recorded
        return info.pid

    def leftovers(self, name: str) -> list[int]:
        """Live processes of the group ``name``'s latest run recorded."""
        group = self.recorded_group(name)
        return supervised_exec.group_members(*group) if group else []

    def clear_leftovers(self, name: str, grace_s: float = 10) -> list[int]:
        """TERM then KILL, by PID, what is left of ``name``'s recorded group (supervisord gone)."""
        group = self.recorded_group(name)
        return supervised_exec.clear_group(group[0], group[1], grace_s) if group else []

    def mark_baseline(self, names: list[str]) -> None:
        """Restarts of ``names`` count from now (a person just started them)."""
        try:
            base = json.loads(self.baseline_file.read_text())
        except (OSError, ValueError):
            base = {}
        size = self.log_file.stat().st_size if self.log_file.exists() else 0
        base.update(dict.fromkeys(names, size))
        write_private(self.baseline_file, json.dumps(base))

    def restarts(self, name: str) -> int:
        """``spawned: '<name>'`` lines in supervisord's log since the program's baseline."""
        try:
            offset = int(json.loads(self.baseline_file.read_text()).get(name, 0))
            with open(self.log_file, "rb") as log:
                if offset > log.seek(0, os.SEEK_END):
                    offset = 0
                log.seek(offset)
                text = log.read().decode(errors="replace")
        except (OSError, ValueError):
            return 0
        return text.count(f"spawned: '{name}' ")


def _alive(pid: int) -> bool:
    fields = supervised_exec._stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _q(value: object) -> str:
    """A value for supervisord's ini file: ``%`` is its expansion character."""
    text = str(value)
    if "\n" in text:
        raise StackError(f"newline in a supervisord setting: {text!r}")
    return text.replace("%", "%%")


def _arg(value: str) -> str:
    """One argument of ``command=`` (supervisord splits it with shlex)."""
    import shlex

    return _q(shlex.quote(value))
