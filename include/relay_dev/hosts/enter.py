"""Make the current (private) mount namespace look like one host's disk, then exec a command.

Run as ``ip netns exec NS unshare --mount --propagation private python -I enter.py --hide DIR ...
--bind SRC DST -- COMMAND...``. Each ``--hide`` folder (another host's) is covered by an empty,
read-only tmpfs: its files can be neither listed, read nor written from this host. ``--bind``
mounts the host's own folder at a path that has the same name on every host (like a real host's
``/var/lib/spark``), so per-application settings can name host-local folders.

Stdlib only (``-I``): it must not depend on the environment it is about to replace. It refuses to
mount anything in its caller's mount namespace.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 1, 2, 4, 8, 4096


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    ok = libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    if ok != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="enter")
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("--bind", nargs=2, action="append", default=[], metavar=("SRC", "DST"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    if os.readlink("/proc/self/ns/mnt") == os.readlink(f"/proc/{os.getppid()}/ns/mnt"):
        print("enter: refusing to mount in the caller's mount namespace (run under unshare --mount)")
        return 2
    for folder in args.hide:
        os.makedirs(folder, exist_ok=True)
        hidden = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        _mount("tmpfs", folder, "tmpfs", hidden, "size=4k,mode=0000")
    for src, dst in args.bind:
        os.makedirs(dst, exist_ok=True)
        _mount(src, dst, None, MS_BIND, None)
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
