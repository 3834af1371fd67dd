"""Spawns, recognises and stops the stack's daemons, tracked by pid files in the state dir."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwatch.harness.stack.service import Progress, StackError, Which

log = logging.getLogger(__name__)

INSTALL_HINT = "run `make install` to install the OS packages of the local stack"
TAIL_LINES = 20  # enough to show a stack trace's head or a config error, short enough to read
_POLL_S = 0.1
_KILL_GRACE_S = 5.0  # after SIGKILL, the kernel still has to tear the process down

# Daemons spawned by this process. Keeping their Popen objects reaps one that exits
# (no zombie left while we run), tells its exit code, and stops Popen from warning
# that it forgot a running child when the object would be garbage-collected.
_children: dict[int, subprocess.Popen[bytes]] = {}


def require_binary(name: str, which: Which = shutil.which) -> str:
    """The path of an executable the stack needs, or a StackError saying how to get it."""
    path = which(name)
    if path is None:
        raise StackError(f"`{name}` is not installed or not on PATH; {INSTALL_HINT}")
    return path


def parse_java_major(version_output: str) -> int | None:
    """The major version in `java -version` output: 17 for "17.0.15", 8 for "1.8.0_402"."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        major = int(match.group(2))
    return major


def require_java(minimum: int = 17, which: Which = shutil.which) -> str:
    """The path of a Java runtime of at least `minimum`, or a StackError."""
    path = require_binary("java", which)
    try:
        done = subprocess.run(
            [path, "-version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"`{path} -version` failed ({exc}); {INSTALL_HINT}") from exc
    output = done.stderr + done.stdout
    major = parse_java_major(output)
    if major is None or major < minimum:
        first = output.strip().splitlines()[0] if output.strip() else "no version output"
        raise StackError(
            f"Kafka needs Java {minimum} or newer, but `{path}` is {first!r}; {INSTALL_HINT} "
            f"or put a Java {minimum}+ first on PATH"
        )
    return path


def read_pid(pid_file: Path) -> int | None:
    """The pid in a pid file; None when there is none or it is not a number."""
    try:
        text = pid_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def write_pid(pid_file: Path, pid: int) -> None:
    """Write a pid file atomically, so a reader never sees it half written."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = pid_file.with_name(pid_file.name + ".tmp")
    tmp.write_text(f"{pid}\n", encoding="ascii")
    tmp.replace(pid_file)


def remove_pid(pid_file: Path) -> None:
    """Remove a pid file if it is there."""
    pid_file.unlink(missing_ok=True)


def is_running(pid: int, proc: Path = Path("/proc")) -> bool:
    """True while `pid` is a live process; one that exited (a zombie) is not running."""
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None  # our own child: waitpid knows, and reaps it
    try:
        status = (proc / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    state = fields.get("State", "").strip()[:1]
    threads = int(fields.get("Threads", "1").strip() or "1")
    # A multithreaded process whose first thread ended (the JVM during shutdown) shows
    # "Z" while its other threads still run: only a lone zombie thread has exited.
    return state not in ("Z", "X") or threads > 1


def cmdline(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """The arguments of a process; empty when it is gone or not ours to read."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_ours(pid: int, root: Path, proc: Path = Path("/proc")) -> bool:
    """True when `pid` is alive and one of our daemons: it names the state dir `root`.

    A pid file can outlive its process and the pid be reused by anything, so a pid
    counts only if its command line mentions the state directory, or its working
    directory lies inside it (Redis rewrites its command line to "redis-server
    host:port", but runs in <state>/redis).
    """
    if not is_running(pid, proc):
        return False
    prefix = str(root)
    for arg in cmdline(pid, proc):
        if prefix + os.sep in arg or arg == prefix or arg.endswith("=" + prefix):
            return True
    try:
        cwd = Path(os.readlink(proc / str(pid) / "cwd"))
    except OSError:
        return False
    return cwd == root or cwd.is_relative_to(root)


def owned_pid(pid_file: Path, root: Path) -> int | None:
    """The pid in `pid_file` if it is a live daemon of ours, else None."""
    pid = read_pid(pid_file)
    if pid is None or not is_ours(pid, root):
        return None
    return pid


def spawn(argv: list[str], *, cwd: Path, log_path: Path, pid_file: Path) -> tuple[int, int]:
    """Start a daemon that outlives us; returns its pid and where its output starts in the log.

    It gets a session of its own (a Ctrl-C in our terminal does not reach it), reads
    /dev/null and writes to its log file, never to our stdout: whoever waits for our
    output to end (a CI step, a pipe) must not wait for the daemon too.
    """
    cwd.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    header = f"--- gpuwatch: {stamp} starting: {' '.join(argv)}\n"
    with _logged(cwd, log_path, header) as (where, offset):
        try:
            child = subprocess.Popen(argv, **where, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise StackError(f"cannot start `{argv[0]}`: {exc}; {INSTALL_HINT}") from exc
    if not _children:
        atexit.register(_let_daemons_outlive_us)
    _children[child.pid] = child
    write_pid(pid_file, child.pid)
    log.info("spawned pid=%d argv0=%s log=%s", child.pid, argv[0], log_path)
    return child.pid, offset


def run_logged(
    argv: list[str],
    *,
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    timed_out: str,
    header: str | None = None,
) -> tuple[int, int]:
    """Run a one-off command to its end; returns its exit code and where its output starts.

    Its output goes to `log_path`: appended after `header` when one is given, else in
    place of what the file held. Running past `timeout_s` is a StackError saying
    `timed_out`.
    """
    with _logged(cwd, log_path, header) as (where, offset):
        try:
            done = subprocess.run(argv, **where, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise StackError(timed_out) from exc
    return done.returncode, offset


def exit_code(pid: int) -> int | None:
    """The exit code of a daemon this process spawned and that has exited, else None."""
    child = _children.get(pid)
    return None if child is None else child.poll()


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to the daemon's process group (its own, since it leads its session)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop_all(timeouts: Mapping[int, float]) -> dict[int, str]:
    """SIGTERM each pid's group, SIGKILL what is still there after its timeout.

    Returns, per pid, how it ended: "stopped", "killed" or "did not exit".
    """
    outcome: dict[int, str] = {}
    start = time.monotonic()
    for pid in timeouts:
        signal_group(pid, signal.SIGTERM)
    pending = dict(timeouts)
    killed: dict[int, float] = {}
    while pending or killed:
        now = time.monotonic()
        for pid, timeout in list(pending.items()):
            if not is_running(pid):
                outcome[pid] = "stopped"
                del pending[pid]
            elif now - start >= timeout:
                log.warning("kill pid=%d reason=no exit after SIGTERM timeout_s=%.0f", pid, timeout)
                signal_group(pid, signal.SIGKILL)
                killed[pid] = now + _KILL_GRACE_S
                del pending[pid]
        for pid, deadline in list(killed.items()):
            if not is_running(pid):
                outcome[pid] = "killed"
                del killed[pid]
            elif now >= deadline:
                outcome[pid] = "did not exit"
                del killed[pid]
        if pending or killed:
            time.sleep(_POLL_S)
    return outcome


def tail(path: Path, lines: int = TAIL_LINES, offset: int = 0) -> str:
    """The last `lines` lines of a log file written at or after byte `offset`."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(offset, size - 64 * 1024)
            f.seek(start)
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def locked(lock_file: Path, progress: Progress) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file`; say so when another holder makes us wait."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another gpuwatch command holding {lock_file}...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _logged(cwd: Path, log_path: Path, header: str | None) -> Iterator[tuple[dict[str, Any], int]]:
    """Where a command runs and its output goes (subprocess's arguments), and the offset in
    the log where that output starts.

    The command reads /dev/null and writes stdout and stderr to the log. With a header the
    log is appended to, the header first; without, it is emptied.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb" if header is None else "ab") as out:
        offset = out.seek(0, os.SEEK_END)
        if header is not None:
            out.write(header.encode())
            out.flush()
        where = {
            "cwd": cwd,
            "stdin": subprocess.DEVNULL,
            "stdout": out,
            "stderr": subprocess.STDOUT,
        }
        yield where, offset


def _let_daemons_outlive_us() -> None:
    """At exit, let go of the daemons still running: they are meant to outlive us.

    Dropped here, under a filter, Popen's "subprocess is still running" warning stays
    quiet; left to interpreter teardown it would print, whatever filters were set.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _children.clear()
