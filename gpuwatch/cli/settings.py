"""`gpuwatch settings`: print the settings in force."""

from __future__ import annotations

import argparse
from typing import Any

from gpuwatch.cli.options import add_verb
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `settings` verb."""
    add_verb(
        verbs,
        "settings",
        _settings_show,
        "print the settings in force (secrets masked)",
        "Print the effective settings as YAML after defaults, the settings "
        "file, GPUWATCH_* variables and flags are applied. Secrets are masked.",
    )


def _settings_show(args: argparse.Namespace, settings: Settings) -> int:
    import yaml

    data = settings.model_dump(mode="json")
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0
