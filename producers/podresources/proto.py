"""The generated PodResources messages, with a clear error when they were never generated."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["GeneratedCodeMissingError", "api_pb2", "grpc_module", "method_path"]

_HINT = "run `make install` or `python -m producers.podresources.codegen`"


class GeneratedCodeMissingError(ImportError):
    """api_pb2 / api_pb2_grpc are build outputs and this checkout has none yet."""


def _load(name: str) -> ModuleType:
    """Import a generated module of this package, turning its absence into a hint."""
    qualified = f"{__package__}.{name}"
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise
        raise GeneratedCodeMissingError(f"{qualified} is not generated: {_HINT}") from exc


_load("api_pb2")

from producers.podresources import api_pb2  # noqa: E402  (checked just above)

_SERVICE = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]


def method_path(method: str) -> str:
    """The gRPC path of a PodResourcesLister method: `/v1.PodResourcesLister/List`."""
    return f"/{_SERVICE.full_name}/{_SERVICE.methods_by_name[method].name}"


def grpc_module() -> ModuleType:
    """The generated servicer/stub module (untyped), for fake kubelets in tests and simulators."""
    return _load("api_pb2_grpc")
