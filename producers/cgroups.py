"""Host PID -> pod: the kubelet's pod and container cgroups, read from /proc/<pid>/cgroup.

NVML reports host PIDs; the pod of each comes from the cgroup path the kubelet and
the container runtime gave the process:

- systemd driver: `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/
  <runtime>-<id>.scope`, the uid's dashes escaped to underscores (systemd reserves
  "-" for the slice hierarchy); guaranteed pods sit right under `kubepods.slice`
  (`kubepods-pod<uid>.slice`); a kubelet `--cgroup-root` prefixes every slice
  (kind: `kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-<qos>-pod<uid>.slice`).
- cgroupfs driver: `kubepods/<qos>/pod<uid>/<id>`, guaranteed `kubepods/pod<uid>/<id>`.
- runtimes: containerd `cri-containerd-<id>.scope`, CRI-O `crio-<id>.scope` (cgroupfs:
  `crio-<id>`; its monitor `crio-conmon-<id>.scope` is no container), cri-dockerd
  `docker-<id>.scope`, or the bare 64-hex id under cgroupfs. crun may add a nested
  `container` cgroup below the scope.
- static pods have a 32-hex config-hash uid instead of a UUID.

cgroup v1 has one line per hierarchy (`4:memory:/kubepods/...`), v2 one line
(`0::/kubepods.slice/...`), hybrid both. Seen from another cgroup namespace (an agent
in a container on cgroup v2) a path is relative and may start with `/../..`; seen
from inside the same namespace it is just `/`, which names no pod.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from producers.base.ports import PodRef, PodResolver
from schemas.ids import PodUid

__all__ = ["CgroupPodResolver", "parse_cgroup", "parse_cgroup_path", "parse_start_time"]

logger = logging.getLogger(__name__)

DEFAULT_CACHE_SIZE = 4096  # a GPU node runs at most a few hundred GPU processes at once

_UID = r"[0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_SYSTEMD_POD = re.compile(rf"^(?:[\w.-]+-)?kubepods(?:-[a-z]+)?-pod(?P<uid>{_UID})\.slice$")
_CGROUPFS_POD = re.compile(rf"^pod(?P<uid>{_UID})$")
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")


def _pod_uid(component: str, under_kubepods: bool) -> str | None:
    """The canonical (dashed) pod uid a path component names, if it names one."""
    match = _SYSTEMD_POD.match(component)
    if match is None and under_kubepods:
        match = _CGROUPFS_POD.match(component)
    if match is None:
        return None
    return match["uid"].replace("_", "-")


def parse_cgroup_path(path: str) -> PodRef | None:
    """The pod (and container) of one cgroup path; None for a path of no pod.

    The innermost pod component wins (a kind node is itself a container), and the
    component right below it is the container, unless it is a runtime helper.
    """
    parts = [part for part in path.split("/") if part and part != ".."]
    found: tuple[int, str] | None = None
    for index, part in enumerate(parts):
        under_kubepods = any("kubepods" in parent for parent in parts[:index])
        uid = _pod_uid(part, under_kubepods)
        if uid is not None:
            found = (index, uid)
    if found is None:
        return None
    index, uid = found
    container_id = None
    if index + 1 < len(parts):
        match = _CONTAINER.match(parts[index + 1])
        container_id = match["id"] if match else None
    return PodRef(pod_uid=PodUid(uid), container_id=container_id)


def parse_cgroup(text: str) -> PodRef | None:
    """The pod of a process from the content of /proc/<pid>/cgroup (v1, v2 or hybrid).

    Every hierarchy holds the process in the same pod; a line that also names the
    container is preferred over one that stops at the pod (a v1 controller such as
    `rdma` can leave the process at the pod level or at `/`).
    """
    pod_only: PodRef | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        ref = parse_cgroup_path(fields[2])
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        pod_only = pod_only or ref
    return pod_only


def parse_start_time(stat: str) -> int:
    """Field 22 of /proc/<pid>/stat, the start time in clock ticks since boot.

    The command name (field 2) is in parentheses and may itself contain spaces and
    parentheses, so fields are counted from the last ")".
    """
    after_comm = stat[stat.rindex(")") + 1 :].split()
    return int(after_comm[22 - 3])  # after_comm[0] is field 3, `state`


class CgroupPodResolver:
    """PodResolver over a /proc tree, caching results per process.

    A PID can be reused by an unrelated process, so the cache key is (pid, start
    time); a hit still reads /proc/<pid>/stat, but skips reading and parsing the
    cgroup file. The cache is a bounded LRU. Not thread-safe: one agent loop owns it.
    """

    def __init__(
        self, proc_root: Path = Path("/proc"), cache_size: int = DEFAULT_CACHE_SIZE
    ) -> None:
        self._proc_root = proc_root
        self._cache_size = cache_size
        self._cache: OrderedDict[tuple[int, int], PodRef | None] = OrderedDict()

    def resolve(self, pid: int) -> PodRef | None:
        """The pod of host PID `pid`; None for no pod, a vanished PID or an unreadable one."""
        proc = self._proc_root / str(pid)
        try:
            key = (pid, parse_start_time((proc / "stat").read_text()))
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            ref = parse_cgroup((proc / "cgroup").read_text())
        except (OSError, ValueError, IndexError) as exc:
            # FileNotFoundError / ProcessLookupError: the process exited meanwhile;
            # PermissionError: /proc mounted with hidepid or a foreign user namespace.
            logger.debug("pid not resolved pid=%d error=%s", pid, type(exc).__name__)
            return None
        self._cache[key] = ref
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return ref


if TYPE_CHECKING:
    _conforms: PodResolver = CgroupPodResolver()
