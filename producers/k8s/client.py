"""The `kubernetes` client behind `KubeApi`: raw JSON lists and watch streams, typed errors.

The only module that imports `kubernetes` (no type stubs: `Any` stops here). Requests
go through the generated API methods with `_preload_content=False`, so the client does
the talking (auth, TLS, proxies, kubeconfig) and the watcher decodes the bytes itself,
skipping the slow model classes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as kube
from kubernetes import config as _kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from producers.base.kubeapi import ApiError, Collection, Disconnected, Expired, WatchLines

log = logging.getLogger(__name__)
kube_config: Any = _kube_config  # untyped: loaders of kubeconfig and in-cluster config

CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0  # one list page or get; a page of 500 pods is a few MB
READ_MARGIN_S = 30.0  # a watch may be silent until its server-side timeout, not much longer


class K8sConfigError(Exception):
    """No usable cluster configuration (no kubeconfig, unknown context, not in a pod)."""


def connect(
    kubeconfig: Path | None, context: str | None, *, host: str | None = None
) -> KubernetesApi:
    """The API of the configured cluster: `kubeconfig` (and `context`) when given, else the
    in-cluster service account, else `$KUBECONFIG` or ~/.kube/config; at `host` when given
    instead of the configuration's server."""
    configuration = kube.Configuration()
    try:
        if kubeconfig is None and context is None:
            try:
                kube_config.load_incluster_config(client_configuration=configuration)
                return KubernetesApi(kube.ApiClient(_at(configuration, host)))
            except ConfigException:
                pass  # not in a pod: fall through to the kubeconfig
        kube_config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig is not None else None,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = kubeconfig or "in-cluster config, $KUBECONFIG or ~/.kube/config"
        raise K8sConfigError(f"no usable Kubernetes configuration ({where}): {exc}") from exc
    return KubernetesApi(kube.ApiClient(_at(configuration, host)))


def _at(configuration: Any, host: str | None) -> Any:
    if host is not None:
        configuration.host = host
    return configuration


class KubernetesApi:
    """`KubeApi` over one `kubernetes.client.ApiClient` (thread-safe: one per process)."""

    def __init__(self, api_client: Any) -> None:
        self._api_client = api_client
        self._core = kube.CoreV1Api(api_client)
        self._apps = kube.AppsV1Api(api_client)
        self._batch = kube.BatchV1Api(api_client)
        self._custom = kube.CustomObjectsApi(api_client)

    @classmethod
    def for_host(cls, url: str) -> KubernetesApi:
        """An API at `url` without credentials (a test server, `kubectl proxy`)."""
        return cls(kube.ApiClient(kube.Configuration(host=url)))

    @property
    def host(self) -> str:
        """The API server's URL."""
        return str(self._api_client.configuration.host)

    def close(self) -> None:
        """Release the connection pool."""
        self._api_client.close()

    def another(self, *, token: str | None = None) -> KubernetesApi:
        """A client of the same server with a connection pool of its own: as this one's
        user, or as whoever the bearer `token` names (a service account's)."""
        configuration = copy.deepcopy(self._api_client.configuration)
        if token is not None:
            configuration.api_key = {"BearerToken": f"Bearer {token}"}
            configuration.api_key_prefix = {}
            # A kubeconfig's loader leaves a hook that puts its own token back before
            # every request: the client would act as the kubeconfig's user.
            configuration.refresh_api_key_hook = None
        return KubernetesApi(kube.ApiClient(configuration))

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        token: str | None = None,
    ) -> bytes:
        """One request of any kind (a write, a subresource, /metrics) to `path`, as this
        client's user or as whoever the bearer `token` names; the body of the answer.
        ApiError for an HTTP error (Expired for 410) or no answer."""
        configuration = self._api_client.configuration
        auth = (
            {"Authorization": f"Bearer {token}"}
            if token is not None
            else {
                a["key"]: a["value"]
                for a in configuration.auth_settings().values()
                if a["in"] == "header" and a["value"]
            }
        )
        headers = {"Content-Type": content_type, "Accept": "application/json", **auth}
        what = f"{method} {path}"
        try:
            response = self._api_client.rest_client.request(
                method,
                configuration.host + path,
                headers=headers,
                body=body,
                _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
            )
            data = bytes(response.read())
            response.response.release_conn()
        except (urllib3.exceptions.HTTPError, OSError, ApiException) as exc:
            # ApiException: the client's own words for a TLS failure (status 0).
            raise ApiError(f"{what}: no answer: {exc!r}") from exc
        status = int(response.status)
        if status >= 400:
            message = _status_message(data.decode(errors="replace"))
            detail = f"{response.reason}: {message}" if data else str(response.reason)
            if status == 410:
                raise Expired(f"{what}: {detail}")
            raise ApiError(f"{what}: HTTP {status} {detail}", status)
        return data

    def list(self, collection: Collection, *, limit: int, continue_token: str | None) -> bytes:
        """One page of a consistent list."""
        response = self._request(
            collection,
            limit=limit,
            _continue=continue_token,
            _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
        )
        return _body(response, f"list of {collection}")

    def watch(self, collection: Collection, *, resource_version: str, timeout_s: int) -> WatchLines:
        """A watch with bookmarks from `resource_version`, ended by the server after `timeout_s`."""
        response = self._request(
            collection,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _request_timeout=(CONNECT_TIMEOUT_S, timeout_s + READ_MARGIN_S),
        )
        return _Lines(response, str(collection))

    def get_controller(self, kind: str, namespace: str, name: str) -> bytes | None:
        """A ReplicaSet or Job body; None when absent (404) or forbidden (403)."""
        read: Callable[..., Any]
        if kind == "ReplicaSet":
            read = self._apps.read_namespaced_replica_set
        elif kind == "Job":
            read = self._batch.read_namespaced_job
        else:
            raise ValueError(f"no owner lookup for kind {kind}")
        try:
            response: Any = read(
                name,
                namespace,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
            )
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise _api_error(exc, f"{kind} {namespace}/{name}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(f"{kind} {namespace}/{name}: no answer: {exc!r}") from exc
        return _body(response, f"{kind} {namespace}/{name}")

    def get_object(self, api: str, resource: str, namespace: str, name: str) -> bytes | None:
        """A namespaced object of API `api` (`resource.k8s.io/v1`); None on 404 or 403."""
        try:
            return self.call("GET", f"/apis/{api}/namespaces/{namespace}/{resource}/{name}")
        except ApiError as exc:
            if exc.status in (403, 404):
                return None
            raise

    def served_versions(self, group: str) -> tuple[str, ...] | None:
        """The served versions of `group`, preferred first; None when it is not served."""
        try:
            body = json.loads(self.call("GET", f"/apis/{group}"))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        except ValueError as exc:
            raise ApiError(f"/apis/{group}: not JSON: {exc}") from exc
        versions = [v.get("version") for v in body.get("versions") or () if isinstance(v, dict)]
        preferred = (body.get("preferredVersion") or {}).get("version")
        ordered = [preferred, *versions] if preferred else versions
        return tuple(dict.fromkeys(v for v in ordered if isinstance(v, str) and v)) or None

    def _request(self, collection: Collection, **options: Any) -> Any:
        options["_preload_content"] = False
        if collection.label_selector:
            options["label_selector"] = collection.label_selector
        try:
            if collection.resource == "workloads":
                custom = ("kueue.x-k8s.io", collection.version or "v1beta2", "workloads")
                if collection.namespace:
                    return self._custom.list_namespaced_custom_object(
                        custom[0], custom[1], collection.namespace, custom[2], **options
                    )
                return self._custom.list_cluster_custom_object(*custom, **options)
            if collection.resource == "resourceslices":
                cluster = ("resource.k8s.io", collection.version or "v1", "resourceslices")
                return self._custom.list_cluster_custom_object(*cluster, **options)
            if collection.resource == "nodes":
                return self._core.list_node(**options)
            if collection.namespace:
                return self._core.list_namespaced_pod(collection.namespace, **options)
            return self._core.list_pod_for_all_namespaces(**options)
        except ApiException as exc:
            raise _api_error(exc, str(collection)) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(f"{collection}: no answer: {exc!r}") from exc


def _body(response: Any, what: str) -> bytes:
    """The whole body of a response read without preloading; ApiError when it breaks off."""
    try:
        return bytes(response.data)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ApiError(f"{what} broke off: {exc!r}") from exc
    finally:
        response.release_conn()


def _api_error(exc: Any, what: str) -> ApiError:
    """An ApiException as our error, with the Status message of its body when it has one."""
    status = int(exc.status) if exc.status else None
    detail = f"{exc.reason}: {_status_message(exc.body)}" if exc.body else str(exc.reason)
    if status == 410:
        return Expired(f"{what}: {detail}")
    return ApiError(f"{what}: HTTP {status} {detail}", status)


def _status_message(body: Any) -> str:
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or body)[:300]


class _Lines:
    """The lines of one watch response, as they arrive.

    `close` from another thread while a read blocks only shuts the socket down (the read
    returns); the reading thread releases the response when it leaves the iteration.
    """

    def __init__(self, response: Any, what: str) -> None:
        self._response = response
        self._what = what
        self._lock = threading.Lock()
        self._reading = False
        self._reader: int | None = None
        self._closed = False
        self._released = False
        self._done = False

    def __iter__(self) -> Iterator[bytes]:
        with self._lock:
            if self._closed:
                return
            self._reading = True
            self._reader = threading.get_ident()
        buffer = bytearray()
        try:
            for chunk in self._chunks():
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        yield line
            self._done = True
        except Exception as exc:
            if self.closed:
                return  # closed by us, from another thread: not a failure
            if isinstance(
                exc, urllib3.exceptions.HTTPError | OSError | ValueError | AttributeError
            ):
                # AttributeError: http.client's reader after the socket went away under it.
                raise Disconnected(f"watch of {self._what} broke off: {exc!r}") from exc
            raise
        finally:
            with self._lock:
                self._reading = False
                if self.closed:
                    self._release()
        if buffer.strip():
            yield bytes(buffer)

    @property
    def closed(self) -> bool:
        """Whether `close` was called (from any thread)."""
        return self._closed

    def _chunks(self) -> Iterator[bytes]:
        response = self._response
        if response.chunked and response.supports_chunked_reads():
            yield from response.read_chunked(None, decode_content=True)
            return
        while chunk := response.read1(1 << 16):
            yield chunk

    def close(self) -> None:
        """End the stream; safe from another thread while a read blocks, and twice."""
        with self._lock:
            self._closed = True
            if self._reading and self._reader != threading.get_ident():
                # Wake the reader; it releases the response on its way out.
                with contextlib.suppress(ValueError, RuntimeError, OSError):
                    self._response.shutdown()
                return
            self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._done:
            self._response.release_conn()  # a cleanly ended stream: the connection is reusable
        else:
            self._response.close()
