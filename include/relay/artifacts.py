"""Versioned job code: one immutable artifact per version, so two versions can run side by side.

An artifact is a folder ``<data_dir>/artifacts/<version>/`` holding the driver script and a zip of
the library and the Spark source (shipped with the submission as a py-file). Building a version
freezes the code as it is now; the driver checks that the artifact it runs is the version the
ledger gave its instance.
"""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import ConfigError
from relay.inputs import validate_version  # noqa: F401 - the one rule, also used by the DAG params

VERSION_MODULE = "relay_job_version.py"
# Imported first by a version built with ``import_error=True``; no artifact ever ships this module.
MISSING_MODULE = "relay_missing_on_purpose"
FUTURE_IMPORT = "from __future__ import annotations\n"
# How the launcher talks to the driver it freezes. 2: the ledger URL comes in the environment
# (RELAY_LEDGER_URL), never as ``--ledger-url``; older drivers require the argument.
DRIVER_INTERFACE = 2


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


def artifact(config: RelayConfig, version: str) -> Artifact:
    return Artifact(validate_version(version), config.data_dir / "artifacts" / version)


def build_artifact(
    config: RelayConfig,
    version: str,
    fail_at_start: bool = False,
    force: bool = False,
    import_error: bool = False,
) -> Artifact:
    """Freeze the current code as ``version`` (an existing artifact is kept unless ``force``).

    Two deliberately broken versions, for testing aborts: ``fail_at_start`` fails after the driver
    took an attempt in the ledger; ``import_error`` dies at import, before it reaches the ledger (the
    driver script imports a module no artifact has). Both are decided here, at build time, so a
    real version's driver pays nothing for them.
    """
    art = artifact(config, version)
    if art.exists() and not force:
        return art
    tmp = art.folder.with_name(f".{version}.building-{time.time_ns()}")
    tmp.mkdir(parents=True)
    shutil.copy2(PROJECT_ROOT / "spark_jobs" / "reference_job.py", tmp / "reference_job.py")
    if import_error:
        _break_imports(tmp / "reference_job.py")
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
        json.dumps(
            {
                "version": version,
                "built_at": time.time(),
                "fail_at_start": fail_at_start,
                "import_error": import_error,
                "driver_interface": DRIVER_INTERFACE,
            }
        )
    )
    if art.folder.exists():
        shutil.rmtree(art.folder)
    tmp.rename(art.folder)
    return art


def require_env_interface(art: Artifact) -> None:
    """Refuse an artifact frozen before secrets moved to the environment (its driver would need
    the ledger URL, password included, on its command line)."""
    try:
        found = int(json.loads((art.folder / "artifact.json").read_text()).get("driver_interface", 1))
    except (OSError, ValueError, TypeError):
        found = 1
    if found < DRIVER_INTERFACE:
        raise ConfigError(
            f"version {art.version} was built by an older Relay whose driver takes the ledger URL on "
            f"its command line; rebuild it: relay build --version {art.version} --force"
        )


def _break_imports(job_file: Path) -> None:
    """Make the driver script import MISSING_MODULE first (right after its ``__future__`` import)."""
    head, future, rest = job_file.read_text().partition(FUTURE_IMPORT)
    broken = f"import {MISSING_MODULE}  # noqa: F401 - built with import_error=True\n"
    job_file.write_text(head + future + broken + rest if future else broken + head)
