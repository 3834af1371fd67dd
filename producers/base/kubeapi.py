"""The Kubernetes API as the producers need it: list, watch, get, one request; its errors.

`producers.k8s.client` implements it with the `kubernetes` client; tests and the
simulator swap in other implementations. Bodies are raw JSON bytes: decoding belongs
to the pure core.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "ApiCaller",
    "ApiError",
    "Collection",
    "Disconnected",
    "Expired",
    "KubeApi",
    "WatchLines",
]

Resource = Literal["pods", "nodes", "workloads", "resourceslices"]
"""Pods and nodes (core/v1); Kueue's Workloads (kueue.x-k8s.io) and DRA's ResourceSlices
(resource.k8s.io), each at `Collection.version`."""


@dataclass(frozen=True)
class Collection:
    """What one list+watch covers: a resource, one namespace or all, a label selector; a
    custom resource at the served `version` of its group."""

    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        where = f"/{self.namespace}" if self.namespace else ""
        selector = f"?{self.label_selector}" if self.label_selector else ""
        return f"{self.resource}{where}{selector}"


class ApiError(Exception):
    """A request failed: an HTTP status (`status`), or no answer at all (status None).

    Every API error is retried with backoff; `status` tells a metric or a log what kind.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Expired(ApiError):  # noqa: N818 - the API's own reason name
    """410 Gone: the resourceVersion (or continue token) is older than the API keeps."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 410)


class Disconnected(ApiError):  # noqa: N818 - a condition, not a failure of ours
    """The watch connection broke mid-stream (or a read timed out); resume from the last
    resourceVersion."""


class WatchLines(Protocol):
    """An open watch: the stream's lines (one JSON event each) until the server ends it.

    Iterating raises `Disconnected` when the connection breaks; `close` may be called
    from another thread to stop a blocked read.
    """

    def __iter__(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class KubeApi(Protocol):
    """List, watch and get, raising `ApiError` (or a subclass) on failure."""

    def list(self, collection: Collection, *, limit: int, continue_token: str | None) -> bytes:
        """One page of a consistent list (no resourceVersion: the latest state)."""
        ...

    def watch(self, collection: Collection, *, resource_version: str, timeout_s: int) -> WatchLines:
        """Open a watch from `resource_version`, with bookmarks, ended by the server after
        `timeout_s`. A 410 may come as an ERROR event in the stream or as `Expired`."""
        ...

    def get_controller(self, kind: str, namespace: str, name: str) -> bytes | None:
        """A ReplicaSet or Job body; None when it does not exist or may not be read."""
        ...

    def get_object(self, api: str, resource: str, namespace: str, name: str) -> bytes | None:
        """A namespaced object of `api` (`resource.k8s.io/v1`); None when it does not exist
        or may not be read."""
        ...

    def served_versions(self, group: str) -> tuple[str, ...] | None:
        """The versions of an API group the server serves, its preferred one first; None
        when it serves none (a CRD not installed)."""
        ...


class ApiCaller(Protocol):
    """One request to the API server (`KubernetesApi.call`)."""

    def call(self, method: str, path: str) -> bytes:
        """The answer's body; ApiError on failure."""
        ...
