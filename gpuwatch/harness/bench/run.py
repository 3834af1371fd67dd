"""`gpuwatch bench`: the benchmarks of BENCHMARKS.md, each with a baseline from the same run."""

from __future__ import annotations

import gc
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gpuwatch.harness.simulate.node import simple_node
from gpuwatch.kafka import create_topics, delete_topics
from producers.agent.loop import NodeAgent
from producers.base.kafka import KafkaSender, linger_ms
from producers.base.publisher import Publisher
from schemas.nvml_sample import NvmlSample
from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES


@dataclass(frozen=True)
class ProducerResult:
    """CPU per GPU-sample of the node agent's tick, with and without Kafka."""

    gpus_per_node: int
    ticks: int
    tick_cpu_us_per_gpu_sample: float
    """Read (SimReader), resolve, assemble and encode: the agent's own work."""
    with_kafka_cpu_us_per_gpu_sample: float | None
    """The same plus publishing through kafka-python to the broker (all threads), as
    fast as it goes."""
    paced_cpu_us_per_gpu_sample: float | None
    """The agent as deployed: its loop at 10 Hz publishing to Kafka, CPU of all threads
    over the run (the figure the 50 us target is about)."""
    paced_seconds: float
    bare_client_cpu_us_per_gpu_sample: float | None
    """Baseline: a bare kafka-python producer sending the same messages at the same
    10 Hz, with nothing else in the process (the client's own cost)."""
    encode_only_cpu_us_per_gpu_sample: float
    """Baseline: msgspec-encoding an already assembled sample, the floor of any producer."""
    sample_bytes: int

    @property
    def ratio_to_encode(self) -> float:
        """How many times the encode-only floor the tick costs."""
        return self.tick_cpu_us_per_gpu_sample / self.encode_only_cpu_us_per_gpu_sample


def missing_services(settings: Settings, *, redis: bool) -> list[str]:
    """What a benchmark needs that does not answer: the first Kafka server, Redis."""
    from urllib.parse import urlsplit

    from gpuwatch.harness.stack import kafka as stack_kafka
    from sinks.redis import client as redis_client
    from sinks.redis.sink import redact_url

    missing = []
    server = settings.kafka.servers[0]
    parts = urlsplit(f"//{server}")
    if parts.hostname is None or parts.port is None:
        missing.append(f"Kafka bootstrap server {server!r} is not host:port")
    elif not stack_kafka.probe(parts.hostname, parts.port):
        missing.append(f"Kafka at {server} is not answering")
    if redis:
        url = settings.redis.url.get_secret_value()
        try:
            client = redis_client.connect(url, timeout_s=2, connect_timeout_s=2)
            client.ping()
        except (redis_client.RedisError, OSError, ValueError):
            missing.append(f"Redis at {redact_url(url)} is not answering")
    return missing


def missing_binaries(names: list[str]) -> list[str]:
    """What a benchmark runs that is not on PATH (the idle-alert part's `prometheus`)."""
    import shutil

    return [
        f"{name} is not on PATH (install it, or run without the idle-alert part: --no-alerts)"
        for name in names
        if shutil.which(name) is None
    ]


def _discard(_: object) -> None:
    """Call sites measure a function for its cost, not its value."""


def _cpu_per(fn: Callable[[], None], repeats: int) -> float:
    """Process CPU seconds per call of `fn` (all threads), after a warm-up."""
    for _ in range(min(50, repeats)):
        fn()
    gc.collect()
    started = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - started) / repeats


def bench_producer(
    settings: Settings, ticks: int, gpus: int, kafka: bool, paced_seconds: float = 20.0
) -> ProducerResult:
    """Tick a simulated node as fast as it goes and measure CPU per GPU-sample."""
    clock = {"t": 1_764_400_000.0}

    def now() -> float:
        clock["t"] += 1.0
        return clock["t"]

    reader, pods = simple_node("bench-node", gpus, seed=1, now=now)
    sent: list[int] = []
    agent = NodeAgent(
        node="bench-node",
        reader=reader,
        resolver=pods,
        allocations=pods,
        publish=lambda key, value: sent.append(len(value)),
        interval_s=1.0,
    )
    tick_s = _cpu_per(lambda: _discard(agent.tick()), ticks)
    sample = agent.tick()
    encode_s = _cpu_per(lambda: _discard(NVML_SAMPLES.encode(sample)), ticks)

    with_kafka = paced = bare = None
    if kafka:
        prefix = f"gpuwatch-bench-{uuid.uuid4().hex[:8]}."
        scoped = settings.model_copy(
            update={"kafka": settings.kafka.model_copy(update={"topic_prefix": prefix})}
        )
        create_topics(scoped)
        topic = NVML_SAMPLES.full_name(prefix)
        # Configured as the agent at 10 Hz is, the interval the paced figure runs at.
        sender = KafkaSender(
            settings.kafka,
            topic,
            client_id="gpuwatch-bench",
            linger_ms=linger_ms(PACED_INTERVAL_S),
        )
        publisher = Publisher(sender, max_buffer_bytes=256 << 20)
        agent_k = NodeAgent(
            node="bench-node",
            reader=reader,
            resolver=pods,
            allocations=pods,
            publish=publisher.publish,
            interval_s=1.0,
        )
        publisher.start()
        try:
            started = time.process_time()
            for _ in range(ticks):
                agent_k.tick()
            deadline = time.monotonic() + 60
            while publisher.stats.sent + publisher.stats.failed < ticks:
                if time.monotonic() > deadline:
                    raise RuntimeError("the broker did not acknowledge the benchmark's samples")
                time.sleep(0.01)
            with_kafka = (time.process_time() - started) / ticks
            paced = _paced(agent_k, publisher, paced_seconds)
            bare = _bare_client(settings, NVML_SAMPLES.full_name(prefix), sample, paced_seconds)
        finally:
            publisher.stop(timeout_s=10)
            delete_topics(scoped)
    per = 1e6 / gpus
    return ProducerResult(
        gpus_per_node=gpus,
        ticks=ticks,
        tick_cpu_us_per_gpu_sample=tick_s * per,
        with_kafka_cpu_us_per_gpu_sample=None if with_kafka is None else with_kafka * per,
        paced_cpu_us_per_gpu_sample=None if paced is None else paced * per,
        paced_seconds=paced_seconds,
        bare_client_cpu_us_per_gpu_sample=None if bare is None else bare * per,
        encode_only_cpu_us_per_gpu_sample=encode_s * per,
        sample_bytes=sent[-1],
    )


PACED_INTERVAL_S = 0.1  # 10 Hz: the fastest the agent is meant to run


def _paced(agent: NodeAgent, publisher: Publisher, seconds: float) -> float:
    """CPU seconds per tick of the agent's own loop at 10 Hz, publishing to Kafka."""
    agent.interval_s = PACED_INTERVAL_S
    before_ticks, before_sent = agent.stats.ticks, publisher.stats.sent
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    started = time.process_time()
    timer.start()
    try:
        agent.run(stop)
        ticks = agent.stats.ticks - before_ticks
        deadline = time.monotonic() + 30
        while publisher.stats.sent - before_sent < ticks and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        timer.cancel()
    return (time.process_time() - started) / max(1, ticks)


def _bare_client(settings: Settings, topic: str, sample: NvmlSample, seconds: float) -> float:
    """CPU seconds per message of kafka-python alone, at 10 Hz, with the agent's options."""
    value, key = NVML_SAMPLES.encode(sample), sample.node.encode()
    sender = KafkaSender(
        settings.kafka,
        topic,
        client_id="gpuwatch-bench-bare",
        linger_ms=linger_ms(PACED_INTERVAL_S),
    )
    acked = threading.Semaphore(0)
    sender.send(key, value, lambda _error: acked.release())
    acked.acquire(timeout=30)
    count = max(1, int(seconds / PACED_INTERVAL_S))
    started = time.process_time()
    next_at = time.monotonic()
    for _ in range(count):
        sender.send(key, value, lambda _error: acked.release())
        next_at += PACED_INTERVAL_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    for _ in range(count):
        acked.acquire(timeout=30)
    cost = (time.process_time() - started) / count
    sender.close(10)
    return cost


def format_producer(result: ProducerResult) -> str:
    """A human summary of the producer benchmark."""
    lines = [
        f"producer: {result.ticks} ticks of a {result.gpus_per_node}-GPU simulated node, "
        f"{result.sample_bytes} bytes per sample",
        f"  tick (read, resolve, assemble, encode): "
        f"{result.tick_cpu_us_per_gpu_sample:8.1f} us CPU per GPU-sample",
    ]
    if result.with_kafka_cpu_us_per_gpu_sample is not None:
        lines.append(
            f"  tick + publish to Kafka (all threads): "
            f"{result.with_kafka_cpu_us_per_gpu_sample:8.1f} us CPU per GPU-sample"
        )
    if result.paced_cpu_us_per_gpu_sample is not None:
        lines.append(
            f"  agent loop at 10 Hz for {result.paced_seconds:.0f} s with Kafka: "
            f"{result.paced_cpu_us_per_gpu_sample:8.1f} us CPU per GPU-sample"
        )
    if result.bare_client_cpu_us_per_gpu_sample and result.paced_cpu_us_per_gpu_sample:
        ratio = result.paced_cpu_us_per_gpu_sample / result.bare_client_cpu_us_per_gpu_sample
        lines.append(
            f"  baseline, bare kafka-python at 10 Hz:  "
            f"{result.bare_client_cpu_us_per_gpu_sample:8.1f} us CPU per GPU-sample "
            f"(agent = {ratio:.2f}x)"
        )
    lines.append(
        f"  baseline, encode only:                  "
        f"{result.encode_only_cpu_us_per_gpu_sample:8.1f} us CPU per GPU-sample "
        f"(tick = {result.ratio_to_encode:.1f}x)"
    )
    return "\n".join(lines)


def producer_json(result: ProducerResult) -> str:
    """One JSON line with the producer figures."""
    data = asdict(result)
    data["producer_cpu_us_per_gpu_sample"] = (
        result.paced_cpu_us_per_gpu_sample or result.tick_cpu_us_per_gpu_sample
    )
    data["ratio_to_encode"] = result.ratio_to_encode
    if result.paced_cpu_us_per_gpu_sample and result.bare_client_cpu_us_per_gpu_sample:
        data["ratio_to_bare_client"] = (
            result.paced_cpu_us_per_gpu_sample / result.bare_client_cpu_us_per_gpu_sample
        )
    return json.dumps(data, sort_keys=True)
