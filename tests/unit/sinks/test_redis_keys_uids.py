"""Pod uids in Redis key names: a uid can never name another pod's key."""

from __future__ import annotations

import pytest

from sinks.redis.keys import RedisKeys

UID = "6f1c8a2e-4b3d-4e5f-9a7b-1c2d3e4f5a6b"


def all_keys(keys: RedisKeys, uid: str) -> set[str]:
    return set(keys.pod_keys(uid))


def test_a_kubernetes_uid_is_its_own_key_part() -> None:
    keys = RedisKeys()
    assert keys.pod(UID) == f"gpuwatch:pod:{UID}"
    assert keys.pod_windows(UID) == f"gpuwatch:pod:{UID}:windows"
    assert keys.timeline(UID) == f"gpuwatch:timeline:{UID}"
    assert keys.timeline_seen(UID) == f"gpuwatch:timeline:{UID}:seen"


@pytest.mark.parametrize("suffix", [":windows", ":seen", "%3Awindows", ":windows:windows", ""])
def test_uids_built_on_another_uid_share_no_key_with_it(suffix: str) -> None:
    keys = RedisKeys("t:")
    other = UID + suffix
    if suffix:
        assert all_keys(keys, UID).isdisjoint(all_keys(keys, other))
    assert len(all_keys(keys, other)) == 4


def test_colons_and_percents_are_percent_encoded() -> None:
    keys = RedisKeys()
    assert keys.pod("a:b%c") == "gpuwatch:pod:a%3Ab%25c"
    assert keys.timeline_seen("x:seen") == "gpuwatch:timeline:x%3Aseen:seen"
    assert keys.pod('q"uo\nte\x00\U0001f680') == 'gpuwatch:pod:q"uo\nte\x00\U0001f680'
