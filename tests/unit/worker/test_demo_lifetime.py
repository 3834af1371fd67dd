"""Nothing the demo starts outlives it: signals, a broken output and its own death."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.commands import reaped

from gpuwatch.harness.run import demo
from gpuwatch.harness.run.demo import DemoOptions, Viewer, quiet, stop_signals_interrupt
from gpuwatch.run.lifetime import PARENT_ENV
from schemas.settings import Settings

CHILD = (
    "from gpuwatch.run.lifetime import die_with_parent\n"
    "print('armed' if die_with_parent() else 'not armed', flush=True)\n"
    "import time; time.sleep(60)\n"
)
PARENT = (
    "import os, subprocess, sys, time\n"
    f"env = {{**os.environ, {PARENT_ENV!r}: str(os.getpid())}}\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], env=env,\n"
    "                         stdout=subprocess.PIPE, text=True, start_new_session=True)\n"
    "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
    "time.sleep(60)\n"
)


def _gone(pid: int) -> bool:
    """Whether a process has ended (a zombie nobody reaped counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_child_ends_when_its_parent_is_killed_with_sigkill() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True
    )
    with reaped(parent):
        assert parent.stdout is not None
        pid_text, armed = parent.stdout.readline().split()
        child = int(pid_text)
        assert armed == "armed"
        assert not _gone(child)
        parent.kill()  # SIGKILL: no handler, no finally
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child)
        parent.stdout.close()


def test_a_child_whose_parent_is_already_gone_does_not_start() -> None:
    env = {**os.environ, PARENT_ENV: "999999999"}  # not its parent: as if the demo had died
    argv = [sys.executable, "-c", CHILD]
    done = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stdout == b""


def test_without_the_variable_nothing_is_armed() -> None:
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    done = subprocess.run(
        [sys.executable, "-c", CHILD.replace("time.sleep(60)", "pass")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "not armed")


class _Closed(io.StringIO):
    """An output whose reader has gone (the `tee` of `gpuwatch demo | tee`)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_an_output_nobody_reads_ends_the_demo_once_and_then_takes_everything() -> None:
    view = Viewer(_Closed())
    with pytest.raises(KeyboardInterrupt):
        view.write("pods: running 3\n")
    assert view.gone
    assert view.write("more\n") == 5  # the stop's own messages go nowhere, quietly
    view.flush()


def test_a_progress_message_that_cannot_be_written_is_dropped() -> None:
    def broken(message: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    quiet(broken)("stopping the stack")  # no exception


def test_sigterm_and_sighup_end_the_demo_as_ctrl_c_does() -> None:
    before = signal.getsignal(signal.SIGTERM)

    def signalled(sig: int) -> None:
        with stop_signals_interrupt():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler runs before this ends

    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt):
            signalled(sig)
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_children_are_stopped_even_when_no_message_can_be_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spawned: list[str] = []
    stopped: list[list[str]] = []

    def spawn(name: str, argv: Any, env: Any, logs: Any) -> Any:
        spawned.append(name)
        return demo.Child(name, None, tmp_path / name)  # type: ignore[arg-type]

    def broken(message: str) -> None:
        if message.startswith("stopping"):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(demo, "_spawn", spawn)
    monkeypatch.setattr(demo, "stop", lambda running: stopped.append([c.name for c in running]))
    with demo.children(Settings(), DemoOptions(), tmp_path, broken):
        pass
    assert stopped == [spawned]
    assert spawned == ["worker", "sink", "metrics", "simulate"]
