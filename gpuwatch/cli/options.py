"""Argument helpers for the options several verbs share, so each is written once."""

from __future__ import annotations

import argparse
from typing import Any

from gpuwatch.cli.common import Handler
from schemas.settings import ClusterSettings, Settings, cluster_name


def add_verb(
    verbs: Any, name: str, handler: Handler | None, summary: str, description: str
) -> argparse.ArgumentParser:
    """A verb (or a verb's action) under `verbs`, run by `handler` when it has one."""
    parser: argparse.ArgumentParser = verbs.add_parser(name, help=summary, description=description)
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


def add_actions(parser: argparse.ArgumentParser) -> Any:
    """The required ACTION of a verb with sub-actions (`stack up`, `topics create`)."""
    return parser.add_subparsers(dest="action", metavar="ACTION", required=True)


def add_float(
    parser: Any,
    flag: str,
    text: str,
    *,
    metavar: str = "SECONDS",
    dest: str | None = None,
    default: float | None = None,
) -> None:
    """A float option, seconds unless the metavar says otherwise."""
    parser.add_argument(flag, type=float, metavar=metavar, dest=dest, default=default, help=text)


def add_int(parser: Any, flag: str, metavar: str, text: str, *, dest: str | None = None) -> None:
    """An int option; unset (None) leaves the settings' or the verb's own value."""
    parser.add_argument(flag, type=int, metavar=metavar, dest=dest, help=text)


def add_flag(parser: Any, flag: str, text: str, *, dest: str | None = None) -> None:
    """A store_true option."""
    parser.add_argument(flag, action="store_true", dest=dest, help=text)


def add_duration(parser: argparse.ArgumentParser, text: str, *, dest: str | None = None) -> None:
    """--duration SECONDS: stop after this long."""
    add_float(parser, "--duration", text, dest=dest)


def add_scenario(parser: argparse.ArgumentParser, text: str) -> None:
    """--scenario NAME|FILE: a shipped scenario by name, or a scenario YAML file."""
    parser.add_argument("--scenario", default="small", metavar="NAME|FILE", help=text)


def add_speed(parser: argparse.ArgumentParser, text: str) -> None:
    """--speed FACTOR: simulated time runs FACTOR times faster than wall time."""
    add_float(parser, "--speed", text, metavar="FACTOR", default=1.0)


def add_cluster(parser: argparse.ArgumentParser) -> None:
    """--cluster NAME: the cluster the producers' messages name (setting cluster.name)."""
    parser.add_argument(
        "--cluster",
        type=_cluster_name,
        metavar="NAME",
        help="the cluster every published message names, where many clusters feed one "
        "pipeline; letters, digits, '.', '_' and '-' (env: GPUWATCH_CLUSTER, "
        "default: default, which leaves the field out of the messages)",
    )


def _cluster_name(value: str) -> str:
    try:
        return cluster_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def with_cluster(settings: Settings, args: argparse.Namespace) -> Settings:
    """The settings with --cluster in force where it was given: the flag overrides the
    environment and the settings file (already checked when the arguments were parsed)."""
    name: str | None = getattr(args, "cluster", None)
    if name is None:
        return settings
    return settings.model_copy(update={"cluster": ClusterSettings(name=name)})
