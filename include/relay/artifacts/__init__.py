"""Versioned job code: one immutable artifact per version, so two versions can run side by side.

An artifact is a folder ``<data_dir>/artifacts/<version>/`` holding the driver script and a zip of
the library and the Spark source (shipped with the submission as a py-file). Building a version
freezes the code as it is now; the driver checks that the artifact it runs is the version the
ledger gave its instance. The zip also carries the pipeline package (``pipeline_code``; without
one, Relay's default: ``examples/counter``, the seeds' counter, run under the configured pipeline
name and topic), the driver is ``pipeline_driver.py`` and ``artifact.json`` records the pipeline
(name, topics, module, the environment its sink needs, what its sink declares) and the hash of its
code.

Every artifact also records ``code_hash`` (sha256 of what it froze, its own name left out: two
versions of the same code hash the same, so a plan can say whether an upgrade changes any code) and
``stateful``: what the pipeline declares (``Pipeline(stateful=True)``: its transform runs on the
stream and its checkpoint holds operator state, which an upgrade rebuilds by warm-up replay, see
``relay.pipeline.stateful``); False for every stateless pipeline (the counter's included), whose checkpoint
holds offsets only.
Which versions are kept is ``relay.operations.rollback``'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from relay.config import PROJECT_ROOT, RelayConfig
from relay.config.inputs import validate_version  # noqa: F401 - the one rule, also used by the DAG params
from relay.errors import ConfigError
from relay.pipeline.sink_declares import sink_declares

VERSION_MODULE = "relay_job_version.py"
# Imported first by a version built with ``import_error=True``; no artifact ever ships this module.
MISSING_MODULE = "relay_missing_on_purpose"
FUTURE_IMPORT = "from __future__ import annotations\n"
# How the launcher talks to the driver it freezes. 2: the ledger URL comes in the environment
# (RELAY_LEDGER_URL), never as ``--ledger-url``; older drivers require the argument.
DRIVER_INTERFACE = 2
PIPELINE_DRIVER = "pipeline_driver.py"
DRIVER_MEMBER = "<driver>/"  # the driver script's name in the code hash (it lives beside the zip)
# Never in a zip: the driver (beside it) and the ledger store's bootstrap (installed on every host).
NOT_FROZEN = (PIPELINE_DRIVER, "artifact_bootstrap.py")
DEFAULT_PIPELINE_CODE = PROJECT_ROOT / "examples" / "counter"
"""What a pipeline without ``pipeline_code`` runs: the seeds' counter (executor-side
``LedgerMessagesSink``), under the configured pipeline name and topic."""


@dataclass(frozen=True)
class Artifact:
    version: str
    folder: Path

    @property
    def job_file(self) -> Path:
        return self.folder / self.metadata().get("driver", PIPELINE_DRIVER)

    def metadata(self) -> dict:
        """``artifact.json`` ({} when missing or unreadable: an old or half-built artifact)."""
        try:
            return json.loads((self.folder / "artifact.json").read_text())
        except (OSError, ValueError):
            return {}

    @property
    def pipeline(self) -> dict | None:
        """The pipeline this artifact runs (None: unknown, an artifact half built)."""
        return self.metadata().get("pipeline")

    @property
    def zip_file(self) -> Path:
        return self.folder / "relay_job.zip"

    @property
    def built_at(self) -> float:
        """When it was built (the folder's time for an artifact without ``artifact.json``)."""
        try:
            return float(self.metadata().get("built_at") or self.folder.stat().st_mtime)
        except (OSError, TypeError, ValueError):
            return 0.0

    def code_hash(self) -> str | None:
        """What ``artifact.json`` recorded, else computed from the zip (None: not built)."""
        recorded = self.metadata().get("code_hash")
        if recorded:
            return str(recorded)
        return zip_code_hash(self.zip_file, self.job_file) if self.exists() else None

    def exists(self) -> bool:
        return self.job_file.is_file() and self.zip_file.is_file()


def artifacts_dir(config: RelayConfig) -> Path:
    """``<data_dir>/artifacts``, or ``<data_dir>/pipelines/<pipeline>/artifacts`` for a pipeline a
    pipelines file declares, so two pipelines' ``v1`` never overwrite each other. The environment's
    single pipeline keeps the old layout, and no pipeline's folder ever sits among version folders
    (where pruning could take it for a version)."""
    if shares_artifacts(config):
        return config.data_dir / "artifacts"
    return config.data_dir / "pipelines" / config.pipeline / "artifacts"


def shares_artifacts(config: RelayConfig) -> bool:
    """Whether ``config``'s versions live in the shared ``artifacts/`` folder, where any pipeline run
    without a pipelines file may have built its own (else the pipeline has a folder of its own)."""
    return config.pipelines_file is None


def artifact(config: RelayConfig, version: str) -> Artifact:
    return Artifact(validate_version(version), artifacts_dir(config) / version)


def build_artifact(
    config: RelayConfig,
    version: str,
    fail_at_start: bool = False,
    force: bool = False,
    import_error: bool = False,
    pipeline_code: Path | None = None,
    batch_delay_s: float = 0.0,
) -> Artifact:
    """Freeze the current code as ``version`` (an existing artifact is kept unless ``force``).

    ``pipeline_code`` (default: ``config.pipeline_code``, else DEFAULT_PIPELINE_CODE) is a pipeline
    package folder: it is loaded first (a broken contract fails the build, not the driver) and packed
    with the runtime.

    Two deliberately broken versions, for testing aborts: ``fail_at_start`` fails after the driver
    took an attempt in the ledger; ``import_error`` dies at import, before it reaches the ledger (the
    driver script imports a module no artifact has). ``batch_delay_s`` makes a slow one (each batch
    waits that long first), for testing the cutover gate. All are decided here, at build time, so a
    real version's driver pays nothing for them.
    """
    art = artifact(config, version)
    if art.exists() and not force:
        return art
    package, pipeline = build_meta(config, pipeline_code)
    driver = PIPELINE_DRIVER
    tmp = art.folder.with_name(f".{version}.building-{time.time_ns()}")
    tmp.mkdir(parents=True)
    shutil.copy2(PROJECT_ROOT / "spark_jobs" / driver, tmp / driver)
    if import_error:
        _break_imports(tmp / driver)
    with zipfile.ZipFile(tmp / "relay_job.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for name, path in _members(package):
            zf.write(path, name)
        zf.writestr(
            VERSION_MODULE,
            f"VERSION = {version!r}\n" + _version_settings(fail_at_start, pipeline, batch_delay_s),
        )
    (tmp / "artifact.json").write_text(
        json.dumps(
            {
                "version": version,
                "built_at": time.time(),
                "fail_at_start": fail_at_start,
                "import_error": import_error,
                "batch_delay_s": batch_delay_s,
                "driver_interface": DRIVER_INTERFACE,
                "driver": driver,
                "code_hash": zip_code_hash(tmp / "relay_job.zip", tmp / driver),
                "stateful": bool(pipeline.get("stateful")),
                "pipeline": pipeline,
            }
        )
    )
    if art.folder.exists():
        shutil.rmtree(art.folder)
    tmp.rename(art.folder)
    return art


def _members(package: Path) -> list[tuple[str, Path]]:
    """The zip's members (name, file): the runtime (never its drivers) and the pipeline package."""
    members = []
    for src_root, prefix in (
        (PROJECT_ROOT / "include" / "relay", "relay"),
        (PROJECT_ROOT / "spark_jobs", ""),
    ):
        for path in sorted(src_root.rglob("*.py")):
            if "__pycache__" in path.parts or path.name in NOT_FROZEN:
                continue
            members.append((str(Path(prefix) / path.relative_to(src_root)), path))
    members += [(str(Path(package.name) / p.relative_to(package)), p) for p in _package_files(package)]
    return members


def _version_settings(fail_at_start: bool, pipeline: dict, batch_delay_s: float = 0.0) -> str:
    """The version module after its first line (``VERSION = ...``): what else the driver is told.
    Relay's default pipeline is told to run as the instance's pipeline, on its topic (``AS_CONFIGURED``)."""
    settings = f"FAIL_AT_START = {fail_at_start!r}\n"
    if batch_delay_s:
        settings += f"BATCH_DELAY_S = {float(batch_delay_s)!r}\n"
    settings += f"PIPELINE_MODULE = {pipeline['module']!r}\n"
    if pipeline.get(AS_CONFIGURED):
        settings += "PIPELINE_AS_CONFIGURED = True\n"
    return settings


AS_CONFIGURED = "as_configured"
"""``artifact.json``'s pipeline field set for Relay's default pipeline: it runs as whichever pipeline
deploys it, on that pipeline's topic (the driver takes both from its instance and command line), so
one version serves every pipeline without code, as one data dir's ``artifacts/`` is shared by them.
Its recorded name and topics are the configuration's at build time."""


def build_meta(config: RelayConfig, pipeline_code: Path | None = None) -> tuple[Path, dict]:
    """(the package folder, its ``artifact.json`` description) of what a build freezes: the package
    named, else ``config.pipeline_code``, else DEFAULT_PIPELINE_CODE under the configured pipeline
    name and topic (so any configured pipeline without code runs the counter)."""
    code = pipeline_code or config.pipeline_code
    if code is not None:
        return Path(code).resolve(), pipeline_meta(Path(code))
    meta = pipeline_meta(DEFAULT_PIPELINE_CODE)
    return DEFAULT_PIPELINE_CODE.resolve(), {
        **meta,
        "name": config.pipeline,
        "topics": [config.topic],
        AS_CONFIGURED: True,
    }


def _code_hash(members: list[tuple[str, bytes]], driver: Path) -> str:
    """sha256 over the zip's members and the driver script; the version module's first line (the
    version's name) is left out: a name is not code, so two versions of the same code hash the same."""
    digest = hashlib.sha256()
    named = [(n, d.partition(b"\n")[2] if n == VERSION_MODULE else d) for n, d in members]
    for name, data in sorted([*named, (DRIVER_MEMBER + driver.name, driver.read_bytes())]):
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def zip_code_hash(zip_file: Path, driver: Path) -> str:
    """The ``code_hash`` of a built version (its zip and its driver script)."""
    with zipfile.ZipFile(zip_file) as zf:
        return _code_hash([(n, zf.read(n)) for n in zf.namelist()], driver)


def current_code_hash(config: RelayConfig, pipeline_code: Path | None = None) -> str:
    """The ``code_hash`` a build from the code as it is now would record (nothing is built)."""
    package, pipeline = build_meta(config, pipeline_code)
    version_module = "VERSION = ''\n" + _version_settings(False, pipeline)
    members = [(name, path.read_bytes()) for name, path in _members(package)]
    driver = PROJECT_ROOT / "spark_jobs" / PIPELINE_DRIVER
    return _code_hash([*members, (VERSION_MODULE, version_module.encode())], driver)


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


def pipeline_meta(package: Path) -> dict:
    """Load the user's package (checks the contract) and describe it for ``artifact.json``."""
    from relay.pipeline import load_package, module_path

    name, pipeline = load_package(package)
    declares = sink_declares(pipeline)
    return {
        "name": pipeline.name,
        "topics": list(pipeline.topics),
        "package": name,
        "module": module_path(name),
        "sink": declares["type"] or type(pipeline.sink).__name__,
        "sink_declares": declares,
        "secret_env": list(pipeline.secret_env),
        "stateful": pipeline.stateful,
        "warm_up_s": pipeline.warm_up_s if pipeline.stateful else 0,  # 0: no warm-up (None: unknown)
        "code_hash": code_hash(package.resolve()),
        "source": str(package.resolve()),
    }


def deploy_problems(config: RelayConfig, version: str, meta: dict | None) -> list[str]:
    """Why a user pipeline's version can't run under this configuration and environment ([]: it can)."""
    if not meta:
        return []
    problems = []
    named = not meta.get(AS_CONFIGURED)  # Relay's default pipeline runs as the configured one
    if named and (meta["name"] != config.pipeline or meta["topics"] != [config.topic]):
        problems.append(
            f"version {version} is pipeline {meta['name']} on topic(s) {meta['topics']}, but Relay is "
            f"configured for pipeline {config.pipeline} on topic {config.topic}: set RELAY_PIPELINE and "
            "RELAY_TOPIC to the pipeline's"
        )
    missing = [name for name in _secret_names(config, meta) if not os.environ.get(name)]
    if missing:
        problems.append(
            f"pipeline {meta['name']} needs the environment variable(s) {', '.join(missing)} "
            "(its sink's settings): set them where relay deploy runs, or in Airflow as Variables of "
            "the same name (for the names the pipelines file lists in secret_env)"
        )
    return problems


def check_deployable(config: RelayConfig, art: Artifact) -> dict[str, str]:
    """A user pipeline's artifact must match the configured pipeline and topic; returns the values of
    the environment variables its sink needs (from this process's environment, never logged)."""
    meta = art.pipeline
    problems = deploy_problems(config, art.version, meta)
    if problems:
        raise ConfigError(problems[0])
    return {name: os.environ[name] for name in _secret_names(config, meta)} if meta else {}


def _secret_names(config: RelayConfig, meta: dict) -> list[str]:
    """The variables the package's sink declares, then those the pipelines file adds (names only)."""
    return list(dict.fromkeys([*meta["secret_env"], *config.secret_env]))
