"""CgroupPodResolver over a fake /proc: vanished and unreadable PIDs, the cache and PID reuse."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from producers.base.ports import PodRef
from producers.cgroups import CgroupPodResolver, parse_cgroup
from schemas.ids import PodUid

UID_A, CID_A = (
    "873ea042-51bd-4a9c-9d49-f0289bee0614",
    "f57c65f1bd95306ef034dc8bbe9167fee9685fc45ea615ad27029f861f643d10",
)
UID_B, CID_B = (
    "0c53694f-973a-4105-b847-12cbddfbd679",
    "0d55adb12c14a762600a281e8a55ac3783ff8217a757e8a6ee3105f1a089c2ca",
)


def systemd_line(uid: str, cid: str) -> str:
    """A cgroup v2 line of a burstable containerd pod under the systemd driver."""
    slice_uid = uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice"
        f"/cri-containerd-{cid}.scope\n"
    )


def write_process(proc: Path, pid: int, start: int, cgroup: str, comm: str = "python3") -> None:
    """Lay out /proc/<pid>/stat and /proc/<pid>/cgroup as the kernel shows them."""
    directory = proc / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stat").write_text(
        f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 5120 0 3 0 410 92 0 0 20 0 48 0 "
        f"{start} 9000000 12000 18446744073709551615\n"
    )
    (directory / "cgroup").write_text(cgroup)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """An empty fake /proc."""
    return tmp_path / "proc"


def test_resolves_a_pod_process(proc: Path) -> None:
    write_process(proc, 4242, 1000, systemd_line(UID_A, CID_A), comm="pt_main (thread)")
    resolver = CgroupPodResolver(proc)
    assert resolver.resolve(4242) == PodRef(PodUid(UID_A), CID_A)


def test_host_process_has_no_pod(proc: Path) -> None:
    write_process(proc, 1, 1, "0::/init.scope\n")
    assert CgroupPodResolver(proc).resolve(1) is None


def test_vanished_pid_gives_none_and_a_debug_line(
    proc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="producers.cgroups")
    assert CgroupPodResolver(proc).resolve(31337) is None
    assert "pid=31337" in caplog.text
    assert all(r.levelno == logging.DEBUG for r in caplog.records)


def test_pid_that_exits_between_the_two_reads_gives_none(proc: Path) -> None:
    write_process(proc, 77, 500, systemd_line(UID_A, CID_A))
    (proc / "77" / "cgroup").unlink()
    assert CgroupPodResolver(proc).resolve(77) is None


@pytest.mark.parametrize("error", [PermissionError, ProcessLookupError])
def test_unreadable_cgroup_gives_none(
    proc: Path, monkeypatch: pytest.MonkeyPatch, error: type[OSError]
) -> None:
    # Tests run as root, where file modes do not deny reads: fail the read itself,
    # as hidepid=2 (EACCES) or a process reaped mid-read (ESRCH) do.
    write_process(proc, 88, 600, systemd_line(UID_A, CID_A))
    original = Path.read_text

    def failing_read(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "cgroup":
            raise error("denied")
        return original(self)

    monkeypatch.setattr(Path, "read_text", failing_read)
    assert CgroupPodResolver(proc).resolve(88) is None


def test_malformed_stat_gives_none(proc: Path) -> None:
    write_process(proc, 99, 1, systemd_line(UID_A, CID_A))
    (proc / "99" / "stat").write_text("99 (truncated")
    assert CgroupPodResolver(proc).resolve(99) is None


def test_cache_skips_rereading_the_cgroup_of_the_same_process(proc: Path) -> None:
    write_process(proc, 4242, 1000, systemd_line(UID_A, CID_A))
    resolver = CgroupPodResolver(proc)
    assert resolver.resolve(4242) == PodRef(PodUid(UID_A), CID_A)
    # Were the file read again, the answer would change: it is not.
    (proc / "4242" / "cgroup").write_text(systemd_line(UID_B, CID_B))
    assert resolver.resolve(4242) == PodRef(PodUid(UID_A), CID_A)


def test_reused_pid_is_resolved_again(proc: Path) -> None:
    write_process(proc, 4242, 1000, systemd_line(UID_A, CID_A))
    resolver = CgroupPodResolver(proc)
    assert resolver.resolve(4242) == PodRef(PodUid(UID_A), CID_A)
    write_process(proc, 4242, 2000, systemd_line(UID_B, CID_B))  # same PID, a new process
    assert resolver.resolve(4242) == PodRef(PodUid(UID_B), CID_B)


def test_no_pod_answers_are_cached_too(proc: Path) -> None:
    write_process(proc, 5, 10, "0::/system.slice/sshd.service\n")
    resolver = CgroupPodResolver(proc)
    assert resolver.resolve(5) is None
    (proc / "5" / "cgroup").write_text(systemd_line(UID_A, CID_A))
    assert resolver.resolve(5) is None


def test_failures_are_not_cached(proc: Path) -> None:
    resolver = CgroupPodResolver(proc)
    assert resolver.resolve(4242) is None
    write_process(proc, 4242, 1000, systemd_line(UID_A, CID_A))
    assert resolver.resolve(4242) == PodRef(PodUid(UID_A), CID_A)


def test_cache_is_bounded_and_evicts_the_least_recently_used(proc: Path) -> None:
    for pid in (1, 2, 3):
        write_process(proc, pid, pid, systemd_line(UID_A, CID_A))
    resolver = CgroupPodResolver(proc, cache_size=2)
    resolver.resolve(1)
    resolver.resolve(2)
    resolver.resolve(1)  # 1 is now the most recent
    resolver.resolve(3)  # evicts 2
    for pid in (1, 2, 3):
        (proc / str(pid) / "cgroup").write_text(systemd_line(UID_B, CID_B))
    assert resolver.resolve(1) == PodRef(PodUid(UID_A), CID_A)
    assert resolver.resolve(3) == PodRef(PodUid(UID_A), CID_A)
    assert resolver.resolve(2) == PodRef(PodUid(UID_B), CID_B)


def test_real_proc_of_this_process_agrees_with_the_parser() -> None:
    expected = parse_cgroup(Path(f"/proc/{os.getpid()}/cgroup").read_text())
    assert CgroupPodResolver().resolve(os.getpid()) == expected
