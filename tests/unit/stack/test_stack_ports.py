"""Port-in-use detection and the errors of a port held by someone else."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port

from gpuwatch.config import load_settings
from gpuwatch.stack import manager
from gpuwatch.stack.ports import (
    describe_port_holder,
    parse_listening_inodes,
    port_holder,
    port_in_use,
)
from gpuwatch.stack.service import Daemon, StackError, StackPaths


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


def test_parse_listening_inodes_keeps_listeners_of_the_port() -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
        "  timeout inode\n"
        "   0: 0100007F:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
        "        0 1111 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:2384 0100007F:D1C2 01 00000000:00000000 00:00000000 00000000     0"
        "        0 2222 1 0000000000000000 20 4 30 10 -1\n"
        "   2: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
        "        0 3333 1 0000000000000000 100 0 0 10 0\n"
    )
    assert parse_listening_inodes(table, 0x2384) == {1111}  # 9092; the established one is not
    assert parse_listening_inodes(table, 6379) == {3333}
    assert parse_listening_inodes(table, 1) == set()


def _daemon(tmp_path: Path, port: int, answers: bool) -> Daemon:
    def fail_prepare(_: object) -> list[str]:
        raise AssertionError("must not prepare a service whose port is taken")

    return Daemon(
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


def test_taken_controller_port_is_named(tmp_path: Path, listener: int) -> None:
    settings = load_settings(
        env={},
        overrides={
            "stack.state_dir": tmp_path / "state",
            "stack.cache_dir": tmp_path / "cache",
            "stack.kafka_port": free_port(),
            "stack.kafka_controller_port": listener,
            "stack.redis_port": free_port(),
            "stack.prometheus_port": free_port(),
        },
    )
    with pytest.raises(StackError) as caught:
        manager.up(settings)
    assert f"cannot start kafka: port {listener} on 127.0.0.1" in str(caught.value)
    assert "GPUWATCH_STACK_KAFKA_CONTROLLER_PORT" in str(caught.value)
    assert not list((tmp_path / "state" / "run").glob("*.pid"))
