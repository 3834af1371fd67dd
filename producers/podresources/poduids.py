"""Pod name -> pod uid on this node, from the kubelet's pod log directories.

The PodResources API names pods by namespace and name only, but gpuwatch keys
everything by pod uid. The kubelet creates `/var/log/pods/<namespace>_<name>_<uid>`
for every pod it runs (kuberuntime `BuildPodLogsDirectory`, logPathDelimiter "_"),
before its containers start, so the node agent can map names to uids without the
API server. Namespaces and pod names are DNS names and never contain "_". The uid
is the kubelet's own, the same one the pod's cgroup carries (for a static pod that
is its config hash, not the mirror pod's metadata.uid).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from schemas.ids import PodUid

__all__ = ["DEFAULT_POD_LOG_ROOT", "PodLogUids", "parse_log_dir_name"]

logger = logging.getLogger(__name__)

DEFAULT_POD_LOG_ROOT = Path("/var/log/pods")


def parse_log_dir_name(name: str) -> tuple[str, str, PodUid] | None:
    """(namespace, pod, uid) from a pod log directory name; None for anything else."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    namespace, pod, uid = parts
    return namespace, pod, PodUid(uid)


class PodLogUids:
    """Looks pod uids up by (namespace, name) in the pod log directories.

    The index is rebuilt by `refresh()` (once per tick: a few hundred directory
    entries). When a pod was recreated under the same name (a StatefulSet pod) and
    the old directory still exists, the newest directory wins.
    """

    def __init__(self, root: Path = DEFAULT_POD_LOG_ROOT) -> None:
        self._root = root
        self._index: dict[tuple[str, str], PodUid] = {}
        self._warned_missing = False

    def refresh(self) -> None:
        """Re-read the directory; an unreadable one leaves the index empty (WARNING once)."""
        found: dict[tuple[str, str], list[os.DirEntry[str]]] = {}
        try:
            with os.scandir(self._root) as entries:
                for entry in entries:
                    parsed = parse_log_dir_name(entry.name)
                    if parsed is not None:
                        found.setdefault(parsed[:2], []).append(entry)
        except OSError as exc:
            if not self._warned_missing:
                logger.warning(
                    "pod log directory unreadable root=%s error=%s; "
                    "allocations cannot be matched to pod uids (mount /var/log/pods)",
                    self._root,
                    exc,
                )
                self._warned_missing = True
            self._index = {}
            return
        self._warned_missing = False
        self._index = {}
        for key, candidates in found.items():
            newest = max(candidates, key=_mtime) if len(candidates) > 1 else candidates[0]
            self._index[key] = PodUid(newest.name.rsplit("_", 1)[1])

    def lookup(self, namespace: str, pod: str) -> PodUid | None:
        """The uid of pod `namespace/pod` as of the last refresh; None when unknown."""
        return self._index.get((namespace, pod))


def _mtime(entry: os.DirEntry[str]) -> float:
    """Modification time of a directory entry; 0 when it vanished meanwhile."""
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0
