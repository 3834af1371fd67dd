"""Build hook: generate the kubelet PodResources gRPC modules before the package is built."""

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

CODEGEN = Path(__file__).resolve().parent / "producers" / "podresources" / "codegen.py"


def load_codegen() -> ModuleType:
    """producers/podresources/codegen.py by path: the package itself is not importable yet."""
    spec = importlib.util.spec_from_file_location("gpuwatch_podresources_codegen", CODEGEN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithCodegen(build_py):
    """build_py that first writes api_pb2.py, api_pb2.pyi and api_pb2_grpc.py (skips when fresh)."""

    def run(self) -> None:
        load_codegen().generate()
        super().run()


setup(cmdclass={"build_py": BuildPyWithCodegen})
