"""The Faust floors: an app whose one agent only decodes the node samples it reads.

It is the worker's app stripped to its consumer: the same Faust and aiokafka, raw bytes,
batches of the worker's size, each value decoded once, nothing sent. With `inbox` the
records reach the agent as they reach the worker's agents (`streams.faust.inbox`: the
worker's floor); without, through Faust's own stream (`take_events`: Faust's floor). What
the worker costs above them is its own (`gpuwatch bench worker`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES
from streams.faust.consumer import rewinding_consumer
from streams.faust.inbox import Inbox, Inboxes
from streams.faust.internals import use_consumer_class
from streams.faust.process import new_app, new_worker
from streams.runtime.agent_loop import BATCH_MAX, BATCH_WITHIN_S

__all__ = ["run_floor"]


def run_floor(
    settings: Settings,
    topic_name: str,
    last: dict[int, int],
    done: Callable[[dict[str, float]], None],
    *,
    inbox: bool = False,
) -> None:
    """Read `topic_name` from the start until each partition's `last` offset, then `done`.

    Records after `last` are decoded as they come. `done` gets the figures (seconds and CPU
    seconds from the first batch to the last, GPU-samples, messages) inside the agent, and
    ends the process: a clean Faust stop takes seconds. Returns if the worker stops first.
    """
    kafka = settings.kafka
    app = new_app(f"{kafka.app_id}-floor", kafka, tempfile.mkdtemp(prefix="gpuwatch-floor-"))
    topic = app.topic(topic_name, key_type=bytes, value_type=bytes, partitions=kafka.partitions)
    left = dict(last)
    seen = {"messages": 0, "gpus": 0}
    started: list[float] = []

    def decode(messages: list[Any]) -> None:
        if not started:
            started.extend((time.monotonic(), time.process_time()))
        for message in messages:
            seen["gpus"] += len(NVML_SAMPLES.decode(message.value).gpus)
            if message.offset >= left.get(message.partition, message.offset + 1):
                del left[message.partition]
        seen["messages"] += len(messages)
        if not left:
            done(
                {
                    "seconds": time.monotonic() - started[0],
                    "cpu_seconds": time.process_time() - started[1],
                    "gpu_samples": seen["gpus"],
                    "messages": seen["messages"],
                }
            )

    if inbox:
        box = Inbox("floor", (topic_name,))
        inboxes = Inboxes(app, (box,))
        use_consumer_class(app, lambda base: rewinding_consumer(base, box.topics, inboxes))

        async def floor(stream: Any) -> None:
            async for messages in inboxes.batches(box, BATCH_MAX, BATCH_WITHIN_S):
                decode(messages)

    else:

        async def floor(stream: Any) -> None:
            async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
                decode([event.message for event in events])

    app.agent(topic, name="gpuwatch-floor")(floor)
    new_worker(app, "WARNING").execute_from_commandline()
