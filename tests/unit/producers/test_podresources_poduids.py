"""Pod uids from the kubelet's /var/log/pods directory names."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from producers.podresources.poduids import PodLogUids, parse_log_dir_name

UID_1 = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b"
UID_2 = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
STATIC = "b4397a3e9118c0bce668585344e94e7d"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"ml_train-0_{UID_1}", ("ml", "train-0", UID_1)),
        (f"kube-system_etcd-node-1_{STATIC}", ("kube-system", "etcd-node-1", STATIC)),
        (
            f"gpu-operator_nvidia-dcgm-exporter-x7k2p_{UID_2}",
            ("gpu-operator", "nvidia-dcgm-exporter-x7k2p", UID_2),
        ),
        (UID_1, None),  # the pre-1.14 layout: uid only
        ("ml_train-0", None),
        (f"ml__{UID_1}", None),
        ("a_b_c_d", None),
    ],
)
def test_parse_log_dir_name(name: str, expected: tuple[str, str, str] | None) -> None:
    assert parse_log_dir_name(name) == expected


def test_lookup_after_refresh(tmp_path: Path) -> None:
    (tmp_path / f"ml_train-0_{UID_1}" / "trainer").mkdir(parents=True)
    (tmp_path / f"team-a_infer-0_{UID_2}").mkdir()
    (tmp_path / "stray-file.txt").write_text("x")
    uids = PodLogUids(tmp_path)
    assert uids.lookup("ml", "train-0") is None  # nothing read before the first refresh
    uids.refresh()
    assert uids.lookup("ml", "train-0") == UID_1
    assert uids.lookup("team-a", "infer-0") == UID_2
    assert uids.lookup("ml", "infer-0") is None


def test_refresh_forgets_deleted_pods(tmp_path: Path) -> None:
    pod_dir = tmp_path / f"ml_train-0_{UID_1}"
    pod_dir.mkdir()
    uids = PodLogUids(tmp_path)
    uids.refresh()
    pod_dir.rmdir()
    uids.refresh()
    assert uids.lookup("ml", "train-0") is None


def test_recreated_pod_of_the_same_name_resolves_to_the_newest(tmp_path: Path) -> None:
    old, new = tmp_path / f"ml_db-0_{UID_2}", tmp_path / f"ml_db-0_{UID_1}"
    old.mkdir()
    new.mkdir()
    os.utime(old, (1_700_000_000, 1_700_000_000))
    os.utime(new, (1_700_000_600, 1_700_000_600))
    uids = PodLogUids(tmp_path)
    uids.refresh()
    assert uids.lookup("ml", "db-0") == UID_1


def test_missing_root_warns_once_and_knows_no_pod(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="producers.podresources.poduids")
    uids = PodLogUids(tmp_path / "not-mounted")
    for _ in range(3):
        uids.refresh()
    assert uids.lookup("ml", "train-0") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "not-mounted" in warnings[0].getMessage()
