"""Read deployment choices from the environment; a bad value stops start-up with its name."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from dotenv import load_dotenv

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {raw!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def load_env_file(default: Path) -> Path | None:
    """Read the KEY=value lines of a .env file into the environment; the environment wins.

    ENV_FILE names another file (a missing one stops start-up); ENV_FILE= (empty) reads none.
    Returns the file read, if any.
    """
    named = os.environ.get("ENV_FILE")
    if named == "":
        return None
    path = Path(named) if named else default
    if not path.is_file():
        if named:
            raise ImproperlyConfigured(f"ENV_FILE names {named!r}, which is not a file")
        return None
    load_dotenv(path, override=False)
    return path
