"""Which pods of a node report units of work, and where: their annotations, read.

A pod opts in with `gpuwatch.io/work: "steps=train_steps_total,tokens=vllm:..."` (unit
name = metric name, comma-separated), `gpuwatch.io/work-port` and optionally
`gpuwatch.io/work-path` (default `/metrics`). `ApiTargets` lists the node's pods from the
API server (field selector `spec.nodeName`) every `refresh_s`; between two listings the
last one is used, and a failed listing keeps it (counted, one WARNING per outage), so the
scrapes go on while the API server is away. A bad annotation is the pod owner's mistake:
it is logged once per pod and counted, and the pod is not scraped.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

from producers.base.kubeapi import ApiCaller, ApiError
from producers.base.paging import node_items
from schemas.ids import NodeName, PodUid

__all__ = [
    "ANNOTATION",
    "DEFAULT_PATH",
    "PATH_ANNOTATION",
    "PODS_PATH",
    "PORT_ANNOTATION",
    "ApiTargets",
    "BadWorkAnnotation",
    "TargetSource",
    "WorkTarget",
    "parse_target",
]

log = logging.getLogger(__name__)

ANNOTATION: Final = "gpuwatch.io/work"
PORT_ANNOTATION: Final = "gpuwatch.io/work-port"
PATH_ANNOTATION: Final = "gpuwatch.io/work-path"
DEFAULT_PATH: Final = "/metrics"
PODS_PATH: Final = "/api/v1/pods"

UNIT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
"""`schemas.fields.UnitName`'s pattern: a unit name is a key of `WorkUnits.units`."""
METRIC_NAME = re.compile(r'^[^\s",={}]{1,512}$')
"""A metric name as an exposition writes it: legacy names (with `:`, as vLLM's) and the
newer UTF-8 ones (`my.metric`), but nothing that would split the annotation or a line."""
PATH = re.compile(r"^/[^\s#]{0,1023}$")


class BadWorkAnnotation(ValueError):  # noqa: N818 - bad input, as MalformedObject
    """A pod's `gpuwatch.io/work*` annotations cannot be used; the message says why."""


@dataclass(frozen=True)
class WorkTarget:
    """One pod to scrape: who it is, its metrics URL, and unit name -> metric name."""

    uid: PodUid
    namespace: str
    pod: str
    node: NodeName
    url: str
    units: Mapping[str, str] = field(hash=False)


class TargetSource(Protocol):
    """The pods to scrape now."""

    def targets(self) -> Sequence[WorkTarget]:
        """The current targets; never raises (a source keeps its last answer)."""
        ...


def parse_target(  # noqa: PLR0917 - the fields of a listed pod, in the order it has them
    namespace: str,
    pod: str,
    uid: str,
    node: str,
    annotations: Mapping[str, str],
    pod_ip: str | None,
) -> WorkTarget | None:
    """The pod's target; None when it does not opt in or has no IP yet. BadWorkAnnotation
    for annotations that cannot be used (checked before the IP, so a mistake shows as soon
    as the pod is listed)."""
    spec = annotations.get(ANNOTATION)
    if spec is None:
        return None
    units = _units(spec)
    port = _port(annotations.get(PORT_ANNOTATION))
    path = annotations.get(PATH_ANNOTATION, DEFAULT_PATH).strip()
    if not PATH.match(path):
        raise BadWorkAnnotation(
            f"{PATH_ANNOTATION} {path!r} is not a path starting with / (no spaces or #)"
        )
    if not pod_ip:
        return None
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return WorkTarget(
        uid=PodUid(uid),
        namespace=namespace,
        pod=pod,
        node=NodeName(node),
        url=f"http://{host}:{port}{path}",
        units=units,
    )


def _units(spec: str) -> Mapping[str, str]:
    units: dict[str, str] = {}
    for item in spec.split(","):
        if not item.strip():
            continue  # a trailing comma, or one line per unit in a folded YAML string
        name, eq, metric = (part.strip() for part in item.partition("="))
        if not eq:
            raise BadWorkAnnotation(f"{ANNOTATION}: {item.strip()!r} is not name=metric")
        if not UNIT_NAME.match(name):
            raise BadWorkAnnotation(
                f"{ANNOTATION}: unit name {name!r} is not a letter or _ then up to 62 "
                "letters, digits or _"
            )
        if name in units:
            raise BadWorkAnnotation(f"{ANNOTATION}: unit {name!r} named twice")
        if not metric:
            raise BadWorkAnnotation(f"{ANNOTATION}: unit {name!r} names no metric")
        if not METRIC_NAME.match(metric):
            raise BadWorkAnnotation(f"{ANNOTATION}: {metric!r} is not a metric name")
        units[name] = metric
    if not units:
        raise BadWorkAnnotation(f"{ANNOTATION} names no unit (name=metric,...)")
    return MappingProxyType(units)


def _port(value: str | None) -> int:
    if value is None:
        raise BadWorkAnnotation(f"{ANNOTATION} without {PORT_ANNOTATION}")
    text = value.strip()
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise BadWorkAnnotation(f"{PORT_ANNOTATION} {value!r} is not a port (1-65535)")
    return int(text)


class ApiTargets:
    """`TargetSource` of the Running pods of one node, listed from the API server."""

    def __init__(
        self,
        api: Callable[[], ApiCaller],
        node: str,
        *,
        refresh_s: float = 60.0,
        retry_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`api` is called once, at the first listing: connecting may fail (it is
        retried). A failed listing is tried again after `retry_s`."""
        self._connect = api
        self._api: ApiCaller | None = None
        self._node = node
        self._refresh_s = refresh_s
        self._retry_s = retry_s
        self._monotonic = monotonic
        self._targets: tuple[WorkTarget, ...] = ()
        self._loaded_at: float | None = None
        self._tried_at: float | None = None
        self._failing = False
        self._reported: dict[str, str] = {}
        """uid -> the bad annotation logged for it, so each is logged (and counted) once."""
        self.loads = 0
        """Successful listings."""
        self.failures = 0
        """Failed listings (each counted; the first of an outage logged)."""
        self.bad_annotations = 0
        """Pods found with annotations that cannot be used (each pod once per value)."""

    def targets(self) -> Sequence[WorkTarget]:
        """The targets of the last successful listing; the pods are listed again when it
        is `refresh_s` old (after a failure, `retry_s` after it)."""
        now = self._monotonic()
        due = self._loaded_at is None or now - self._loaded_at >= self._refresh_s
        may_retry = self._tried_at is None or now - self._tried_at >= self._retry_s
        if due and may_retry:
            self._tried_at = now
            self._load(now)
        return self._targets

    def _load(self, now: float) -> None:
        try:
            pods = self._list()
        except (ApiError, ValueError, OSError) as exc:
            self.failures += 1
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(
                level,
                "pods of node %s unreadable: %s; scraping the %d known work targets, "
                "retrying in %.0f s",
                self._node,
                exc,
                len(self._targets),
                self._retry_s,
            )
            self._failing = True
            return
        if self._failing:
            log.info("pods of node %s readable again", self._node)
        self._failing = False
        self._targets = tuple(self._targets_of(pods))
        self._loaded_at = now
        self.loads += 1
        log.debug("work targets listed node=%s targets=%d", self._node, len(self._targets))

    def _targets_of(self, pods: list[Mapping[str, Any]]) -> list[WorkTarget]:
        found: list[WorkTarget] = []
        seen: set[str] = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            status = pod.get("status") or {}
            annotations = meta.get("annotations") or {}
            uid = str(meta.get("uid") or "")
            if not uid or status.get("phase") != "Running" or ANNOTATION not in annotations:
                continue
            seen.add(uid)
            namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            try:
                target = parse_target(
                    namespace, name, uid, self._node, annotations, status.get("podIP")
                )
            except BadWorkAnnotation as exc:
                self._bad(uid, f"{namespace}/{name}", annotations, exc)
                continue
            self._reported.pop(uid, None)
            if target is not None:
                found.append(target)
        for gone in self._reported.keys() - seen:
            del self._reported[gone]
        return found

    def _bad(
        self, uid: str, pod: str, annotations: Mapping[str, Any], exc: BadWorkAnnotation
    ) -> None:
        value = "\n".join(
            str(annotations.get(key)) for key in (ANNOTATION, PORT_ANNOTATION, PATH_ANNOTATION)
        )
        if self._reported.get(uid) == value:
            return
        self._reported[uid] = value
        self.bad_annotations += 1
        log.warning("pod=%s uid=%s not scraped for units of work: %s", pod, uid, exc)

    def _list(self) -> list[Mapping[str, Any]]:
        """Every page of this node's pods. ValueError for an answer that is not a list."""
        if self._api is None:
            self._api = self._connect()
        return node_items(self._api, PODS_PATH, self._node, "pod")
