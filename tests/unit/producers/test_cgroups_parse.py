"""parse_cgroup: every runtime x cgroup version x driver layout, and paths of no pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.base.ports import PodRef
from producers.cgroups import parse_cgroup, parse_start_time
from schemas.ids import PodUid

FIXTURES = Path(__file__).parent / "fixtures" / "cgroups"

UID_A, CID_A = (
    "e4463bdb-7c34-4610-b59e-353c64d0815f",
    "151aef14a7a14f332fae72395fdbd62c8a1a8b3af22f9b3415c264af6fc1f52b",
)
UID_B, CID_B = (
    "0d36d15b-2cd3-4bc5-973f-fd40a34cf374",
    "88a271b5c3a01cee1aa6c537d3337a1ad70f40f41232832eb6dbdb03817a28cf",
)
UID_C, CID_C = (
    "619cdfa5-92e8-4b91-b042-190fc189ccc7",
    "ae364cda7c6af9ed673b7433d615f27ae47ef023b7ebc14ee050a8621b958428",
)
UID_D, CID_D = (
    "5c453a13-3c11-40ce-9e92-2b118c1c8e54",
    "9061b0470bdfd1bd4bd064ed4a5f870e15db0874710228f8bd3c398313a295fa",
)
KIND_NODE = "491d85cf0000000082ba69695d527ad5fb2434f7412f758d4e1c9865a29218fc"
STATIC_UID = "b4397a3e9118c0bce668585344e94e7d"  # a static pod's uid is its config hash


def esc(uid: str) -> str:
    """The uid as the systemd driver writes it in a slice name."""
    return uid.replace("-", "_")


def ref(uid: str, cid: str | None) -> PodRef:
    """The expected result."""
    return PodRef(pod_uid=PodUid(uid), container_id=cid)


# fmt: off
CASES: list[tuple[str, str, PodRef | None]] = [
    # cgroup v2, systemd driver
    ("v2-systemd-containerd-burstable",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{esc(UID_A)}.slice"
     f"/cri-containerd-{CID_A}.scope", ref(UID_A, CID_A)),
    ("v2-systemd-containerd-besteffort",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{esc(UID_B)}.slice"
     f"/cri-containerd-{CID_B}.scope", ref(UID_B, CID_B)),
    ("v2-systemd-containerd-guaranteed",
     f"0::/kubepods.slice/kubepods-pod{esc(UID_C)}.slice/cri-containerd-{CID_C}.scope",
     ref(UID_C, CID_C)),
    ("v2-systemd-crio-burstable",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{esc(UID_D)}.slice"
     f"/crio-{CID_D}.scope", ref(UID_D, CID_D)),
    ("v2-systemd-crio-crun-nested-container-cgroup",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{esc(UID_D)}.slice"
     f"/crio-{CID_D}.scope/container", ref(UID_D, CID_D)),
    ("v2-systemd-crio-conmon-is-no-container",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{esc(UID_D)}.slice"
     f"/crio-conmon-{CID_D}.scope", ref(UID_D, None)),
    ("v2-systemd-cri-dockerd",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{esc(UID_A)}.slice"
     f"/docker-{CID_A}.scope", ref(UID_A, CID_A)),
    ("v2-systemd-static-pod",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice"
     f"/cri-containerd-{CID_B}.scope", ref(STATIC_UID, CID_B)),
    ("v2-systemd-pod-level-only",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{esc(UID_B)}.slice",
     ref(UID_B, None)),
    # cgroup v2, cgroupfs driver
    ("v2-cgroupfs-containerd-burstable",
     f"0::/kubepods/burstable/pod{UID_A}/{CID_A}", ref(UID_A, CID_A)),
    ("v2-cgroupfs-containerd-guaranteed",
     f"0::/kubepods/pod{UID_C}/{CID_C}", ref(UID_C, CID_C)),
    ("v2-cgroupfs-crio-guaranteed",
     f"0::/kubepods/pod{UID_D}/crio-{CID_D}", ref(UID_D, CID_D)),
    ("v2-cgroupfs-static-pod",
     f"0::/kubepods/burstable/pod{STATIC_UID}/{CID_B}", ref(STATIC_UID, CID_B)),
    # kind / custom --cgroup-root
    ("kind-systemd-besteffort",
     f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
     f"/kubelet-kubepods-besteffort-pod{esc(UID_B)}.slice/cri-containerd-{CID_B}.scope",
     ref(UID_B, CID_B)),
    ("kind-systemd-guaranteed",
     f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{esc(UID_C)}.slice"
     f"/cri-containerd-{CID_C}.scope", ref(UID_C, CID_C)),
    ("kind-node-is-itself-a-docker-container",
     f"0::/system.slice/docker-{KIND_NODE}.scope/kubelet.slice/kubelet-kubepods.slice"
     f"/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{esc(UID_A)}.slice"
     f"/cri-containerd-{CID_A}.scope", ref(UID_A, CID_A)),
    ("kind-cgroupfs",
     f"0::/kubelet/kubepods/burstable/pod{UID_D}/{CID_D}", ref(UID_D, CID_D)),
    # an agent in its own cgroup namespace sees other pods relative to its own cgroup
    ("v2-private-cgroupns-relative-path",
     f"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{esc(UID_B)}.slice"
     f"/cri-containerd-{CID_B}.scope", ref(UID_B, CID_B)),
    # no pod
    ("v2-nested-cgroupns-root", "0::/", None),
    ("k3s-containerd-non-k8s", f"0::/k8s.io/{CID_A}", None),
    ("plain-docker-container", f"0::/system.slice/docker-{CID_A}.scope", None),
    ("podman-container", f"0::/machine.slice/libpod-{CID_C}.scope/container", None),
    ("user-session", "0::/user.slice/user-1000.slice/session-3.scope", None),
    ("pod-like-dir-outside-kubepods", f"0::/system.slice/pod{UID_A}/{CID_A}", None),
    ("kubepods-qos-level-only", "0::/kubepods.slice/kubepods-burstable.slice", None),
    ("empty", "", None),
    ("garbage", "not a cgroup file\n\n", None),
]
# fmt: on


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_cgroup_single_line(text: str, expected: PodRef | None) -> None:
    assert parse_cgroup(text) == expected
    assert parse_cgroup(text + "\n") == expected


FILE_CASES = [
    ("v1-cgroupfs-docker-burstable.txt", ref(UID_A, CID_A)),
    ("v1-systemd-containerd-guaranteed.txt", ref(UID_B, CID_B)),
    ("hybrid-systemd-crio-besteffort.txt", ref(UID_C, CID_C)),
    ("hybrid-systemd-crio-conmon.txt", ref(UID_C, None)),
    ("v1-host-kubelet-service.txt", None),
]


@pytest.mark.parametrize(("name", "expected"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_parse_cgroup_whole_files(name: str, expected: PodRef | None) -> None:
    assert parse_cgroup((FIXTURES / name).read_text()) == expected


def test_a_line_naming_the_container_wins_over_a_pod_level_line() -> None:
    # rdma left at the pod level, listed before the hierarchies holding the container
    text = (
        f"12:rdma:/kubepods.slice/kubepods-pod{esc(UID_B)}.slice\n"
        f"11:memory:/kubepods.slice/kubepods-pod{esc(UID_B)}.slice/cri-containerd-{CID_B}.scope\n"
    )
    assert parse_cgroup(text) == ref(UID_B, CID_B)


def test_pod_uid_comes_back_dashed_and_container_unnamed() -> None:
    result = parse_cgroup(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{esc(UID_A)}.slice"
        f"/cri-containerd-{CID_A}.scope"
    )
    assert result is not None
    assert result.pod_uid == UID_A
    assert "_" not in result.pod_uid
    assert result.container is None


def test_short_or_uppercase_ids_are_not_containers() -> None:
    text = f"0::/kubepods/burstable/pod{UID_A}/{CID_A[:12]}"
    assert parse_cgroup(text) == ref(UID_A, None)
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID_A}/{CID_A.upper()}") == ref(UID_A, None)


@pytest.mark.parametrize(
    ("stat", "start"),
    [
        (
            "15588 (python3) R 15567 15567 10463 0 -1 4194304 98 0 0 0 0 0 0 0 20 0 1 0 113610 "
            "3133440 361 18446744073709551615 94166261694464",
            113610,
        ),
        (
            "77 (pt_main (thread) 1) S 1 77 77 0 -1 4194560 5120 0 3 0 410 92 0 0 20 0 48 0 "
            "31337 9000000 12000",
            31337,
        ),
    ],
    ids=["plain", "comm-with-spaces-and-parens"],
)
def test_parse_start_time_counts_fields_after_the_command(stat: str, start: int) -> None:
    assert parse_start_time(stat) == start


def test_parse_start_time_of_this_process() -> None:
    stat = Path("/proc/self/stat").read_text()
    assert parse_start_time(stat) > 0
