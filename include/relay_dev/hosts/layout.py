"""Who is where in a namespace cluster: host names, addresses, folders, and each host's settings.

Pure (no process, no namespace): the cluster, its cleanup and the tests compute the same names from
a run folder and the prefix recorded in its state file.

Subnet: 10.213.14.0/24 lives only inside the run's own namespaces (their bridge is in the switch
namespace, nothing is routed from the root namespace), so it cannot clash with the machine's
networks, and parallel runs may all use it: each has its own wire.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from relay.config import Ports, RelayConfig
from relay.config.env import config_env

from relay_dev.hosts import enter
from relay_dev.hosts.netns import ip_binary
from relay_dev.postgres_local import LocalPostgres

SUBNET = "10.213.14"
PREFIX_LEN = 24
HOSTS: dict[str, int] = {"master": 10, "worker1": 11, "worker2": 12, "broker": 20, "ledger": 30, "client": 40}
WORKERS = ("worker1", "worker2")
SWITCH = "switch"
SHARED = "shared"
"""``<run>/shared``: the cluster's shared store, visible on every host (checkpoints under it)."""
HOST_LOCAL = "local"
"""``<run>/local``: on every host, that host's own folder (same path everywhere, like /var/lib/spark)."""


def unshare_binary() -> str:
    for path in ("/usr/bin/unshare", "/bin/unshare"):
        if Path(path).exists():
            return path
    return "unshare"


@dataclass(frozen=True)
class Layout:
    """Names, addresses and folders of one run."""

    run_dir: Path
    prefix: str
    subnet: str = SUBNET
    worker_cores: int = 2
    worker_memory: str = "1g"
    ports: Ports = field(default_factory=Ports)

    def ns(self, host: str) -> str:
        """Namespace name of a host (or of the switch): unique per run through the prefix."""
        return f"{self.prefix}-{host}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(SWITCH), *(self.ns(h) for h in HOSTS)]

    def address(self, host: str) -> str:
        return f"{self.subnet}.{HOSTS[host]}"

    @property
    def cidr(self) -> str:
        return f"{self.subnet}.0/{PREFIX_LEN}"

    def folder(self, host: str) -> Path:
        return self.run_dir / host

    @property
    def shared_dir(self) -> Path:
        return self.run_dir / SHARED

    @property
    def checkpoint_root(self) -> Path:
        return self.shared_dir / "checkpoints"

    @property
    def host_local(self) -> Path:
        return self.run_dir / HOST_LOCAL

    @property
    def state_file(self) -> Path:
        return self.run_dir / "state.json"

    # -- service addresses -----------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{self.address('master')}:{self.ports.spark_master}"

    @property
    def master_ui_url(self) -> str:
        return f"http://{self.address('master')}:{self.ports.spark_master_ui}"

    @property
    def rest_url(self) -> str:
        return f"http://{self.address('master')}:{self.ports.spark_rest}"

    @property
    def kafka_bootstrap(self) -> str:
        return f"{self.address('broker')}:{self.ports.kafka}"

    def postgres(self) -> LocalPostgres:
        return LocalPostgres(self.folder("ledger"), self.ports.postgres, self.address("ledger"))

    def config(self, host: str) -> RelayConfig:
        """Relay's settings as a process on ``host`` sees them (its folder, its address to bind)."""
        return RelayConfig(
            data_dir=self.folder(host),
            host=self.address(host),
            kafka_bootstrap=self.kafka_bootstrap,
            spark_master_url=self.master_url,
            spark_master_ui_url=self.master_ui_url,
            spark_rest_url=self.rest_url,
            ledger_url=self.postgres().url,
            ports=self.ports,
            worker_cores=self.worker_cores,
            worker_memory=self.worker_memory,
        )

    def client_config(self) -> RelayConfig:
        """The client's settings as README "Running on a real cluster" lists them: PostgreSQL ledger,
        artifacts in the ledger (a driver may start on any worker), checkpoints on the shared store."""
        return self.config("client").with_(
            artifact_store="ledger",
            checkpoint_root=self.checkpoint_root,
            worker_spark_dir=self.host_local / "spark",
        )

    def client_env(self) -> dict[str, str]:
        """RELAY_* variables of a Relay command on the client host (``relay.config.load_config``)."""
        return config_env(self.client_config())

    # -- entering a host -------------------------------------------------------------------------

    def command_prefix(self, host: str) -> list[str]:
        """argv prefix that runs a command on ``host``: its network namespace, a private mount
        namespace where the other hosts' folders are hidden and ``<run>/local`` is its own folder."""
        hide: list[str] = []
        for other in HOSTS:
            if other != host:
                hide += ["--hide", str(self.folder(other))]
        bind = ["--bind", str(self.folder(host)), str(self.host_local)]
        return [
            ip_binary(),
            "netns",
            "exec",
            self.ns(host),
            unshare_binary(),
            "--mount",
            "--propagation",
            "private",
            "--",
            sys.executable,
            "-I",
            str(Path(enter.__file__)),
            *hide,
            *bind,
            "--",
        ]


def host_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command run on a host: ours without RELAY_* (settings are explicit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(extra or {})
    return env
