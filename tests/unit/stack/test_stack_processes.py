"""Pid files, recognising our daemons, spawning and stopping them, binaries and log tails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import holds_within, wait_until

from gpuwatch.config import load_settings
from gpuwatch.harness.stack import kafka, processes
from gpuwatch.harness.stack.service import StackError, StackPaths


def _wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    return holds_within(check, timeout_s=timeout_s, interval_s=0.02)


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose $0 is a path inside tmp_path/state: one of "our" daemons."""
    state = tmp_path / "state"
    state.mkdir()
    # Python keeps its argv as given (a shell may exec `sleep` and lose the path).
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(state / "kafka" / "x.properties")]
    )
    # Until the child has exec'd, /proc/<pid>/cmdline is still the forked test's.
    marker = str(state).encode()
    wait_until(
        lambda: marker in Path(f"/proc/{child.pid}/cmdline").read_bytes(),
        timeout_s=10,
        what="the child to exec",
        interval_s=0.01,
    )
    yield child
    child.kill()
    child.wait()


def test_pid_file_round_trip(tmp_path: Path) -> None:
    pid_file = tmp_path / "run" / "kafka.pid"
    assert processes.read_pid(pid_file) is None
    processes.write_pid(pid_file, 4242)
    assert processes.read_pid(pid_file) == 4242
    assert pid_file.read_text() == "4242\n"
    processes.remove_pid(pid_file)
    assert not pid_file.exists()


@pytest.mark.parametrize("content", ["", "abc", "-5", "0", "12 34"])
def test_garbage_pid_file_reads_as_none(tmp_path: Path, content: str) -> None:
    pid_file = tmp_path / "x.pid"
    pid_file.write_text(content)
    assert processes.read_pid(pid_file) is None


def test_process_naming_the_state_dir_is_ours(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    assert processes.is_ours(sleeper.pid, (tmp_path / "state").resolve())


def test_live_process_not_naming_the_state_dir_is_not_ours(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # The test process itself is alive but knows nothing of this state dir.
    assert processes.is_running(os.getpid())
    assert not processes.is_ours(os.getpid(), (tmp_path / "state").resolve())
    # A sibling directory whose name extends ours is not ours either.
    (tmp_path / "stat").mkdir()
    assert not processes.is_ours(sleeper.pid, (tmp_path / "stat").resolve())


def test_process_working_in_the_state_dir_is_ours(tmp_path: Path) -> None:
    # redis-server rewrites its command line; it is recognised by its working directory.
    workdir = tmp_path / "state" / "redis"
    workdir.mkdir(parents=True)
    child = subprocess.Popen(["sleep", "60"], cwd=workdir)
    try:
        assert processes.is_ours(child.pid, (tmp_path / "state").resolve())
        assert not processes.is_ours(child.pid, (tmp_path / "other").resolve())
    finally:
        child.kill()
        child.wait()


def test_zombie_is_not_running(tmp_path: Path) -> None:
    child = subprocess.Popen(["sh", "-c", "exit 3", str(tmp_path)])
    stat = Path(f"/proc/{child.pid}/stat")
    assert _wait_until(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z")
    assert not processes.is_running(child.pid)
    assert not processes.is_ours(child.pid, tmp_path.resolve())
    assert child.wait() == 3


def test_stale_pid_file_is_not_owned(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    pid_file = tmp_path / "run" / "redis.pid"
    processes.write_pid(pid_file, child.pid)
    assert processes.owned_pid(pid_file, tmp_path.resolve()) is None
    processes.write_pid(pid_file, os.getpid())  # alive, but not ours
    assert processes.owned_pid(pid_file, tmp_path.resolve()) is None


def test_spawned_daemon_is_detached_and_logs_to_its_file(tmp_path: Path) -> None:
    root = (tmp_path / "state").resolve()
    log_path = root / "logs" / "redis.log"
    log_path.parent.mkdir(parents=True)
    log_path.write_text("earlier run\n")
    pid_file = root / "run" / "redis.pid"
    pid, offset = processes.spawn(
        ["sh", "-c", "echo hello; echo oops >&2; exec sleep 60"],
        cwd=root / "redis",
        log_path=log_path,
        pid_file=pid_file,
    )
    try:
        assert offset == len("earlier run\n")
        assert processes.read_pid(pid_file) == pid
        assert processes.owned_pid(pid_file, root) == pid
        assert os.getsid(pid) == pid  # a session of its own
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
        assert os.readlink(f"/proc/{pid}/fd/1") == str(log_path)
        assert os.readlink(f"/proc/{pid}/fd/2") == str(log_path)
        assert _wait_until(lambda: "oops" in log_path.read_text().splitlines())
        tail = processes.tail(log_path, offset=offset)
        assert "earlier run" not in tail
        assert tail.splitlines()[0].startswith("--- gpuwatch: ")
        assert tail.splitlines()[1:] == ["hello", "oops"]
    finally:
        outcome = processes.stop_all({pid: 5.0})
    assert outcome == {pid: "stopped"}
    assert not Path(f"/proc/{pid}").exists()
    assert processes.exit_code(pid) == -signal.SIGTERM


def test_daemon_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    pid, _ = processes.spawn(
        ["sh", "-c", "trap '' TERM; echo armed; while :; do sleep 0.1; done"],
        cwd=tmp_path,
        log_path=tmp_path / "t.log",
        pid_file=tmp_path / "t.pid",
    )
    assert _wait_until(lambda: "armed" in (tmp_path / "t.log").read_text().splitlines())
    assert processes.stop_all({pid: 0.3}) == {pid: "killed"}
    assert processes.exit_code(pid) == -signal.SIGKILL


def test_daemon_that_exits_reports_its_code(tmp_path: Path) -> None:
    pid, _ = processes.spawn(
        ["sh", "-c", "exit 7"], cwd=tmp_path, log_path=tmp_path / "x.log", pid_file=tmp_path / "p"
    )
    assert _wait_until(lambda: not processes.is_running(pid))
    assert processes.exit_code(pid) == 7


def test_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    log_path = tmp_path / "a.log"
    log_path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert processes.tail(log_path, lines=3) == "line 97\nline 98\nline 99"
    assert len(processes.tail(log_path).splitlines()) == processes.TAIL_LINES
    assert processes.tail(tmp_path / "missing.log") == ""


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_402"', 8),
        ('openjdk version "11.0.22" 2024-01-16', 11),
        ("bash: java: command not found", None),
    ],
)
def test_java_major_version(output: str, major: int | None) -> None:
    assert processes.parse_java_major(output) == major


def test_missing_binary_says_run_make_install() -> None:
    with pytest.raises(StackError) as caught:
        processes.require_binary("redis-server", which=lambda _: None)
    assert "`redis-server` is not installed or not on PATH" in str(caught.value)
    assert "make install" in str(caught.value)


def _fake_java(tmp_path: Path, version: str) -> str:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir(exist_ok=True)
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-16' >&2\n")
    java.chmod(0o755)
    return str(java)


def test_old_java_is_refused(tmp_path: Path) -> None:
    java = _fake_java(tmp_path, "11.0.22")
    with pytest.raises(StackError) as caught:
        processes.require_java(17, which=lambda name: java if name == "java" else None)
    assert "Kafka needs Java 17 or newer" in str(caught.value)
    assert "11.0.22" in str(caught.value)
    assert "make install" in str(caught.value)


def test_kafka_needs_maven_only_until_jars_are_fetched(tmp_path: Path) -> None:
    java = _fake_java(tmp_path, "17.0.15")
    settings = load_settings(env={}, overrides={"stack.cache_dir": tmp_path / "cache"})
    service = kafka.KafkaService(
        settings,
        StackPaths.of(tmp_path / "state"),
        which=lambda name: java if name == "java" else None,
    )
    with pytest.raises(StackError, match="`mvn` is not installed"):
        service.check()
    lib = kafka.jar_dir(settings)
    lib.mkdir(parents=True)
    (lib / f"kafka_2.13-{settings.stack.kafka_version}.jar").write_bytes(b"")
    service.check()  # jars are there: no Maven needed
    assert service.java == java
