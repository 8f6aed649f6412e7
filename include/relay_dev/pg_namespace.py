"""Run PostgreSQL's binaries as ``postgres`` without opening the data dir to that user (as root).

PostgreSQL refuses root, so as root its binaries run as the ``postgres`` OS user, which cannot
traverse the 0700 data dir to reach its cluster folder. Instead of widening the data dir, each
binary starts in a private mount namespace (``unshare --mount``) where a small tmpfs covers an
existing root-owned 0755 folder (``/mnt``), the cluster folder is bind-mounted inside it, and then
drops to ``postgres`` (``setpriv``) and execs the binary with the mounted path. Nothing changes on
the host and the files stay in the data dir; PostgreSQL gains no access it lacked (no user
namespace, no capability kept, ``no_new_privs``).

Where mounts are refused (no CAP_SYS_ADMIN in some containers), callers fall back to granting the
``postgres`` group a traverse bit on the data dir (:func:`relay_dev.postgres_local.grant_postgres_traverse`).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

# Existing root-owned folders the tmpfs may cover (only inside the namespace), in order of preference.
BASES = ("/mnt", "/media", "/srv")
MOUNT_NAME = "pg"
UNSHARE = ["unshare", "--mount", "--propagation", "private", "--"]

# $1 base folder, $2 cluster folder; the rest is the command. exec keeps one PID (supervisord signals it).
# --clear-groups: only the postgres group, as before (--init-groups would add e.g. ssl-cert).
_SCRIPT = (
    'set -e; mount -t tmpfs -o size=64k,mode=0755,nosuid,nodev,noexec relay-pg "$1"; '
    'mkdir "$1/pg"; mount --bind "$2" "$1/pg"; cd "$1/pg"; shift 2; '
    'exec setpriv --reuid=postgres --regid=postgres --clear-groups --no-new-privs -- "$@"'
)


def _base_for(cluster: Path) -> Path | None:
    """A root-owned 0755-ish folder others may traverse and that does not hold ``cluster`` (the
    tmpfs would hide the bind's source)."""
    for name in BASES:
        base = Path(name)
        try:
            st = base.lstat()
        except OSError:
            continue
        if base.is_symlink() or not base.is_dir() or st.st_uid != 0 or not st.st_mode & 0o001:
            continue
        if cluster == base or base in cluster.parents:
            continue
        return base
    return None


@functools.cache
def _probe(base: str) -> str | None:
    """None when a private mount namespace with a tmpfs on ``base`` works here, else why not."""
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            return f"no {tool} binary"
    try:
        done = subprocess.run(
            [*UNSHARE, "mount", "-t", "tmpfs", "-o", "size=4k", "relay-pg", base],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        out = (done.stderr or done.stdout).strip()
        return out.splitlines()[-1] if out else f"exit {done.returncode}"
    return None


class MountView:
    """Where ``postgres`` sees ``cluster`` (:attr:`path`) and the argv prefix that gets it there."""

    def __init__(self, cluster: Path, base: Path) -> None:
        self.cluster = cluster.absolute()
        self.base = base
        self.path = base / MOUNT_NAME

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` (paths under :attr:`path`) run as ``postgres`` in its own mount namespace."""
        prefix = [*UNSHARE, "/bin/sh", "-c", _SCRIPT, "sh"]
        return [*prefix, str(self.base), str(self.cluster), *argv]


@functools.cache
def _warn_once(reason: str) -> None:
    log.warning("PostgreSQL: no private mount namespace (%s): the data dir stays 0710 group postgres", reason)


def mount_view(cluster: Path) -> MountView | None:
    """The mount-namespace view of ``cluster`` when we are root and it works here, else None
    (not root: nothing to do; root without mounts: the caller falls back, logged once)."""
    if os.geteuid() != 0:
        return None
    cluster = cluster.absolute()
    base = _base_for(cluster)
    reason = "no root-owned /mnt, /media or /srv outside the data dir" if base is None else _probe(str(base))
    if reason is not None or base is None:
        _warn_once(reason or "no base folder")
        return None
    return MountView(cluster, base)


def namespace_available(data_dir: Path) -> bool:
    """True when PostgreSQL under ``data_dir`` needs no traverse bit on it (not root, or mounts work)."""
    return os.geteuid() != 0 or mount_view(data_dir / "postgres") is not None
