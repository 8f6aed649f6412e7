"""Going back to the version that ran before, and keeping the versions one can go back to.

A rollback is an upgrade to an older artifact: the same warm standby, handoff, gates, drain and
audit. What is its own is the target, and that it never rebuilds it: an upgrade builds a missing
version from the current code, which under an old version's name would run today's code. So a
rollback needs the old artifact, and retention (:func:`prune_versions`) never deletes it, nor a
version a live instance runs, nor the one a stopped pipeline ran last (``relay deploy``'s default),
nor the two versions of an upgrade in progress. Artifacts are shared by every pipeline of a data dir, so
what is protected is read for every pipeline of the ledger.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections import defaultdict
from typing import Any

from sqlalchemy import select

from relay.artifacts import Artifact, artifact, artifacts_dir, shares_artifacts, validate_version
from relay.config import RelayConfig
from relay.errors import ConfigError, LedgerError, OperationError
from relay.ledger import schema as s
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.upgrade_plan import in_progress_reason, plan_upgrade
from relay.operations.upgrade_state import ALL_TERMINAL, UpgradeState

UPGRADE_SCAN = 200  # newest upgrades searched for the one that started the running instance
DONE = UpgradeState.DONE.value
SHORT_HASH = 12


def _active(ledger: Ledger, pipeline: str) -> Instance:
    """The one ACTIVE instance (a rollback replaces what runs; nothing ACTIVE, nothing to replace)."""
    running = ledger.in_progress(pipeline, ALL_TERMINAL)
    if running:
        raise OperationError(in_progress_reason(running[0]))
    active = [i for i in ledger.instances(pipeline, live_only=True) if i.state is InstanceState.ACTIVE]
    if len(active) != 1:
        raise OperationError(
            f"a rollback replaces the running version, and {pipeline} has {len(active)} ACTIVE instance(s): "
            "to start an older version on a stopped pipeline use relay deploy --version VERSION"
        )
    return active[0]


def _previous_of(ledger: Ledger, pipeline: str, instance_id: int) -> tuple[str, int] | None:
    """(blue's version, upgrade id) of the finished upgrade whose green is ``instance_id``."""
    for op in ledger.operations(pipeline, "upgrade", UPGRADE_SCAN):
        if op["state"] == DONE and op["data"].get("green_id") == instance_id:
            return str(op["data"]["blue_version"]), int(op["id"])
    return None


def previous_version(config: RelayConfig, ledger: Ledger) -> str:
    """The version that ran before the ACTIVE one: blue's version in the upgrade that started it.

    OperationError when there is none (the instance was started by ``relay deploy`` or a recovery,
    or an operation is in progress) or when that version's artifact is gone.
    """
    current = _active(ledger, config.pipeline)
    found = _previous_of(ledger, config.pipeline, current.id)
    if found is None:
        raise OperationError(
            f"instance {current.id} ({current.version}) was not started by a finished upgrade (relay "
            "deploy or a recovery started it): no previous version is recorded; pass --to VERSION"
        )
    version, upgrade_id = found
    art = artifact(config, version)
    if not art.exists():
        raise OperationError(
            f"the previous version {version} (blue of upgrade {upgrade_id}) has no artifact at {art.folder} "
            "any more: a rollback runs frozen code and never rebuilds an old version from today's code"
        )
    return version


def rollback_target(config: RelayConfig, ledger: Ledger, to: str | None = None) -> str:
    """``to`` (its artifact must exist) or the previous version."""
    if to is None:
        return previous_version(config, ledger)
    art = artifact(config, validate_version(to))
    if not art.exists():
        raise OperationError(
            f"version {to} has no artifact at {art.folder} (pruned, or never built here): a rollback "
            "runs frozen code and never rebuilds an old version from today's code"
        )
    return to


def rollback(config: RelayConfig, to: str | None = None, **upgrade_kwargs: Any) -> dict:
    """Upgrade back to ``to`` (default: the previous version); ``upgrade_kwargs`` go to ``upgrade``."""
    from relay.operations.upgrade import upgrade  # upgrade's finish step prunes through this module

    target = rollback_target(config, Ledger(config.ledger_url), to)
    return upgrade(config, target, **upgrade_kwargs)


def plan_rollback(config: RelayConfig, to: str | None = None, **plan_kwargs: Any) -> dict:
    """``plan_upgrade`` of the rollback's target; a target whose artifact is gone blocks it."""
    ledger = Ledger(config.ledger_url)
    target = previous_version(config, ledger) if to is None else validate_version(to)
    plan = plan_upgrade(config, target, **plan_kwargs)
    plan["kind"] = "rollback plan"
    if not artifact(config, target).exists():
        plan["blocked"].append(
            f"version {target} has no artifact (pruned, or never built here): a rollback runs frozen "
            "code and never rebuilds an old version from today's code"
        )
    return plan


# ------------------------------------------------------------------------------ retention
def all_artifacts(config: RelayConfig) -> list[Artifact]:
    """Every built version, newest first; half-built or half-removed folders (``.name``) are skipped."""
    root = artifacts_dir(config)
    found = []
    for folder in root.iterdir() if root.is_dir() else ():
        if folder.is_dir() and not folder.name.startswith("."):
            try:
                found.append(artifact(config, folder.name))
            except ConfigError:
                continue  # not a version's folder (a name no version can have)
    return sorted(found, key=lambda a: (a.built_at, a.version), reverse=True)


def remove_artifact(art: Artifact) -> None:
    """Delete a version's folder: renamed away first, so nobody ever sees half an artifact."""
    doomed = art.folder.with_name(f".{art.version}.removing-{time.time_ns()}")
    art.folder.rename(doomed)
    shutil.rmtree(doomed)


def sharing_folder(config: RelayConfig) -> list[str] | None:
    """The pipelines whose versions live in ``config``'s artifacts folder: None (every pipeline of
    the ledger) for the shared folder, else this one alone."""
    return None if shares_artifacts(config) else [config.pipeline]


def protected_versions(ledger: Ledger, pipelines: list[str] | None = None) -> dict[str, list[str]]:
    """version -> why it must stay, over ``pipelines`` (default: every pipeline of the ledger)."""
    from relay.operations.deploy import current_version

    if pipelines is None:
        with ledger.tx() as conn:
            pipelines = [row[0] for row in conn.execute(select(s.pipelines.c.name)).all()]
    why: dict[str, list[str]] = defaultdict(list)
    for p in pipelines:
        instances = ledger.instances(p)
        for inst in instances:
            if inst.state.live:
                why[inst.version].append(f"{p} instance {inst.id} runs it ({inst.state.value})")
        if instances:
            why[current_version(ledger, p)].append(f"{p} ran it last (relay deploy's default)")
        done = next((op for op in ledger.operations(p, "upgrade", UPGRADE_SCAN) if op["state"] == DONE), None)
        if done is not None:
            why[str(done["data"]["blue_version"])].append(f"{p}'s rollback target")
        for op in ledger.in_progress(p, ALL_TERMINAL):  # pruned from its finish step: not DONE yet
            if op["kind"] == "upgrade":
                if op["params"].get("version"):  # every upgrade names one; never trip on a record
                    why[str(op["params"]["version"])].append(f"{p}'s upgrade {op['id']} goes to it")
                if op["data"].get("blue_version"):
                    why[str(op["data"]["blue_version"])].append(f"{p}'s upgrade {op['id']} replaces it")
    return {v: list(dict.fromkeys(reasons)) for v, reasons in why.items()}


def prune_versions(config: RelayConfig, ledger: Ledger) -> dict:
    """Keep the newest ``config.keep_versions`` artifacts by build time, and every protected one.

    Without a readable ledger nothing is removed: which versions run would be a guess.
    """
    arts = all_artifacts(config)
    try:
        protected = protected_versions(ledger, sharing_folder(config))
    except LedgerError as exc:
        return {
            "keep_versions": config.keep_versions,
            "removed": [],
            "kept": [a.version for a in arts],
            "skipped": f"{exc}: nothing removed (which versions run is unknown)",
        }
    removed = []
    for art in arts[config.keep_versions :]:
        if art.version not in protected:
            with contextlib.suppress(FileNotFoundError):  # another prune removed it first
                remove_artifact(art)
                removed.append(art.version)
    return {
        "keep_versions": config.keep_versions,
        "removed": removed,
        "kept": [a.version for a in arts if a.version not in removed],
        "protected": {a.version: protected[a.version] for a in arts if a.version in protected},
    }


def versions_view(config: RelayConfig, ledger: Ledger) -> dict:
    """``relay versions``: every artifact, newest first, who runs it and which one a rollback takes."""
    note, live, previous, protected = None, [], None, {}
    try:
        protected = protected_versions(ledger, sharing_folder(config))
        live = ledger.instances(config.pipeline, live_only=True)
        with contextlib.suppress(OperationError):
            previous = previous_version(config, ledger)
    except LedgerError as exc:
        note = f"{exc}: which versions run is unknown"
    rows = []
    for art in all_artifacts(config):
        meta, digest = art.metadata(), art.code_hash()
        rows.append(
            {
                "version": art.version,
                "built_at": art.built_at,
                "pipeline": (art.pipeline or {}).get("name", "(unknown)"),
                "driver": meta.get("driver"),
                "code_hash": digest[:SHORT_HASH] if digest else None,
                "runs": ", ".join(
                    f"instance {i.id} ({i.state.value})" for i in live if i.version == art.version
                ),
                "previous": art.version == previous,
                "kept_because": "; ".join(protected.get(art.version, [])),
            }
        )
    return {
        "pipeline": config.pipeline,
        "artifacts_dir": str(artifacts_dir(config)),
        "keep_versions": config.keep_versions,
        "previous": previous,
        "note": note,
        "versions": rows,
    }
