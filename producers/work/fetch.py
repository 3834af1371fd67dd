"""One HTTP GET of a pod's metrics, within a time limit and a byte cap.

urllib3 does the HTTP: it is well kept, already here (the `kubernetes` client is built on
it), keeps a connection pool per pod between scrapes, reads the body in pieces so that
reading stops at the cap instead of after a pod's gigabyte, and, unlike `urllib.request`
and requests, never routes through a proxy named in the environment (pod IPs are reached
directly from the node). Bodies are asked for and read unencoded: a compressed body is
refused rather than expanded, so the cap is the memory a scrape may take.

The time limit covers the whole scrape: connecting and the headers within `timeout_s`,
then each read of the body within what is left of it, so a pod that sends a byte a
second does not hold a scrape for an hour.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Final

import urllib3
from urllib3.exceptions import HTTPError, NewConnectionError, ProtocolError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

__all__ = ["ACCEPT", "Fetch", "HttpFetcher", "ScrapeFailed"]

ACCEPT: Final = "text/plain;version=0.0.4"
"""The Prometheus text format: what `read_counters` parses (an exporter that can also
speak OpenMetrics or protobuf picks this one)."""
CHUNK = 64 << 10
POOLS = 256  # more than the 110 pods a node runs by default: every pod keeps its pool

Fetch = Callable[[str, float, int], bytes]
"""`(url, timeout_s, max_bytes) -> body`, ScrapeFailed on failure."""


class ScrapeFailed(Exception):  # noqa: N818 - a condition, counted and retried
    """A scrape got no usable body. `reason` is a short key for a metric label: `timeout`,
    `connection`, `status` (HTTP `status` not 200), `too_large`, `compressed`."""

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.status = status


class HttpFetcher:
    """`Fetch` over one urllib3 pool manager (thread-safe); `close` when done."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._pools = urllib3.PoolManager(
            num_pools=POOLS,
            maxsize=1,
            block=False,
            retries=False,
            headers={
                "Accept": ACCEPT,
                "Accept-Encoding": "identity",
                "User-Agent": "gpuwatch-node-agent",
            },
        )

    def __call__(self, url: str, timeout_s: float, max_bytes: int) -> bytes:
        """The body of a 200 answer to GET `url`; ScrapeFailed otherwise."""
        deadline = self._monotonic() + timeout_s
        try:
            response = self._pools.request(
                "GET",
                url,
                timeout=urllib3.Timeout(total=timeout_s),
                preload_content=False,
                decode_content=False,
                redirect=False,
            )
        except NewConnectionError as exc:  # a subclass of ConnectTimeoutError: first
            raise ScrapeFailed("connection", _short(exc)) from exc
        except (Urllib3Timeout, TimeoutError) as exc:
            raise ScrapeFailed("timeout", f"no answer within {timeout_s:g} s") from exc
        except (HTTPError, OSError) as exc:
            raise ScrapeFailed("connection", _short(exc)) from exc
        complete = False
        try:
            body = self._body(response, deadline, timeout_s, max_bytes)
            complete = True
            return body
        finally:
            if not complete:
                response.close()  # the rest unread: the connection cannot be reused
            response.release_conn()

    def _body(
        self, response: urllib3.BaseHTTPResponse, deadline: float, timeout_s: float, cap: int
    ) -> bytes:
        if response.status != 200:
            raise ScrapeFailed("status", f"HTTP {response.status}", response.status)
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ScrapeFailed("compressed", f"Content-Encoding {encoding} was not asked for")
        length = response.headers.get("Content-Length", "")
        if length.strip().isdigit() and int(length) > cap:
            raise ScrapeFailed("too_large", f"Content-Length {length} > {cap} bytes")
        parts: list[bytes] = []
        size = 0
        sock = _socket(response)
        try:
            while True:
                left = deadline - self._monotonic()
                if left <= 0:
                    raise ScrapeFailed("timeout", f"body not read within {timeout_s:g} s")
                if sock is not None:
                    sock.settimeout(left)
                part = response.read1(min(CHUNK, cap + 1 - size), decode_content=False)
                if not part:
                    return b"".join(parts)
                parts.append(part)
                size += len(part)
                if size > cap:
                    raise ScrapeFailed("too_large", f"more than {cap} bytes")
        except (Urllib3Timeout, TimeoutError) as exc:
            raise ScrapeFailed("timeout", f"body not read within {timeout_s:g} s") from exc
        except (ProtocolError, HTTPError, OSError) as exc:
            raise ScrapeFailed("connection", _short(exc)) from exc

    def close(self) -> None:
        """Close every pooled connection."""
        self._pools.clear()


def _socket(response: urllib3.BaseHTTPResponse) -> socket.socket | None:
    """The answer's socket, to give each read of the body what is left of the time."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]
