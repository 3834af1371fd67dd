"""What the verbs' handlers share: the handler type, the user-facing error, progress lines."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from schemas.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]


class UserFacingError(Exception):
    """An error whose message is all the user needs; printed without a traceback."""


def progress(message: str) -> None:
    """Tell the user on stderr what a long step is doing."""
    print(f"... {message}", file=sys.stderr, flush=True)


def daemon_logging(args: argparse.Namespace) -> None:
    """Raise the default log level to INFO: a daemon says what it does."""
    if args.log_level == "WARNING":
        logging.getLogger().setLevel(logging.INFO)
