"""Files only their owner may read: keys, passwords, properties holding a key.

Why one place: ``write_text`` then ``chmod`` leaves a window in which the file is world-readable
(created with the umask's mode); every secret file here is *created* 0600 (``os.open`` with the mode),
and an existing one with a looser mode is tightened.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path


def tighten(path: Path) -> None:
    """0600 unless it already is (a secret file found group- or world-readable)."""
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)


def create_private(path: Path, text: str) -> bool:
    """Create ``path`` 0600 with ``text`` unless it exists (``O_EXCL``: two callers agree on one
    content); True when this call created it. The folder is created 0700 if missing."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        tighten(path)
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return True


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, the new file created 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def ensure_user_password(path: Path, user: str) -> bool:
    """A JSON ``{user: password}`` file (0600) holding a random password for ``user``; True when
    one was added. Passwords of other users in an existing file are kept."""
    if create_private(path, json.dumps({user: secrets.token_urlsafe(24)}) + "\n"):
        return True
    try:
        found = json.loads(path.read_text() or "{}")
    except ValueError:
        found = {}
    if isinstance(found, dict) and found.get(user):
        return False
    passwords = found if isinstance(found, dict) else {}
    write_private(path, json.dumps({**passwords, user: secrets.token_urlsafe(24)}) + "\n")
    return True
