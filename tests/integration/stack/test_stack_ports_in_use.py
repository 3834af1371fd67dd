"""Port-in-use detection, the errors of a port held by someone else, and `stack up` refusing
to start on a taken port or without its binaries: real sockets on loopback."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port
from support.daemons import FakeDaemon

from gpuwatch.config import load_settings
from gpuwatch.harness.stack import manager
from gpuwatch.harness.stack.ports import describe_port_holder, port_holder, port_in_use
from gpuwatch.harness.stack.service import StackError, StackPaths
from schemas.settings import Settings


@pytest.fixture
def listener() -> Iterator[int]:
    """A real socket listening on a free loopback port that never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_listening_port_is_in_use(listener: int) -> None:
    assert port_in_use("127.0.0.1", listener)


def test_free_port_is_not_in_use() -> None:
    assert not port_in_use("127.0.0.1", free_port())


def test_holder_of_our_listener_is_this_process(listener: int) -> None:
    holder = port_holder(listener)
    assert holder is not None
    assert holder.pid == os.getpid()
    assert "python" in holder.command or "pytest" in holder.command


def test_description_names_port_and_pid(listener: int) -> None:
    text = describe_port_holder("127.0.0.1", listener)
    assert f"port {listener} on 127.0.0.1" in text
    assert f"pid {os.getpid()}" in text
    assert "not started by gpuwatch" in text


def _daemon(tmp_path: Path, port: int, answers: bool) -> FakeDaemon:
    def fail_prepare(_: object) -> list[str]:
        raise AssertionError("must not prepare a service whose port is taken")

    return FakeDaemon(
        name="redis",
        port=port,
        check=lambda: None,
        prepare=fail_prepare,
        probe=lambda: answers,
        workdir=tmp_path,
    )


def test_port_taken_by_a_non_answering_process_is_an_error(tmp_path: Path, listener: int) -> None:
    with pytest.raises(StackError) as caught:
        manager._assess(_daemon(tmp_path, listener, answers=False), StackPaths.of(tmp_path))
    message = str(caught.value)
    assert f"port {listener} on 127.0.0.1 is in use by pid {os.getpid()}" in message
    assert "does not answer as redis" in message
    assert "GPUWATCH_STACK_REDIS_PORT" in message


def test_port_taken_by_an_answering_service_is_external(tmp_path: Path, listener: int) -> None:
    found = manager._assess(_daemon(tmp_path, listener, answers=True), StackPaths.of(tmp_path))
    assert found.kind == "external"
    assert found.pid is None


def test_free_port_is_to_be_started(tmp_path: Path) -> None:
    found = manager._assess(_daemon(tmp_path, free_port(), answers=False), StackPaths.of(tmp_path))
    assert found.kind == "free"


def stack_settings(tmp_path: Path, kafka_controller_port: int) -> Settings:
    """Settings of a stack of its own in `tmp_path`, on free ports but the controller's."""
    return load_settings(
        env={},
        overrides={
            "stack.state_dir": tmp_path / "state",
            "stack.cache_dir": tmp_path / "cache",
            "stack.kafka_port": free_port(),
            "stack.kafka_controller_port": kafka_controller_port,
            "stack.redis_port": free_port(),
            "stack.prometheus_port": free_port(),
        },
    )


def test_taken_controller_port_is_named(tmp_path: Path, listener: int) -> None:
    settings = stack_settings(tmp_path, kafka_controller_port=listener)
    with pytest.raises(StackError) as caught:
        manager.up(settings)
    assert f"cannot start kafka: port {listener} on 127.0.0.1" in str(caught.value)
    assert "GPUWATCH_STACK_KAFKA_CONTROLLER_PORT" in str(caught.value)
    assert not list((tmp_path / "state" / "run").glob("*.pid"))


def test_up_without_binaries_starts_nothing(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path, kafka_controller_port=free_port())
    with pytest.raises(StackError) as caught:
        manager.up(settings, which=lambda _: None)
    assert "`java` is not installed or not on PATH; run `make install`" in str(caught.value)
    assert not list((tmp_path / "state").rglob("*.pid"))
