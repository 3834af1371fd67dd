"""The Faust floor of `gpuwatch bench worker`: an agent that only decodes the samples it reads.

Run as `python -m gpuwatch.bench.floor TOPIC LAST` with the worker's settings in the
environment; `LAST` is a JSON object, partition -> the offset to read up to (records after
it are decoded as they come). It is the worker's app stripped to its consumer: the same
Faust and aiokafka, raw bytes, batches taken as the worker's agents take them, each value
decoded once, nothing sent. It prints one JSON line (seconds and CPU seconds from the first
batch to the last, GPU-samples) and exits. What the worker costs above it is its own.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import faust

from gpuwatch.config import load_settings
from schemas.topics import NVML_SAMPLES
from streams.faust.app import credentials
from streams.runtime.agent_loop import BATCH_MAX, BATCH_WITHIN_S

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Read `TOPIC` from the start until each partition's `LAST` offset; print the figures."""
    topic_name = argv[0]
    left = {int(p): int(last) for p, last in json.loads(argv[1]).items()}
    settings = load_settings()
    kafka = settings.kafka
    app: Any = faust.App(
        f"{kafka.app_id}-floor",
        env={},
        broker=[f"kafka://{server}" for server in kafka.servers],
        broker_credentials=credentials(kafka),
        store="memory://",
        datadir=tempfile.mkdtemp(prefix="gpuwatch-floor-"),
        topic_partitions=kafka.partitions,
        topic_disable_leader=True,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
    )
    topic = app.topic(topic_name, key_type=bytes, value_type=bytes, partitions=kafka.partitions)
    seen = {"messages": 0, "gpus": 0}
    started: list[float] = []

    async def floor(stream: Any) -> None:
        async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
            if not started:
                started.extend((time.monotonic(), time.process_time()))
            for event in events:
                message = event.message
                seen["gpus"] += len(NVML_SAMPLES.decode(message.value).gpus)
                if message.offset >= left.get(message.partition, message.offset + 1):
                    del left[message.partition]
            seen["messages"] += len(events)
            if not left:
                figures = {
                    "seconds": time.monotonic() - started[0],
                    "cpu_seconds": time.process_time() - started[1],
                    "gpu_samples": seen["gpus"],
                    "messages": seen["messages"],
                }
                print(json.dumps(figures), flush=True)
                os._exit(0)  # the figures are out; a clean Faust stop takes seconds

    app.agent(topic, name="gpuwatch-floor")(floor)
    worker: Any = faust.Worker(
        app, loglevel="WARNING", quiet=True, redirect_stdouts=False, override_logging=False
    )
    worker.spinner = None
    worker.execute_from_commandline()
    return 1  # the agent exits the process once it has read everything


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
