"""A Faust app and the Faust worker that runs it in this process.

Faust is untyped at this edge (`Any`). Every app here reads raw bytes, keeps its tables in
memory, serves no web pages and reads no environment variables of its own (`env={}`: the
settings are read in one place, `gpuwatch.config`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust

from schemas.settings import KafkaSettings
from streams.faust.clients import credentials
from streams.faust.internals import SignalHandler, bound_signal_handlers

__all__ = ["new_app", "new_worker", "run_worker"]


def new_app(app_id: str, kafka: KafkaSettings, datadir: Path | str, **options: Any) -> Any:
    """A Faust app of the settings' cluster, with Faust `options` of its own.

    A group without a commit reads its topics from their start; Faust declares no topic
    leader.
    """
    return faust.App(
        app_id,
        env={},
        broker=[f"kafka://{server}" for server in kafka.servers],
        broker_credentials=credentials(kafka),
        store="memory://",
        datadir=str(datadir),
        topic_partitions=kafka.partitions,
        topic_disable_leader=True,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        **options,
    )


def new_worker(
    app: Any, loglevel: str, wrap_stop: Callable[[SignalHandler], SignalHandler] | None = None
) -> Any:
    """A Faust worker for `app` that leaves logging and stdout as they are.

    Logging stays as the CLI set it up (one format for every verb): mode would replace the
    root handlers with its own, filtered at the Faust log level. With `wrap_stop`, SIGTERM
    and SIGINT run `wrap_stop(Faust's handler)`.
    """
    worker = faust.Worker(
        app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False
    )
    worker.spinner = None  # it draws on stdout even when quiet
    if wrap_stop is not None:
        bound_signal_handlers(worker, wrap_stop)
    return worker


def run_worker(worker: Any) -> int:
    """Run the worker until it stops; the exit status (not 0 when its app crashed)."""
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    if worker.app.crash_reason is not None:
        code = code or 1
    return code
