"""Versioned job code: one immutable artifact per version, so two versions can run side by side.

An artifact is a folder ``<data_dir>/artifacts/<version>/`` holding the driver script and a zip of
the library and the Spark source (shipped with the submission as a py-file). Building a version
freezes the code as it is now; the driver checks that the artifact it runs is the version the
ledger gave its instance.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import ConfigError

VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
VERSION_MODULE = "relay_job_version.py"


@dataclass(frozen=True)
class Artifact:
    version: str
    folder: Path

    @property
    def job_file(self) -> Path:
        return self.folder / "reference_job.py"

    @property
    def zip_file(self) -> Path:
        return self.folder / "relay_job.zip"

    def exists(self) -> bool:
        return self.job_file.is_file() and self.zip_file.is_file()


def validate_version(version: str) -> str:
    if not VERSION_RE.match(version or ""):
        raise ConfigError(f"version must be 1-64 letters, digits, '.', '_' or '-', got {version!r}")
    return version


def artifact(config: RelayConfig, version: str) -> Artifact:
    return Artifact(validate_version(version), config.data_dir / "artifacts" / version)


def build_artifact(
    config: RelayConfig, version: str, fail_at_start: bool = False, force: bool = False
) -> Artifact:
    """Freeze the current code as ``version`` (an existing artifact is kept unless ``force``).

    ``fail_at_start`` builds a deliberately broken version (for testing aborts).
    """
    art = artifact(config, version)
    if art.exists() and not force:
        return art
    tmp = art.folder.with_name(f".{version}.building-{time.time_ns()}")
    tmp.mkdir(parents=True)
    shutil.copy2(PROJECT_ROOT / "spark_jobs" / "reference_job.py", tmp / "reference_job.py")
    with zipfile.ZipFile(tmp / "relay_job.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for src_root, prefix in (
            (PROJECT_ROOT / "include" / "relay", "relay"),
            (PROJECT_ROOT / "spark_jobs", ""),
        ):
            for path in sorted(src_root.rglob("*.py")):
                if "__pycache__" in path.parts or path.name == "reference_job.py":
                    continue
                zf.write(path, str(Path(prefix) / path.relative_to(src_root)))
        zf.writestr(VERSION_MODULE, f"VERSION = {version!r}\nFAIL_AT_START = {fail_at_start!r}\n")
    (tmp / "artifact.json").write_text(
        json.dumps({"version": version, "built_at": time.time(), "fail_at_start": fail_at_start})
    )
    if art.folder.exists():
        shutil.rmtree(art.folder)
    tmp.rename(art.folder)
    return art
