"""The Kubernetes watcher: one list+watch of nodes and one of pods per namespace (or one
for all), each on its own thread, publishing through the given emitters; Kueue's
Workloads the same way where the cluster serves them (`KueueWatches`); and the GPU DRA
drivers' ResourceSlices, whose devices count in their nodes' GPUs (`DraWatches`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from producers.base.kubeapi import ApiError, Collection, KubeApi
from producers.k8s.claims import ClaimLookup, ClaimRequests
from producers.k8s.dra import DRA_GROUP, DRA_VERSIONS, DraInventory, SliceDevices
from producers.k8s.kinds import NodeKind, PodKind, SliceKind, WorkloadKind
from producers.k8s.normalise import NodeRules, PodRules
from producers.k8s.objects import MalformedObject, OwnerReference, decode_owner
from producers.k8s.owners import Lookup, LookupFailed, OwnerResolver, controller_of
from producers.k8s.recall import Recall
from producers.k8s.selection import GpuResources, NodeSelection, PodSelection
from producers.k8s.watching import FULL_RESYNC_S, Backoff, Watch, wall_ms
from producers.k8s.workloads import KUEUE_GROUP, KUEUE_VERSIONS
from schemas.fields import DEFAULT_CLUSTER
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.k8s_workload import K8sWorkload
from schemas.settings import WatcherSettings

log = logging.getLogger(__name__)

N = TypeVar("N", K8sPod, K8sWorkload)
"""A namespaced kind whose watches are one per namespace."""

KUEUE_RECHECK_S = 300.0
"""How often the API is asked again whether it serves Kueue, while it does not."""
DRA_RECHECK_S = 300.0
"""How often the API is asked again whether it serves ResourceSlices, while it does not."""


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


CLAIM_SOURCES = {
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ResourceClaim": "resourceclaims",
}


def api_claims(api: KubeApi) -> ClaimLookup:
    """Claim and claim template lookups through the API (`resource.k8s.io/v1`)."""

    def lookup(kind: str, namespace: str, name: str) -> bytes | None:
        return api.get_object("resource.k8s.io/v1", CLAIM_SOURCES[kind], namespace, name)

    return lookup


class OptionalWatches:
    """The watches of an API group the cluster may not serve (Kueue's, DRA's), once it does.

    While `group` is served at none of `versions` (Kueue not installed, a cluster before
    DRA), it is asked for again every `recheck_s`, and that it is absent is logged once.
    When it is, the watches `make` gives for the first of `versions` it serves run until
    `stop`, each on a thread of its own.
    """

    def __init__(
        self,
        api: KubeApi,
        make: Callable[[str], list[Watch[Any, Any]]],
        added: Callable[[Watch[Any, Any]], None],
        *,
        group: str,
        versions: tuple[str, ...],
        what: str,
        absent: str,
        recheck_s: float,
    ) -> None:
        self._api = api
        self._make = make
        self._added = added
        self._group = group
        self._versions = versions
        self._what = what
        self._absent = absent
        self._recheck_s = recheck_s
        self.version: str | None = None
        """The version watched; None until the group is found."""
        self.checks = 0
        self._said_absent = False
        self._failing = False
        self._threads: list[threading.Thread] = []

    def run(self, stop: threading.Event) -> None:
        """Look for the group until it is there, then run its watches until `stop`."""
        while not stop.is_set():
            watches = self.look()
            if watches is not None:
                break
            stop.wait(self._recheck_s)
        else:
            return
        for watch in watches:
            thread = threading.Thread(
                target=watch.run, args=(stop,), name=f"gpuwatch-watch-{watch.collection}"
            )
            thread.start()
            self._threads.append(thread)
        for thread in self._threads:
            thread.join()

    def look(self) -> list[Watch[Any, Any]] | None:
        """Ask once whether the group is served; when it is, its watches, made and added
        (not started: `run` starts them); None while it is not."""
        version = self._find()
        if version is None:
            return None
        self.version = version
        log.info("%s watched version=%s/%s", self._what, self._group, version)
        watches = self._make(version)
        for watch in watches:
            self._added(watch)
        return watches

    def _find(self) -> str | None:
        """The version to watch, or None (absent: said once; a failed ask: warned once)."""
        self.checks += 1
        try:
            served = self._api.served_versions(self._group)
        except ApiError as exc:
            if not self._failing:
                log.warning("api group %s not readable: %s; asking again", self._group, exc)
            self._failing = True
            return None
        self._failing = False
        version = next((v for v in self._versions if v in (served or ())), None)
        if version is None and not self._said_absent:
            log.info(
                "%s (the API serves no %s %s): %s not watched; looking again every %.0f s",
                self._absent,
                self._group,
                "/".join(self._versions),
                self._what,
                self._recheck_s,
            )
            self._said_absent = True
        return version


class KueueWatches(OptionalWatches):
    """Kueue's Workloads, one watch per namespace, at the newest version gpuwatch reads
    that the server serves, once `kueue.x-k8s.io` is served (Kueue installed)."""

    def __init__(
        self,
        api: KubeApi,
        namespaces: tuple[str | None, ...],
        make: Callable[[Collection], Watch[Any, K8sWorkload]],
        added: Callable[[Watch[Any, Any]], None],
        *,
        recheck_s: float = KUEUE_RECHECK_S,
    ) -> None:
        def watches(version: str) -> list[Watch[Any, Any]]:
            return [make(Collection("workloads", ns, None, version)) for ns in namespaces]

        super().__init__(
            api,
            watches,
            added,
            group=KUEUE_GROUP,
            versions=KUEUE_VERSIONS,
            what="kueue workloads",
            absent="kueue not installed",
            recheck_s=recheck_s,
        )


class DraWatches(OptionalWatches):
    """The ResourceSlices of the GPU DRA drivers (one cluster-wide watch), once
    `resource.k8s.io` is served: each slice's devices go to `devices`; a node whose
    counts change is published again (`node_watch.refresh`), and one not published yet
    that now has devices is found by a relist of the nodes."""

    def __init__(
        self,
        api: KubeApi,
        make: Callable[
            [Collection, SliceKind, Callable[[SliceDevices], None]], Watch[Any, SliceDevices]
        ],
        added: Callable[[Watch[Any, Any]], None],
        *,
        drivers: tuple[str, ...],
        devices: DraInventory,
        nodes: NodeKind,
        node_watch: Watch[Any, K8sNode],
        recheck_s: float = DRA_RECHECK_S,
    ) -> None:
        self.devices = devices
        self._nodes = nodes
        self._node_watch = node_watch
        kind = SliceKind(drivers)

        def watches(version: str) -> list[Watch[Any, Any]]:
            collection = Collection("resourceslices", None, None, version)
            return [make(collection, kind, self.on_slice)]

        super().__init__(
            api,
            watches,
            added,
            group=DRA_GROUP,
            versions=DRA_VERSIONS,
            what="ResourceSlices",
            absent="dynamic resource allocation not served",
            recheck_s=recheck_s,
        )

    def on_slice(self, value: SliceDevices) -> None:
        """One slice added, changed or deleted: the nodes whose counts changed published
        again (or found, when not published yet)."""
        changed = self.devices.apply(value)
        if not changed:
            return
        unpublished = self._node_watch.refresh(sorted(changed), self._nodes.reobserve)
        if any(self.devices.counts(node) for node in unpublished):
            self._node_watch.relist_soon("dra")


def _namespace_recall(
    recall: Recall[N] | None, namespace: str | None
) -> Callable[[], dict[str, N]] | None:
    """The read-back objects of one namespace's watch (None: every namespace); None
    without a read-back."""
    if recall is None:
        return None
    return lambda: recall.of(lambda value: namespace is None or value.namespace == namespace)


class K8sWatcher:
    """Every watch the settings ask for. `start` runs them, `stop` ends them. Every value
    published names `cluster`. Kueue Workloads are watched when `emit_workload` is given
    and the settings want them (`watch_workloads`), once the cluster serves them; the
    ResourceSlices of `dra_drivers` (none: not watched) once it serves them. With
    `recall_pods` / `recall_nodes` / `recall_workloads` (what Kafka holds), the first lists
    publish what changed since, deletions included (`producers.k8s.recall`)."""

    def __init__(
        self,
        api: KubeApi,
        settings: WatcherSettings,
        *,
        emit_pod: Callable[[K8sPod], None],
        emit_node: Callable[[K8sNode], None],
        emit_workload: Callable[[K8sWorkload], None] | None = None,
        now_ms: Callable[[], int] = wall_ms,
        backoff: Backoff | None = None,
        watch_timeout_s: int | None = None,
        full_resync_s: float | None = FULL_RESYNC_S,
        resolve_owners: bool = True,
        cluster: str = DEFAULT_CLUSTER,
        kueue_recheck_s: float = KUEUE_RECHECK_S,
        dra_recheck_s: float = DRA_RECHECK_S,
        recall_pods: Recall[K8sPod] | None = None,
        recall_nodes: Recall[K8sNode] | None = None,
        recall_workloads: Recall[K8sWorkload] | None = None,
    ) -> None:
        gpus = GpuResources.of(settings.gpu_resources, settings.gpu_resource_prefixes)
        self.owners = OwnerResolver(api_lookup(api) if resolve_owners else None)
        pod_rules = PodRules(gpus, settings.pod_label_allowlist, cluster)
        self.claims = ClaimRequests(
            api_claims(api) if resolve_owners and settings.claim_pods else None,
            settings.gpu_device_classes,
        )
        pods = PodKind(
            pod_rules,
            PodSelection(gpus, frozenset(settings.extra_pods), settings.claim_pods),
            self.owners,
            self.claims,
        )
        devices = DraInventory() if settings.dra_drivers else None
        nodes = NodeKind(
            NodeRules(gpus, settings.node_label_allowlist, cluster),
            NodeSelection(gpus),
            devices,
        )
        options: dict[str, Any] = {
            "api": api,
            "watch_timeout_s": watch_timeout_s or settings.watch_timeout_s,
            "now_ms": now_ms,
            "backoff": backoff,
            "full_resync_s": full_resync_s,
        }
        self.node_watch: Watch[Any, K8sNode] = Watch(
            collection=Collection("nodes"),
            kind=nodes,
            emit=emit_node,
            recall=None if recall_nodes is None else lambda: recall_nodes.of(lambda _: True),
            **options,
        )
        self.pod_watches: list[Watch[Any, K8sPod]] = [
            Watch(
                collection=Collection("pods", namespace, settings.label_selector),
                kind=pods,
                emit=emit_pod,
                recall=_namespace_recall(recall_pods, namespace),
                **options,
            )
            for namespace in (settings.namespaces or (None,))
        ]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[Watch[Any, Any]] = [self.node_watch, *self.pod_watches]
        self._lock = threading.Lock()
        self.kueue: KueueWatches | None = None
        if emit_workload is not None and settings.watch_workloads:
            workloads = WorkloadKind(pod_rules, self.owners, self.claims)

            def make(collection: Collection) -> Watch[Any, K8sWorkload]:
                return Watch(
                    collection=collection,
                    kind=workloads,
                    emit=emit_workload,
                    recall=_namespace_recall(recall_workloads, collection.namespace),
                    **options,
                )

            self.kueue = KueueWatches(
                api,
                settings.namespaces or (None,),
                make,
                self._add,
                recheck_s=kueue_recheck_s,
            )
        self.dra: DraWatches | None = None
        if devices is not None:

            def make_slices(
                collection: Collection, kind: SliceKind, emit: Callable[[SliceDevices], None]
            ) -> Watch[Any, SliceDevices]:
                return Watch(collection=collection, kind=kind, emit=emit, **options)

            self.dra = DraWatches(
                api,
                make_slices,
                self._add,
                drivers=settings.dra_drivers,
                devices=devices,
                nodes=nodes,
                node_watch=self.node_watch,
                recheck_s=dra_recheck_s,
            )

    def _add(self, watch: Watch[Any, Any]) -> None:
        with self._lock:
            self._watches.append(watch)
        if self._stop.is_set():
            watch.interrupt()

    @property
    def watches(self) -> list[Watch[Any, Any]]:
        """The node watch, then the pod watches, then the workload and ResourceSlice
        watches once running (one list, which grows: the metrics read it at each scrape)."""
        return self._watches

    @property
    def synced(self) -> bool:
        """Whether every watch has listed once (everything live has been published)."""
        with self._lock:
            watches = list(self._watches)
        return all(watch.resource_version is not None for watch in watches)

    def start(self) -> None:
        """One thread per watch, and one each for Kueue's and DRA's."""
        runs: list[tuple[str, Callable[[threading.Event], None]]] = [
            (f"gpuwatch-watch-{watch.collection}", watch.run) for watch in self._watches
        ]
        if self.kueue is not None:
            runs.append(("gpuwatch-kueue", self.kueue.run))
        if self.dra is not None:
            runs.append(("gpuwatch-dra", self.dra.run))
        for name, run in runs:
            thread = threading.Thread(target=run, args=(self._stop,), name=name)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End every watch (open streams are closed) and join the threads."""
        self._stop.set()
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            watch.interrupt()
        for thread in self._threads:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("watch thread did not stop thread=%s", thread.name)
        self._threads.clear()
