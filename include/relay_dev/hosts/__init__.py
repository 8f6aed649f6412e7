"""A multi-host test cluster on one machine, made of network namespaces (developer tooling).

Hosts ``master``, ``worker1``, ``worker2``, ``broker``, ``ledger`` and ``client``, each a network
namespace on a private bridge, each with its own folder; see :mod:`relay_dev.hosts.cluster`.
Needs root (``ip netns``, mounts). Never shipped in a job artifact.
"""

from relay_dev.hosts.cluster import (
    ClusterInfo,
    NamespaceCluster,
    cleanup,
    cleanup_stale,
    new_run_dir,
    remove_run_dir,
)

__all__ = ["ClusterInfo", "NamespaceCluster", "cleanup", "cleanup_stale", "new_run_dir", "remove_run_dir"]
