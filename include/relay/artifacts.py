"""Versioned job code: one immutable artifact per version, so two versions can run side by side.

An artifact is a folder ``<data_dir>/artifacts/<version>/`` holding the driver script and a zip of
the library and the Spark source (shipped with the submission as a py-file). Building a version
freezes the code as it is now; the driver checks that the artifact it runs is the version the
ledger gave its instance. Built from a user's pipeline package (``pipeline_code``), the zip also
carries that package, the driver is ``pipeline_driver.py`` and ``artifact.json`` records the
pipeline (name, topics, module, the environment its sink needs) and the hash of its code.
"""

from __future__ import annotations

import hashlib
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
REFERENCE_DRIVER = "reference_job.py"
PIPELINE_DRIVER = "pipeline_driver.py"


@dataclass(frozen=True)
class Artifact:
    version: str
    folder: Path

    @property
    def job_file(self) -> Path:
        return self.folder / self.metadata().get("driver", REFERENCE_DRIVER)

    def metadata(self) -> dict:
        """``artifact.json`` ({} when missing or unreadable: an old or half-built artifact)."""
        try:
            return json.loads((self.folder / "artifact.json").read_text())
        except (OSError, ValueError):
            return {}

    @property
    def pipeline(self) -> dict | None:
        """The user pipeline this artifact runs (None: the reference job)."""
        return self.metadata().get("pipeline")

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
    pipeline_code: Path | None = None,
) -> Artifact:
    """Freeze the current code as ``version`` (an existing artifact is kept unless ``force``).

    ``pipeline_code`` (default: ``config.pipeline_code``) is a user's pipeline package folder: it is
    loaded first (a broken contract fails the build, not the driver) and packed with the runtime.

    Two deliberately broken versions, for testing aborts: ``fail_at_start`` fails after the driver
    took an attempt in the ledger; ``import_error`` dies at import, before it reaches the ledger (the
    driver script imports a module no artifact has). Both are decided here, at build time, so a
    real version's driver pays nothing for them.
    """
    art = artifact(config, version)
    if art.exists() and not force:
        return art
    code = pipeline_code or config.pipeline_code
    pipeline = _pipeline_meta(Path(code)) if code is not None else None
    driver = PIPELINE_DRIVER if pipeline else REFERENCE_DRIVER
    tmp = art.folder.with_name(f".{version}.building-{time.time_ns()}")
    tmp.mkdir(parents=True)
    shutil.copy2(PROJECT_ROOT / "spark_jobs" / driver, tmp / driver)
    if import_error:
        _break_imports(tmp / driver)
    with zipfile.ZipFile(tmp / "relay_job.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for src_root, prefix in (
            (PROJECT_ROOT / "include" / "relay", "relay"),
            (PROJECT_ROOT / "spark_jobs", ""),
        ):
            for path in sorted(src_root.rglob("*.py")):
                if "__pycache__" in path.parts or path.name in (REFERENCE_DRIVER, PIPELINE_DRIVER):
                    continue
                zf.write(path, str(Path(prefix) / path.relative_to(src_root)))
        version_module = f"VERSION = {version!r}\nFAIL_AT_START = {fail_at_start!r}\n"
        if pipeline:
            package = Path(code).resolve()
            for path in _package_files(package):
                zf.write(path, str(Path(package.name) / path.relative_to(package)))
            version_module += f"PIPELINE_MODULE = {pipeline['module']!r}\n"
        zf.writestr(VERSION_MODULE, version_module)
    (tmp / "artifact.json").write_text(
        json.dumps(
            {
                "version": version,
                "built_at": time.time(),
                "fail_at_start": fail_at_start,
                "import_error": import_error,
                "driver_interface": DRIVER_INTERFACE,
                "driver": driver,
                "pipeline": pipeline,
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


def _package_files(package: Path) -> list[Path]:
    """Every file of a pipeline package (code, SQL, README), compiled caches excluded."""
    return sorted(
        p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def code_hash(package: Path) -> str:
    """sha256 over the package's files (relative path and bytes): what a version froze."""
    digest = hashlib.sha256()
    for path in _package_files(package):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _pipeline_meta(package: Path) -> dict:
    """Load the user's package (checks the contract) and describe it for ``artifact.json``."""
    from relay.pipeline import load_package, module_path

    name, pipeline = load_package(package)
    return {
        "name": pipeline.name,
        "topics": list(pipeline.topics),
        "package": name,
        "module": module_path(name),
        "sink": type(pipeline.sink).__name__,
        "secret_env": list(pipeline.secret_env),
        "code_hash": code_hash(package.resolve()),
        "source": str(package.resolve()),
    }


def check_deployable(config: RelayConfig, art: Artifact) -> dict[str, str]:
    """A user pipeline's artifact must match the configured pipeline and topic; returns the values of
    the environment variables its sink needs (from this process's environment, never logged)."""
    import os

    meta = art.pipeline
    if not meta:
        return {}
    if meta["name"] != config.pipeline or meta["topics"] != [config.topic]:
        raise ConfigError(
            f"version {art.version} is pipeline {meta['name']} on topic(s) {meta['topics']}, but Relay is "
            f"configured for pipeline {config.pipeline} on topic {config.topic}: set RELAY_PIPELINE and "
            "RELAY_TOPIC to the pipeline's"
        )
    missing = [name for name in meta["secret_env"] if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"pipeline {meta['name']} needs the environment variable(s) {', '.join(missing)} "
            "(its sink's settings): set them where relay deploy (or Airflow) runs"
        )
    return {name: os.environ[name] for name in meta["secret_env"]}
