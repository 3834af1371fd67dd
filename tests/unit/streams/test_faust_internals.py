"""The Faust and aiokafka internals `streams.faust.internals` relies on, as the pinned versions
have them: a Faust or aiokafka upgrade that changes one fails here, not in a running worker.

Nothing here connects or starts a thread: the app is built (nothing connects until it
starts) and the consumer thread and clients are replaced by fakes where Faust would use them.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiokafka
import pytest
from faust.exceptions import NotReady
from faust.transport.consumer import ThreadDelegateConsumer
from faust.transport.drivers import aiokafka as driver
from faust.types import TP

from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES
from streams.faust import internals
from streams.faust.app import WorkerOptions, WorkerRuntime, build
from streams.faust.internals import aiokafka_producer_of, committed_offset
from streams.faust.process import new_worker


@pytest.fixture
def runtime(tmp_path: Path) -> WorkerRuntime:
    threads = threading.active_count()
    built = build(Settings(), WorkerOptions(datadir=tmp_path))
    assert threading.active_count() == threads  # building starts nothing
    return built


def _positional(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def test_the_producer_accessor_gives_the_client_faust_started(
    runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = runtime.app.producer
    assert type(producer) is driver.Producer
    with pytest.raises(NotReady):
        aiokafka_producer_of(producer)  # not started yet

    class Client:
        async def start(self) -> None:
            pass

    client = Client()

    async def no_buffer(service: Any) -> None:
        pass

    monkeypatch.setattr(producer, "_new_producer", lambda: client)
    monkeypatch.setattr(producer, "add_runtime_dependency", no_buffer)
    asyncio.run(producer.on_start())
    assert aiokafka_producer_of(producer) is client


def test_the_aiokafka_producer_takes_whole_record_batches() -> None:
    # What `Batches` calls on the client the accessor gives.
    assert _positional(aiokafka.AIOKafkaProducer.send_batch)[:3] == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("batch", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("topic", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ]
    assert "partition" in inspect.signature(aiokafka.AIOKafkaProducer.send_batch).parameters
    assert callable(aiokafka.AIOKafkaProducer.create_batch)


def test_the_app_consumer_is_the_rewinding_subclass_of_faust_s(runtime: WorkerRuntime) -> None:
    assert driver.Transport.Consumer is driver.Consumer
    consumer = runtime.app.consumer
    assert type(consumer).__name__ == "RewindingConsumer"
    assert type(consumer).__mro__[1] is driver.Consumer
    assert type(consumer).__module__ == driver.Consumer.__module__
    assert isinstance(consumer, ThreadDelegateConsumer)
    assert type(consumer._thread) is driver.AIOKafkaConsumerThread


def test_faust_s_fetch_loop_has_what_the_inbox_fetch_loop_replaces_and_reads(
    runtime: WorkerRuntime,
) -> None:
    # `drain_messages` is Faust's `_drain_messages` with the agents' records put into their
    # inboxes: the loop it replaces awaits the conductor's callback in `wait_first` per
    # record, and the consumer has every attribute the replacement reads.
    source = inspect.getsource(driver.Consumer._drain_messages)
    assert "await self.wait_first(" in source
    assert "callback(message), self.suspend_flow.wait()" in source
    consumer = runtime.app.consumer
    assert type(consumer)._drain_messages is not driver.Consumer._drain_messages
    for name in ("callback", "_read_offset", "_commit_every", "_n_acked", "suspend_flow", "diag"):
        assert hasattr(consumer, name), name
    for name in ("_add_gap", "commit", "getmany", "wait_first"):
        assert inspect.iscoroutinefunction(getattr(consumer, name)) or inspect.isasyncgenfunction(
            getattr(consumer, name)
        ), name
    assert isinstance(consumer.consumer_stopped_errors, tuple)
    assert consumer.unacked is consumer._unacked_messages
    assert hasattr(runtime.app, "consumer_generation_id")  # each record carries the one it came in
    assert callable(runtime.app.flow_control.is_active)


def test_the_consumer_thread_seeks_to_the_beginning_of_partitions() -> None:
    seek = driver.AIOKafkaConsumerThread.seek_to_beginning
    assert inspect.iscoroutinefunction(seek)
    assert _positional(seek) == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("partitions", inspect.Parameter.VAR_POSITIONAL),
    ]
    assert _positional(aiokafka.AIOKafkaConsumer.seek_to_beginning) == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("partitions", inspect.Parameter.VAR_POSITIONAL),
    ]


def test_the_seek_after_an_assignment_records_the_committed_offsets_and_rewinds(
    runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer = runtime.app.consumer
    samples = NVML_SAMPLES.full_name(Settings().kafka.topic_prefix)
    committed = {TP(samples, 0): 42, TP(samples, 1): 0, TP("elsewhere", 0): 0}
    rewound: list[tuple[TP, ...]] = []

    async def seek_to_committed() -> dict[TP, int]:
        return committed

    async def seek_to_beginning(*partitions: TP) -> None:
        rewound.append(partitions)

    monkeypatch.setattr(consumer._thread, "seek_to_committed", seek_to_committed)
    monkeypatch.setattr(consumer._thread, "seek_to_beginning", seek_to_beginning)
    assert committed_offset(consumer, samples, 0) is None  # before any seek
    asyncio.run(consumer.perform_seek())  # what Faust runs after each assignment
    assert committed_offset(consumer, samples, 0) == 42
    assert committed_offset(consumer, samples, 1) is None  # committed at 0: none
    assert committed_offset(consumer, samples, 2) is None  # not assigned
    assert rewound == [(TP(samples, 1),)]  # an input without a commit; not other topics


def test_a_worker_installs_the_wrapped_stop_handlers(runtime: WorkerRuntime) -> None:
    originals: dict[str, Callable[[], None]] = {}

    def wrap(handler: Callable[[], None]) -> Callable[[], None]:
        def on_signal() -> None:
            pass

        originals[handler.__name__] = handler
        return on_signal

    class Loop:
        def __init__(self) -> None:
            self.handlers: dict[int, Callable[[], None]] = {}

        def add_signal_handler(self, signum: int, handler: Callable[[], None]) -> None:
            self.handlers[signum] = handler

    worker = new_worker(runtime.app, "WARNING", wrap_stop=wrap)
    assert sorted(originals) == ["_on_sigint", "_on_sigterm"]
    loop = Loop()
    worker.loop = loop
    worker.install_signal_handlers()  # what mode's worker does as it starts
    assert loop.handlers[signal.SIGTERM] is worker._on_sigterm
    assert loop.handlers[signal.SIGINT] is worker._on_sigint
    assert loop.handlers[signal.SIGTERM] is not originals["_on_sigterm"]
    assert loop.handlers[signal.SIGTERM].__qualname__.startswith("test_a_worker_installs")
    assert worker.spinner is None


def test_the_c_batch_builder_compresses_lz4_in_fast_mode_and_the_batch_reads_back() -> None:
    from aiokafka.record._crecords import default_records as c_records
    from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

    calls: list[int] = []
    fast = c_records.lz4_encode

    def counted(data: Any, **kwargs: Any) -> bytes:
        calls.append(len(data))
        return fast(data, **kwargs)  # type: ignore[no-any-return]

    internals.use_fast_lz4()
    assert c_records.lz4_encode.keywords == {"level": internals.LZ4_LEVEL}  # type: ignore[attr-defined]
    c_records.lz4_encode = counted
    try:
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=DefaultRecordBatch.CODEC_LZ4, is_transactional=False,
            producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
        )  # fmt: skip
        values = [b'{"schema":"gpuwatch.pod.usage/v1","n":%d}' % i * 20 for i in range(50)]
        for offset, value in enumerate(values):
            builder.append(offset, timestamp=None, key=b"k", value=value, headers=[])
        batch = DefaultRecordBatch(bytes(builder.build()))
    finally:
        internals.use_fast_lz4()
    assert len(calls) == 1
    assert [record.value for record in batch] == values


class _Acked:
    """A record as Faust's `Consumer.ack` reads it."""

    def __init__(self, tp: TP, offset: int) -> None:
        self.tp, self.offset, self.topic, self.acked = tp, offset, tp.topic, False


def _ack(consumer: Any, tp: TP, offsets: range) -> None:
    for offset in offsets:
        consumer.ack(_Acked(tp, offset))


@pytest.fixture
def acking(runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The runtime's consumer, acknowledgements counted for every topic (as once started:
    Faust's conductor learns the agents' topics when the app starts)."""
    monkeypatch.setattr(runtime.app.topics, "acks_enabled_for", lambda topic: True)
    return runtime.app.consumer


def test_a_gap_read_again_commits_at_once_not_one_offset_per_commit(acking: Any) -> None:
    # The fetch loop jumps from 104 to 300 (Faust records 105..299 as a gap); the agent
    # loop acknowledges 300..399 (events after its gap, skipped), seeks back to 105, and
    # reads 105..399 again. Faust's list then holds 105..299 twice (the gap, then the
    # records), and its `_new_offset` moved one run per commit: 196 commits to pass them.
    assert _positional(driver.Consumer._new_offset) == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("tp", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ]
    for name in ("_acked", "_acked_index", "_gap", "_committed_offset"):
        assert f"self.{name}[tp]" in inspect.getsource(driver.Consumer._new_offset), name
    consumer = acking
    tp = TP(NVML_SAMPLES.full_name(Settings().kafka.topic_prefix), 3)
    consumer._committed_offset[tp] = 100
    _ack(consumer, tp, range(100, 105))
    asyncio.run(consumer._add_gap(tp, 105, 299))
    _ack(consumer, tp, range(300, 400))
    _ack(consumer, tp, range(105, 300))  # read again after the seek back
    assert len(consumer._acked[tp]) == 300
    assert consumer._filter_committable_offsets([tp]) == {tp: 400}
    assert consumer._acked[tp] == []
    assert consumer._acked_index[tp] == set()


def test_committable_offsets_are_faust_s_where_nothing_is_acknowledged_twice(
    acking: Any,
) -> None:
    # Faust's rules otherwise: the first run of consecutive offsets, gaps below the highest
    # acknowledged offset counted, nothing while the first offset is two past the commit,
    # Faust's allowance of one missing offset (105 here) kept.
    consumer = acking
    tp = TP(NVML_SAMPLES.full_name(Settings().kafka.topic_prefix), 4)
    consumer._committed_offset[tp] = 100
    _ack(consumer, tp, range(102, 110))
    assert consumer._filter_committable_offsets([tp]) == {}  # 100 and 101 missing
    _ack(consumer, tp, range(101, 102))
    assert consumer._filter_committable_offsets([tp]) == {tp: 110}  # one missing: Faust's
    consumer._committed_offset[tp] = 110
    _ack(consumer, tp, range(110, 115))
    _ack(consumer, tp, range(120, 125))
    assert consumer._filter_committable_offsets([tp]) == {tp: 115}
    consumer._committed_offset[tp] = 115
    asyncio.run(consumer._add_gap(tp, 115, 119))
    assert consumer._filter_committable_offsets([tp]) == {tp: 125}
    assert consumer._acked[tp] == []
