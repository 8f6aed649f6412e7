"""Reading one ``RELAY_*`` variable: a number within its bounds, a switch, a path; refused in one line.

Apart from the settings so the stack's and the pipeline's readers (``relay.config.addresses``,
``relay.config.pipeline``) share one set of rules for what a variable may hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from relay.errors import ConfigError


def env_int(
    env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int = 2**31 - 1
) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {raw[:40]!r}") from exc
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {raw[:40]}")
    return value


def env_optional_int(env: Mapping[str, str], name: str, minimum: int, maximum: int) -> int | None:
    """``env_int`` where unset (or ``auto``) means Relay decides: None."""
    if env.get(name, "").strip().lower() in ("", "auto"):
        return None
    return env_int(env, name, 0, minimum, maximum)


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {env.get(name)!r}")


def env_path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name)
    return Path(raw).expanduser().resolve() if raw else None
