"""A multi-host test cluster on one machine: each host a network namespace, its parts the embedded
stack's own (broker, PostgreSQL, Spark master and workers, started by :class:`LocalStack`).

Why namespaces: a Spark standalone cluster behaves differently once its parts are on different
addresses and disks (drivers land on any worker, nothing is shared but what is meant to be). Each
host gets its own address, its own folder (``<run>/<host>``) and its own supervisord, started inside
the host's network namespace and a private mount namespace where the other hosts' folders are
hidden; ``<run>/shared`` (the checkpoint root) stays visible everywhere, as a cluster's shared store.

Teardown (``down``, the context manager's exit, atexit, SIGTERM) stops each host's supervisord and
what its parts' recorded groups left, then whatever still runs in the run's namespaces (by PID),
then deletes the namespaces; the state file written before anything is created lets ``cleanup``
do the same for a run that was killed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT
from relay.config.secret_files import create_private
from relay.errors import StackError
from relay.polling import poll

from relay_dev.hosts import netns
from relay_dev.hosts.layout import HOSTS, PREFIX_LEN, SUBNET, SWITCH, WORKERS, Layout, host_env
from relay_dev.hosts.state import Proc, RunState
from relay_dev.stack import LocalStack, Part
from relay_dev.stack_setup import prepare_data_dir
from relay_dev.supervision import Supervisor

log = logging.getLogger(__name__)

SERVICES: dict[str, Part] = {
    "broker": Part.KAFKA,
    "ledger": Part.POSTGRES,
    "master": Part.SPARK_MASTER,
    "worker1": Part.SPARK_WORKER,
    "worker2": Part.SPARK_WORKER,
}
STOP_ORDER = ("worker1", "worker2", "master", "broker", "ledger")
DEFAULT_ROOT = PROJECT_ROOT / "var" / "hosts"


@dataclass(frozen=True)
class ClusterInfo:
    """Where everything is, as a process on the client host reaches it."""

    run_dir: Path
    namespaces: dict[str, str]
    addresses: dict[str, str]
    master_url: str
    master_ui_url: str
    rest_url: str
    rest_secret_file: Path
    kafka_bootstrap: str
    postgres_url: str = field(repr=False)
    checkpoint_root: Path = Path()
    host_local: Path = Path()
    client_env: dict[str, str] = field(default_factory=dict, repr=False)
    timings: dict[str, float] = field(default_factory=dict)


def new_run_dir(root: Path = DEFAULT_ROOT) -> Path:
    """A fresh ``<project>/var/hosts/<run>`` (time + random: parallel runs never share one)."""
    path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    path.mkdir(parents=True, mode=0o700)
    return path


class NamespaceCluster:
    """``up()`` builds the cluster and returns its :class:`ClusterInfo`; ``down()`` removes it all.

    Workers advertise 2 cores each (the machine has 2): a cluster-mode driver takes a whole core
    slot on the worker it lands on, so with 1 core per worker that worker could never also run an
    executor, and "executors on both workers" would be impossible. Slots are not CPUs.
    """

    def __init__(
        self,
        run_dir: Path,
        progress: Callable[[str], None] | None = None,
        health_timeout_s: float = 120,
        worker_cores: int = 2,
        worker_memory: str = "1g",
        _state: RunState | None = None,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.progress = progress or log.info
        self.health_timeout_s = health_timeout_s
        prefix = _state.prefix if _state else f"rly{secrets.token_hex(3)}"
        subnet = _state.subnet if _state else SUBNET
        self.layout = Layout(self.run_dir, prefix, subnet, worker_cores, worker_memory)
        self.state = _state
        self.timings: dict[str, float] = {}
        self._lock = threading.Lock()
        self._old_sigterm: Any = None

    def __enter__(self) -> NamespaceCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- up --------------------------------------------------------------------------------------

    def up(self) -> ClusterInfo:
        """Namespaces and wire, folders, then broker + ledger + master, then both workers."""
        if self.state is not None and self.state.status != "down":
            raise StackError(f"cluster {self.layout.prefix} is already up in {self.run_dir}")
        cleanup(self.run_dir)  # a dead previous run in the same folder (refused if its owner lives)
        self.state = RunState.new(self.layout.prefix, self.layout.subnet)
        self._save()
        atexit.register(self._at_exit)
        self._catch_sigterm()
        try:
            with self._phase("network"):
                self._network()
            with self._phase("folders"):
                self._folders()
            with self._phase("broker, ledger, master"):
                self._start_parallel(["broker", "ledger", "master"])
            with self._phase("workers"):
                self._start_parallel(list(WORKERS))
            with self._phase("client"):
                key = self.layout.config("master").spark_rest_secret_path
                create_private(self.layout.config("client").spark_rest_secret_path, key.read_text())
        except BaseException:
            self.progress("cluster up failed: tearing down what was started")
            try:
                self.down()
            except Exception as exc:  # the original error matters more; this one is reported
                self.progress(f"teardown after the failed up: {exc}")
            raise
        self.state.status = "up"
        self._save()
        self.progress(
            f"cluster {self.layout.prefix} up: " + ", ".join(f"{k} {v}s" for k, v in self.timings.items())
        )
        return self.info()

    def info(self) -> ClusterInfo:
        lay = self.layout
        return ClusterInfo(
            run_dir=self.run_dir,
            namespaces={h: lay.ns(h) for h in HOSTS},
            addresses={h: lay.address(h) for h in HOSTS},
            master_url=lay.master_url,
            master_ui_url=lay.master_ui_url,
            rest_url=lay.rest_url,
            rest_secret_file=lay.config("client").spark_rest_secret_path,
            kafka_bootstrap=lay.kafka_bootstrap,
            postgres_url=lay.postgres().url,
            checkpoint_root=lay.checkpoint_root,
            host_local=lay.host_local,
            client_env=lay.client_env(),
            timings=dict(self.timings),
        )

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        self.timings[name] = round(time.monotonic() - t0, 2)
        self.progress(f"{name}: {self.timings[name]}s")

    def _save(self) -> None:
        assert self.state is not None
        with self._lock:
            self.state.save(self.layout.state_file)

    def _network(self) -> None:
        """The switch first, then each host plugged into it; each name recorded before it exists."""
        assert self.state is not None
        taken = [ns for ns in self.layout.namespaces if netns.exists(ns)]
        if taken:  # never recorded: a teardown must not remove what is not ours
            raise StackError(f"network namespace(s) {taken} already exist")
        self.state.namespaces = list(self.layout.namespaces)
        self._save()
        switch = self.layout.ns(SWITCH)
        netns.add_switch(switch)
        for host in HOSTS:
            netns.add(self.layout.ns(host))
            netns.plug(switch, self.layout.ns(host), f"v-{host}", self.layout.address(host), PREFIX_LEN)

    def _folders(self) -> None:
        for host in HOSTS:
            self.layout.folder(host).mkdir(parents=True, exist_ok=True, mode=0o700)
            (self.layout.folder(host) / "logs").mkdir(exist_ok=True)
        self.layout.checkpoint_root.mkdir(parents=True, exist_ok=True)
        self.layout.host_local.mkdir(exist_ok=True)  # a mount point: empty outside the hosts

    def supervisor(self, host: str) -> Supervisor:
        """The host's supervisord: its folder, started inside the host (netns + mount ns)."""
        folder = self.layout.folder(host)
        return Supervisor(folder, folder / "logs", launch_prefix=self.layout.command_prefix(host))

    def stack(self, host: str) -> LocalStack:
        def progress(message: str) -> None:
            self.progress(f"[{host}] {message}")

        cfg = self.layout.config(host)
        return LocalStack(cfg, progress, self.health_timeout_s, supervisor=self.supervisor(host))

    def _start(self, host: str) -> None:
        """One host's part, prepared, started and waited for from inside the host's network: every
        helper process (initdb, pg_isready, ``ip netns exec``) is in the host's namespace, so a
        teardown finds it there even when this process was killed."""
        netns.call_in_netns(self.layout.ns(host), lambda: self._start_here(host), f"up-{host}")

    def _start_here(self, host: str) -> None:
        assert self.state is not None
        stack, part = self.stack(host), SERVICES[host]
        if part is Part.SPARK_MASTER:
            prepare_data_dir(stack.config, stack.progress)  # the REST signing key, in master's folder
        if part is Part.POSTGRES:
            pg = self.layout.postgres()
            pg.init()
            pg.allow_clients(self.layout.cidr)
        stack.supervisor.ensure_running()
        pid = stack.supervisor.pid()
        if pid:
            self.state.supervisors[host] = Proc.of(pid)
            self._save()
        stack.up_part(part)

    def _start_parallel(self, hosts: list[str]) -> None:
        pool = ThreadPoolExecutor(len(hosts), thread_name_prefix="hosts-up")
        futures: dict[str, Future[None]] = {h: pool.submit(self._start, h) for h in hosts}
        try:
            for future in futures.values():
                future.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    # -- commands on a host ----------------------------------------------------------------------

    def run_on(
        self,
        host: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 300,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` (its network and mount namespaces, cwd its folder); output captured."""
        if host not in HOSTS:
            raise StackError(f"unknown host {host!r}; hosts: {', '.join(HOSTS)}")
        return subprocess.run(
            [*self.layout.command_prefix(host), *argv],
            env=host_env(env),
            cwd=self.layout.folder(host),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            stdin=subprocess.DEVNULL,
        )

    def call_in(self, host: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` in this process, on ``host``'s network (not its mount namespace): for probes."""
        return netns.call_in_netns(self.layout.ns(host), fn)

    def processes(self) -> dict[str, list[int]]:
        """Live PIDs per namespace of the run (names pin the namespaces: these are ours)."""
        if self.state is None:
            return {}
        return {ns: found for ns in self.state.namespaces if (found := netns.pids(ns))}

    # -- down ------------------------------------------------------------------------------------

    def down(self) -> dict[str, Any]:
        """Stop every host's parts and supervisord, then what runs in the namespaces, then delete them."""
        state = self.state or RunState.load(self.layout.state_file)
        if state is None or state.status == "down":
            return {}
        self.state = state
        t0 = time.monotonic()
        errors: list[str] = []
        for host in STOP_ORDER:
            if not (self.layout.folder(host) / "supervisor").exists():
                continue
            try:
                self.stack(host).down(timeout_s=60)
            except StackError as exc:
                errors.append(f"{host}: {exc}")
        found = self.processes()
        state.seen += [Proc.of(p) for pids in found.values() for p in pids]
        self._save()
        survivors = netns.stop_pids(sorted({p for pids in found.values() for p in pids}))
        for ns in reversed(state.namespaces):
            try:
                netns.delete(ns)
            except StackError as exc:
                errors.append(str(exc))
        left_ns = [ns for ns in state.namespaces if netns.exists(ns)]
        recorded = [*state.supervisors.values(), *state.seen]
        # an orphan's exit is reaped by init, not by us: poll
        poll(lambda: None if any(p.alive() for p in recorded) else True, 10, 0.1)
        left = [p.pid for p in recorded if p.alive()]
        state.status = "down" if not (left_ns or left or survivors) else "dirty"
        self._save()
        self._release()
        report = {
            "swept": found,
            "seconds": round(time.monotonic() - t0, 2),
            "errors": errors,
        }
        self.progress(f"cluster {self.layout.prefix} down in {report['seconds']}s")
        if left_ns or left:
            raise StackError(f"after teardown: namespaces {left_ns} and processes {left} are left; {errors}")
        if errors:
            self.progress(f"teardown warnings: {errors}")
        return report

    def _at_exit(self) -> None:
        try:
            self.down()
        except Exception as exc:  # at exit nobody can catch it: say what is left and where
            print(f"namespace cluster {self.run_dir}: teardown failed: {exc}; run cleanup({self.run_dir!s})")

    def _catch_sigterm(self) -> None:
        """SIGTERM unwinds like an exception (so ``finally``/``__exit__`` tear down), if nobody else
        handles it; only in the main thread, where Python delivers signals."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_signal)

    def _release(self) -> None:
        atexit.unregister(self._at_exit)
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def cleanup(run_dir: Path) -> dict[str, Any]:
    """Remove what a previous run in ``run_dir`` left (by its state file); refused while its owner lives."""
    run_dir = Path(run_dir).resolve()
    state = RunState.load(run_dir / "state.json")
    if state is None or state.status == "down":
        return {}
    if state.owner_alive():
        raise StackError(f"the cluster in {run_dir} is still owned by live pid {state.owner.pid}")
    return NamespaceCluster(run_dir, _state=state).down()


def cleanup_stale(root: Path = DEFAULT_ROOT) -> list[Path]:
    """``cleanup`` every run under ``root`` whose owner is gone and that was not torn down."""
    cleaned = []
    for state_file in sorted(root.glob("*/state.json")):
        state = RunState.load(state_file)
        if state is not None and state.status != "down" and not state.owner_alive():
            cleanup(state_file.parent)
            cleaned.append(state_file.parent)
    return cleaned


def remove_run_dir(run_dir: Path) -> None:
    """Delete a run folder after a clean teardown (refused while its state says otherwise)."""
    state = RunState.load(Path(run_dir) / "state.json")
    if state is not None and state.status != "down":
        raise StackError(f"{run_dir}: the cluster is {state.status}, not down; run cleanup first")
    shutil.rmtree(run_dir, ignore_errors=True)
