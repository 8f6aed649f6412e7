"""Read a Structured Streaming checkpoint: the planned offsets of each batch and what was committed.

Spark writes ``offsets/N`` (the plan of batch N: a version line, a metadata line, one line per
source) before running it, and ``commits/N`` after the sink returned. For a Kafka source, the source
line is ``{"topic": {"partition": next_offset}}`` (Spark's own Kafka source and Relay's alike).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from relay.errors import RelayError
from relay.ledger.models import Offsets, offsets_from_json


class CheckpointError(RelayError):
    """A checkpoint file is missing or unreadable."""


def _batch_ids(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def planned_offsets(checkpoint_dir: str | Path, batch_id: int) -> Offsets | None:
    """The end offsets Spark planned for ``batch_id`` (None when that batch was never planned)."""
    path = Path(checkpoint_dir) / "offsets" / str(batch_id)
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    if len(lines) < 3:
        raise CheckpointError(f"{path} has {len(lines)} lines; expected version, metadata and a source")
    source = lines[2].strip()
    if source in ("", "-"):
        return None
    try:
        return offsets_from_json(json.loads(source))
    except (ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: source offsets are not Kafka offsets JSON: {source[:200]}") from exc


def last_batch(checkpoint_dir: str | Path) -> int | None:
    ids = _batch_ids(Path(checkpoint_dir) / "offsets")
    return ids[-1] if ids else None


def last_commit(checkpoint_dir: str | Path) -> int | None:
    ids = _batch_ids(Path(checkpoint_dir) / "commits")
    return ids[-1] if ids else None


@dataclass(frozen=True)
class CheckpointSummary:
    path: str
    exists: bool
    last_batch: int | None
    last_commit: int | None
    offsets: Offsets | None
    committed_offsets: Offsets | None

    @property
    def consistent(self) -> bool:
        """True when every planned batch was committed (a clean stop)."""
        return self.last_batch == self.last_commit

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "exists": self.exists,
            "last_batch": self.last_batch,
            "last_commit": self.last_commit,
            "consistent": self.consistent,
            "offsets": self.offsets,
            "committed_offsets": self.committed_offsets,
        }


def inspect(checkpoint_dir: str | Path) -> CheckpointSummary:
    path = Path(checkpoint_dir)
    lb, lc = last_batch(path), last_commit(path)
    return CheckpointSummary(
        path=str(path),
        exists=path.is_dir(),
        last_batch=lb,
        last_commit=lc,
        offsets=planned_offsets(path, lb) if lb is not None else None,
        committed_offsets=planned_offsets(path, lc) if lc is not None else None,
    )


def archive(checkpoint_dir: str | Path, keep: int = 5) -> Path | None:
    """Rename a checkpoint aside with a timestamp instead of deleting it.

    Only archives beyond the newest ``keep`` of the same checkpoint are pruned.
    """
    path = Path(checkpoint_dir)
    if not path.exists():
        return None
    target = path.with_name(f"{path.name}.archived-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**6}")
    path.rename(target)
    archives = sorted(path.parent.glob(f"{path.name}.archived-*"))
    for old in archives[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return target
