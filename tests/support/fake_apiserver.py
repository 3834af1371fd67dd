"""The in-process test API server with the faults only tests inject: compaction on cue,
ERROR 410 on open watches, connections cut mid-stream, HTTP errors for the next requests.

The server itself (`gpuwatch.harness.simulate.kube.apiserver`) is what the cluster
simulator runs; it serves what these switches set: the history floor, the flags of its
open watches (`_flag`) and the status `_take_failure` hands each request.
"""

from __future__ import annotations

from functools import cached_property

from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer as SimulatorApiServer


class FakeApiServer(SimulatorApiServer):
    """The test API server, with its fault switches."""

    @cached_property
    def _failures(self) -> list[tuple[str | None, int]]:
        """The statuses of the next requests (resource or any, status), oldest first; read
        and written under the server's lock."""
        return []

    def compact(self) -> None:
        """Forget the change history: watches from an older resourceVersion get 410 Gone,
        and so do list continue tokens."""
        with self._cond:
            self._floor = self._rv
            self._history.clear()
            self._history_rvs.clear()
            self._snapshots.clear()

    def drop_watches(self, resource: str | None = None) -> int:
        """Cut open watch connections without ending the stream; returns how many."""
        return self._flag(resource, "drop")

    def expire_watches(self, resource: str | None = None) -> int:
        """Compact, then send ERROR 410 Expired on the open watches and end them."""
        self.compact()
        return self._flag(resource, "expire")

    def fail_next(self, count: int = 1, status: int = 500, resource: str | None = None) -> None:
        """Answer the next `count` requests (of `resource`, or any) with HTTP `status`."""
        with self._cond:
            self._failures.extend([(resource, status)] * count)

    def _take_failure(self, resource: str | None) -> int | None:
        for index, (only, status) in enumerate(self._failures):
            if only in (None, resource):
                del self._failures[index]
                return status
        return None
