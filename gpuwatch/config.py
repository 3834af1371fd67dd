"""Loads the settings object: defaults < YAML file < GPUWATCH_* environment < CLI flags.

This is the one place that reads the environment. A bad value fails here, at start,
with a message that names where it came from: the variable, the file key or the flag.

The layers are merged here rather than by pydantic-settings: its sources are merged
before validation, so a failure could name the field but not the variable, file key or
flag that set it, and its settings classes read the environment when built, where here
`schemas.settings` stays a plain model that this module alone fills.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from schemas.prices import PriceTable
from schemas.settings import ENV_VARS, Settings

CONFIG_ENV = "GPUWATCH_CONFIG"

Source = str  # "GPUWATCH_X", "file.yaml: group.field" or "--flag"

# Variables whose values are never echoed in an error message.
_SECRET_VARS = frozenset({"GPUWATCH_REDIS_URL", "GPUWATCH_KAFKA_SASL_PASSWORD"})


class SettingsError(Exception):
    """A setting has a value that cannot be used; the message names its source."""


def load_settings(
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings from `env` (default: os.environ), a YAML file and CLI overrides.

    `overrides` maps "group.field" to a value and a flag name in brackets is not
    needed: the source shown in errors is "--group-field".
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    data: dict[str, dict[str, Any]] = {}
    sources: dict[tuple[str, str], Source] = {}

    for group, field, value in _defaults(environ):
        data.setdefault(group, {})[field] = value

    path = config_file or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    if path is not None:
        for group, field, value in _read_yaml(path):
            data.setdefault(group, {})[field] = value
            sources[(group, field)] = f"{path}: {group}.{field}"

    for var, (group, field) in ENV_VARS.items():
        if var in environ:
            raw = environ[var]
            data.setdefault(group, {})[field] = None if raw == "" else raw
            sources[(group, field)] = var if var in _SECRET_VARS else f"{var}={raw!r}"

    for dotted, value in (overrides or {}).items():
        group, _, field = dotted.partition(".")
        data.setdefault(group, {})[field] = value
        sources[(group, field)] = "--" + dotted.replace(".", "-").replace("_", "-")

    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(_explain(exc, sources)) from exc
    return _with_prices(settings, sources)


def _defaults(environ: Mapping[str, str]) -> list[tuple[str, str, Any]]:
    """Defaults that depend on the user's home: XDG state and cache directories."""
    home = Path(environ.get("HOME") or Path.home())
    state = Path(environ.get("XDG_STATE_HOME") or home / ".local" / "state") / "gpuwatch"
    cache = Path(environ.get("XDG_CACHE_HOME") or home / ".cache") / "gpuwatch"
    return [("stack", "state_dir", state), ("stack", "cache_dir", cache)]


def _read_yaml(path: Path) -> list[tuple[str, str, Any]]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read the settings file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        return []
    if not isinstance(loaded, dict):
        raise SettingsError(f"{path}: expected a mapping of groups (kafka:, redis:, ...)")
    items: list[tuple[str, str, Any]] = []
    for group, fields in loaded.items():
        if group not in Settings.model_fields:
            known = ", ".join(Settings.model_fields)
            raise SettingsError(f"{path}: unknown settings group {group!r} (known: {known})")
        if not isinstance(fields, dict):
            raise SettingsError(f"{path}: {group}: expected a mapping of settings")
        items.extend((str(group), str(field), value) for field, value in fields.items())
    return items


def _explain(exc: ValidationError, sources: Mapping[tuple[str, str], Source]) -> str:
    lines = []
    for error in exc.errors():
        loc = tuple(str(part) for part in error["loc"])
        key = (loc[0], loc[1]) if len(loc) >= 2 else (loc[0], "")
        source = sources.get(key)
        if source is None:
            # A whole group's rule (two settings that go together) has no one source.
            source = ".".join(loc) + (" (default)" if len(loc) >= 2 else "")
        elif len(loc) > 2:
            source = f"{source} at {'.'.join(loc[2:])}"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown setting"
        lines.append(f"{source}: {message}")
    return "invalid settings:\n  " + "\n  ".join(lines)


def _with_prices(settings: Settings, sources: Mapping[tuple[str, str], Source]) -> Settings:
    path = settings.cost.prices_file
    if path is None:
        return settings
    source = sources.get(("cost", "prices_file"), "cost.prices_file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{source}: cannot read the price table: {exc.strerror}") from exc
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        table = PriceTable.model_validate(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise SettingsError(f"{source}: not a valid price table: {exc}") from exc
    cost = settings.cost.model_copy(update={"prices": table})
    return settings.model_copy(update={"cost": cost})
