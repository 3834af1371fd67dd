"""The build-time generator of the PodResources modules: outputs, freshness, failures."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from producers.podresources import codegen

PROTO = Path(codegen.__file__).parent / "api.proto"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the proto laid out as producers/podresources/ in a scratch tree."""
    directory = tmp_path / "producers" / "podresources"
    directory.mkdir(parents=True)
    shutil.copy(PROTO, directory / "api.proto")
    return directory


def test_generates_the_three_modules_with_a_relative_import(package: Path) -> None:
    assert not codegen.is_fresh(package)
    assert codegen.generate(package) is True
    assert sorted(p.name for p in package.iterdir()) == sorted(["api.proto", *codegen.OUTPUT_NAMES])
    grpc_source = (package / "api_pb2_grpc.py").read_text()
    assert "from . import api_pb2 as " in grpc_source
    assert "/v1.PodResourcesLister/List" in grpc_source
    assert "class PodResources(_message.Message)" in (package / "api_pb2.pyi").read_text()
    # registered under its package path, a name no other library's protos will take
    assert "producers/podresources/api.proto" in (package / "api_pb2.py").read_text()
    assert codegen.is_fresh(package)


def test_skips_when_fresh_and_regenerates_when_the_proto_changes(package: Path) -> None:
    codegen.generate(package)
    assert codegen.generate(package) is False
    later = (package / "api_pb2.py").stat().st_mtime + 10
    os.utime(package / "api.proto", (later, later))
    assert not codegen.is_fresh(package)
    assert codegen.generate(package) is True
    assert codegen.generate(package, force=True) is True


def test_a_broken_proto_raises_and_keeps_the_previous_outputs(package: Path) -> None:
    codegen.generate(package)
    before = (package / "api_pb2.py").read_text()
    (package / "api.proto").write_text('syntax = "proto3";\npackage v1;\nmessage {\n')
    with pytest.raises(codegen.CodegenError, match="protoc failed"):
        codegen.generate(package)
    assert (package / "api_pb2.py").read_text() == before


@pytest.mark.parametrize(
    "line",
    [
        "import api_pb2 as api__pb2",
        "from producers.podresources import api_pb2 as producers_dot_podresources_dot_api__pb2",
    ],
)
def test_fix_imports_makes_the_messages_import_relative(line: str) -> None:
    alias = line.rsplit(" ", 1)[1]
    source = f"import grpc\n{line}\n\nX = {alias}.ListPodResourcesRequest\n"
    assert codegen.fix_imports(source) == (
        f"import grpc\nfrom . import api_pb2 as {alias}\n\nX = {alias}.ListPodResourcesRequest\n"
    )


def test_fix_imports_refuses_an_unexpected_module() -> None:
    with pytest.raises(codegen.CodegenError, match="found 0"):
        codegen.fix_imports("import grpc\n")


def test_check_reports_the_checked_out_package_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    assert codegen.main(["--check"]) == 0
    assert capsys.readouterr().out.strip() == "fresh"
