"""Input messages of one cluster as another cluster sends them: the same node and pod
names, pod uids and GPU uuids of its own (as real clusters have), the `cluster` field set."""

from __future__ import annotations

import json
from typing import Any

from worker_fixtures import Message

_UID_KEYS = frozenset({"uid", "pod_uid"})
_UUID_KEYS = frozenset({"uuid", "parent_uuid"})


def other_uid(uid: str) -> str:
    """The other cluster's uid of a pod: its first character made `e`."""
    return "e" + uid[1:]


def other_uuid(uuid: str) -> str:
    """The other cluster's uuid of a GPU: `GPU-e...` for `GPU-x...`."""
    kind, _, rest = uuid.partition("-")
    return f"{kind}-e{rest[1:]}"


def _renamed(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _UID_KEYS and isinstance(item, str):
                out[key] = other_uid(item)
            elif key in _UUID_KEYS and isinstance(item, str):
                out[key] = other_uuid(item)
            elif key == "device_ids":
                out[key] = [other_uuid(d) for d in item]
            else:
                out[key] = _renamed(item)
        return out
    if isinstance(value, list):
        return [_renamed(item) for item in value]
    return value


def in_cluster(message: Message, cluster: str) -> Message:
    """A message of the default cluster as `cluster` sends it (pod events keyed by the new
    uid, samples and node events by the same node name); its partition left to the key."""
    topic, key, value, _ = message
    renamed = _renamed(json.loads(value)) | {"cluster": cluster}
    by_uid = topic.endswith("k8s.pods") and key is not None
    new_key = other_uid(key.decode()).encode() if by_uid else key
    return (topic, new_key, json.dumps(renamed).encode(), None)
