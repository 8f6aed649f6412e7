"""Write the ledger's next Alembic migration: ``python -m relay_dev.ledger_revision "what changes"``.

Developer tooling, never the runtime. Change the tables in ``relay/ledger/schema.py`` first; this
then makes a throwaway SQLite ledger at the current head, lets Alembic's autogenerate compare it with
``schema.metadata``, writes ``migrations/versions/<NNNN>_<slug>.py`` (numbered after the head) and
sets ``relay.ledger.revision.HEAD`` to it. Read what it wrote: autogenerate misses some changes
(a renamed column is a drop and an add) and a PostgreSQL ledger may want more (a data migration).
``--empty`` writes an empty migration to fill by hand.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from relay.ledger import revision
from relay.ledger.engine import create_ledger, make_engine

HEAD_LINE = re.compile(r'^HEAD = "[^"]*"$', re.MULTILINE)


def next_id(location: Path = revision.SCRIPT_LOCATION) -> str:
    """The revision after the script folder's head, as four digits (``0002`` after ``0001``)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(revision.alembic_config(location=location)).get_current_head()
    return f"{int(head or 0) + 1:04d}"


def write_revision(
    message: str, autogenerate: bool = True, location: Path = revision.SCRIPT_LOCATION
) -> Path:
    """Write the next migration into ``location`` and return its file (HEAD is not touched here)."""
    from alembic import command

    rev_id = next_id(location)
    with tempfile.TemporaryDirectory(prefix="relay-ledger-rev-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        if autogenerate:
            create_ledger(url)  # at this code's head: autogenerate compares the tables with it
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                config = revision.alembic_config(conn, location)
                script = command.revision(config, message, autogenerate=autogenerate, rev_id=rev_id)
        finally:
            engine.dispose()
    path = Path(script.path) if script is not None and not isinstance(script, list) else None
    if path is None:
        raise SystemExit("alembic wrote no revision")
    return path


def set_head(rev_id: str, module: Path = Path(revision.__file__)) -> None:
    """Point ``revision.HEAD`` at ``rev_id`` (the constant drivers check without Alembic)."""
    text, count = HEAD_LINE.subn(f'HEAD = "{rev_id}"', module.read_text())
    if count != 1:
        raise SystemExit(f"no single HEAD line in {module}")
    module.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message", help="what the migration changes (its file name's slug)")
    parser.add_argument("--empty", action="store_true", help="an empty migration, to write by hand")
    args = parser.parse_args(argv)
    path = write_revision(args.message, autogenerate=not args.empty)
    rev_id = path.name.split("_", 1)[0]
    set_head(rev_id)
    for fix in (["check", "--fix", "-q"], ["format", "-q"]):  # the template imports what it may not use
        subprocess.run([sys.executable, "-m", "ruff", *fix, str(path)], check=False)
    print(f"wrote {path}; relay.ledger.revision.HEAD = {rev_id!r}. Read it before committing.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
