"""The Kubernetes watcher: one list+watch of nodes and one of pods per namespace (or one
for all), each on its own thread, publishing through the given emitters."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from producers.k8s.api import ApiError, Collection, KubeApi
from producers.k8s.kinds import NodeKind, PodKind
from producers.k8s.normalise import NodeRules, PodRules
from producers.k8s.objects import MalformedObject, OwnerReference, decode_owner
from producers.k8s.owners import Lookup, LookupFailed, OwnerResolver, controller_of
from producers.k8s.selection import GpuResources, NodeSelection, PodSelection
from producers.k8s.watching import FULL_RESYNC_S, Backoff, Watch, wall_ms
from schemas.fields import DEFAULT_CLUSTER
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.settings import WatcherSettings

log = logging.getLogger(__name__)


def api_lookup(api: KubeApi) -> Lookup:
    """Owner lookups through the API: a ReplicaSet's or Job's own controller."""

    def lookup(kind: str, namespace: str, name: str) -> OwnerReference | None:
        try:
            raw = api.get_controller(kind, namespace, name)
            if raw is None:
                return None
            meta = decode_owner(raw).get("metadata") or {}
        except (ApiError, MalformedObject) as exc:
            raise LookupFailed(str(exc)) from exc
        return controller_of(meta.get("ownerReferences"))

    return lookup


class K8sWatcher:
    """Every watch the settings ask for. `start` runs them, `stop` ends them. Every value
    published names `cluster`."""

    def __init__(
        self,
        api: KubeApi,
        settings: WatcherSettings,
        *,
        emit_pod: Callable[[K8sPod], None],
        emit_node: Callable[[K8sNode], None],
        now_ms: Callable[[], int] = wall_ms,
        backoff: Backoff | None = None,
        watch_timeout_s: int | None = None,
        full_resync_s: float | None = FULL_RESYNC_S,
        resolve_owners: bool = True,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        gpus = GpuResources.of(settings.gpu_resources, settings.gpu_resource_prefixes)
        self.owners = OwnerResolver(api_lookup(api) if resolve_owners else None)
        pods = PodKind(
            PodRules(gpus, settings.pod_label_allowlist, cluster),
            PodSelection(gpus, frozenset(settings.extra_pods), settings.claim_pods),
            self.owners,
        )
        nodes = NodeKind(
            NodeRules(gpus, settings.node_label_allowlist, cluster), NodeSelection(gpus)
        )
        options: dict[str, Any] = {
            "api": api,
            "watch_timeout_s": watch_timeout_s or settings.watch_timeout_s,
            "now_ms": now_ms,
            "backoff": backoff,
            "full_resync_s": full_resync_s,
        }
        self.node_watch: Watch[Any, K8sNode] = Watch(
            collection=Collection("nodes"), kind=nodes, emit=emit_node, **options
        )
        self.pod_watches: list[Watch[Any, K8sPod]] = [
            Watch(
                collection=Collection("pods", namespace, settings.label_selector),
                kind=pods,
                emit=emit_pod,
                **options,
            )
            for namespace in (settings.namespaces or (None,))
        ]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def watches(self) -> list[Watch[Any, Any]]:
        """The node watch, then the pod watches."""
        return [self.node_watch, *self.pod_watches]

    @property
    def synced(self) -> bool:
        """Whether every watch has listed once (everything live has been published)."""
        return all(watch.resource_version is not None for watch in self.watches)

    def start(self) -> None:
        """One thread per watch."""
        for watch in self.watches:
            thread = threading.Thread(
                target=watch.run, args=(self._stop,), name=f"gpuwatch-watch-{watch.collection}"
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End every watch (open streams are closed) and join the threads."""
        self._stop.set()
        for watch in self.watches:
            watch.interrupt()
        for thread in self._threads:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("watch thread did not stop thread=%s", thread.name)
        self._threads.clear()
