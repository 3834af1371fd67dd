"""What `stack up` says when a service dies, never answers, or Maven cannot fetch Kafka."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.daemons import FakeDaemon

from gpuwatch.config import load_settings
from gpuwatch.harness.stack import kafka, manager, processes
from gpuwatch.harness.stack.service import StackError, StackPaths


def _daemon(tmp_path: Path, answers: bool) -> FakeDaemon:
    return FakeDaemon(
        name="prometheus",
        port=1,
        check=lambda: None,
        prepare=lambda _: [],
        probe=lambda: answers,
        workdir=tmp_path,
        stop_timeout_s=2.0,
    )


def _start(paths: StackPaths, script: str) -> manager._Waiting:
    pid, offset = processes.spawn(
        ["sh", "-c", script],
        cwd=paths.root / "prometheus",
        log_path=paths.log("prometheus"),
        pid_file=paths.pid_file("prometheus"),
    )
    return manager._Waiting(_daemon(paths.root, False), pid, offset, time.monotonic())


def test_service_that_exits_shows_its_code_and_log_tail(tmp_path: Path) -> None:
    paths = StackPaths.of(tmp_path / "state")
    paths.log("prometheus").parent.mkdir(parents=True)
    paths.log("prometheus").write_text("an earlier run's line\n")
    waiting = _start(paths, "for i in $(seq 1 30); do echo line $i; done; echo bad config; exit 3")
    with pytest.raises(StackError) as caught:
        manager._wait_ready([waiting], paths, 10.0, lambda _: None)
    message = str(caught.value)
    assert message.startswith("prometheus exited with code 3 before it answered on 127.0.0.1:1")
    assert f"last lines of {paths.log('prometheus')}:" in message
    lines = message.splitlines()
    assert lines[-1] == "bad config"
    assert len(lines) == 1 + processes.TAIL_LINES
    assert "an earlier run's line" not in message
    assert not paths.pid_file("prometheus").exists()


def test_service_that_never_answers_is_stopped_and_reported(tmp_path: Path) -> None:
    paths = StackPaths.of(tmp_path / "state")
    waiting = _start(paths, "echo still booting; exec sleep 60")
    with pytest.raises(StackError) as caught:
        manager._wait_ready([waiting], paths, 0.5, lambda _: None)
    message = str(caught.value)
    assert (
        "prometheus did not answer on 127.0.0.1:1 within 0.5 s (stack.ready_timeout_s)" in message
    )
    assert f"stopped it (pid {waiting.pid})" in message
    assert message.splitlines()[-1] == "still booting"
    assert not processes.is_running(waiting.pid)
    assert not paths.pid_file("prometheus").exists()


def test_answering_service_is_reported_up(tmp_path: Path) -> None:
    paths = StackPaths.of(tmp_path / "state")
    waiting = _start(paths, "exec sleep 60")
    answering = manager._Waiting(_daemon(tmp_path, True), waiting.pid, 0, time.monotonic())
    said: list[str] = []
    try:
        manager._wait_ready([answering], paths, 5.0, said.append)
    finally:
        processes.stop_all({waiting.pid: 2.0})
    assert said[0] == "waiting for prometheus on 127.0.0.1:1..."
    assert said[1].startswith(f"prometheus is up on 127.0.0.1:1 (pid {waiting.pid}, ")


def test_maven_failure_shows_the_tail_of_its_output(tmp_path: Path) -> None:
    mvn = tmp_path / "bin" / "mvn"
    mvn.parent.mkdir()
    mvn.write_text(
        "#!/bin/sh\n"
        "echo '\033[0m[ERROR] Could not resolve org.apache.kafka:kafka_2.13:jar:4.1.1'\n"
        "exit 1\n"
    )
    mvn.chmod(0o755)
    settings = load_settings(env={}, overrides={"stack.cache_dir": tmp_path / "cache"})
    with pytest.raises(StackError) as caught:
        kafka.fetch_jars(settings, lambda _: None, which=lambda name: str(mvn))
    message = str(caught.value)
    assert message.startswith("Maven could not fetch the Kafka 4.1.1 jars (exit 1)")
    assert (
        message.splitlines()[-1]
        == "[ERROR] Could not resolve org.apache.kafka:kafka_2.13:jar:4.1.1"
    )
    assert not kafka.jar_dir(settings).exists()
