"""HTTP/1.1 for the test API server: JSON bodies, chunked watch streams, cut connections."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

log = logging.getLogger(__name__)

__all__ = [
    "Handler",
    "Handles",
    "Server",
    "Stop",
    "event_line",
    "send_json",
    "send_status",
    "status_body",
]

Obj = dict[str, Any]


class Stop(Exception):  # noqa: N818 - control flow inside a handler
    """The client went away or the watch was dropped: end the handler."""


class Handles(Protocol):
    """What answers the requests: the API server."""

    def handle(self, request: Handler) -> None:
        """Answer one GET."""
        ...


def status_body(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def event_line(type_: str, obj: Obj) -> bytes:
    return json.dumps({"type": type_, "object": obj}, separators=(",", ":")).encode() + b"\n"


def send_json(request: Handler, code: int, body: Obj) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    request.send_response(code)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


def send_status(request: Handler, code: int, reason: str, message: str) -> None:
    send_json(request, code, status_body(code, reason, message))


class Handler(BaseHTTPRequestHandler):
    """One connection: GET requests, answered by the server's `api`."""

    protocol_version = "HTTP/1.1"
    server: Server

    def do_GET(self) -> None:
        try:
            self.server.api.handle(self)
        except (BrokenPipeError, ConnectionResetError, Stop):
            self.close_connection = True

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError as exc:
            raise Stop from exc

    def end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError as exc:
            raise Stop from exc

    def cut(self) -> None:
        """Close the connection abruptly, mid-stream."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fake apiserver: " + format, *args)


class Server(ThreadingHTTPServer):
    """127.0.0.1 on a free port, one thread per connection, every connection tracked."""

    daemon_threads = False  # joined on close: a test leaves no thread behind
    block_on_close = True

    def __init__(self, api: Handles) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.api = api
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is routine here (watches are cut on purpose)."""
        log.debug(
            "fake apiserver: connection from %s ended with an error", client_address, exc_info=True
        )

    def cut_all(self) -> None:
        """Shut every open connection down, so idle keep-alive handlers return."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
