"""Generates the PodResources modules (api_pb2.py, .pyi, api_pb2_grpc.py) from api.proto.

Run as `python -m producers.podresources.codegen` (`make install` does) or load this
file by path from a setuptools build hook: it imports nothing of gpuwatch, so it works
before the package is importable. The outputs are build artefacts, never committed.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["OUTPUT_NAMES", "CodegenError", "generate", "is_fresh", "main"]

logger = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO_NAME = "api.proto"
OUTPUT_NAMES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
GRPC_MODULE = "api_pb2_grpc.py"

# protoc writes `import api_pb2 as api__pb2` (proto compiled from its own folder) or
# `from producers.podresources import api_pb2 as ...` (from the repository root);
# either becomes a relative import so the package works wherever it is installed.
_MESSAGES_IMPORT = re.compile(r"^(?:from [\w.]+ )?import api_pb2 as (\w+)$", re.MULTILINE)


class CodegenError(RuntimeError):
    """The modules could not be generated (grpcio-tools missing or protoc failed)."""


def is_fresh(package_dir: Path = PACKAGE_DIR) -> bool:
    """True when every output exists and is at least as new as the proto."""
    proto_mtime = (package_dir / PROTO_NAME).stat().st_mtime
    try:
        return all((package_dir / n).stat().st_mtime >= proto_mtime for n in OUTPUT_NAMES)
    except FileNotFoundError:
        return False


def fix_imports(grpc_source: str) -> str:
    """The generated grpc module with its import of the messages made package-relative."""
    fixed, count = _MESSAGES_IMPORT.subn(r"from . import api_pb2 as \1", grpc_source)
    if count != 1:
        raise CodegenError(f"expected one import of api_pb2 in {GRPC_MODULE}, found {count}")
    return fixed


def generate(package_dir: Path = PACKAGE_DIR, *, force: bool = False) -> bool:
    """Write the outputs next to the proto unless they are fresh; True when written.

    protoc runs from the directory above the `producers` package so the proto is
    registered as `producers/podresources/api.proto`, a name no other library's
    descriptors can clash with. Outputs go to a temporary folder first and are moved
    into place one by one, so a failed run leaves the previous outputs intact.
    """
    proto = package_dir / PROTO_NAME
    if not force and is_fresh(package_dir):
        logger.debug("podresources codegen skipped: outputs fresh dir=%s", package_dir)
        return False
    include_root = package_dir.parent.parent
    relative = proto.relative_to(include_root)
    with tempfile.TemporaryDirectory(prefix="gpuwatch-codegen-") as tmp:
        _run_protoc(include_root, relative, Path(tmp))
        produced = Path(tmp) / relative.parent
        grpc_module = produced / GRPC_MODULE
        grpc_module.write_text(fix_imports(grpc_module.read_text()))
        for name in OUTPUT_NAMES:
            os.replace(produced / name, package_dir / name)
    logger.info("podresources codegen wrote outputs=%s dir=%s", ",".join(OUTPUT_NAMES), package_dir)
    return True


def _run_protoc(include_root: Path, proto: Path, out: Path) -> None:
    """Run grpc_tools.protoc in a child process so its errors can be reported."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or spec.origin is None:
        raise CodegenError("grpcio-tools is not installed: pip install grpcio-tools")
    well_known = Path(spec.origin).parent / "_proto"
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={include_root}",
        f"--proto_path={well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(proto),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CodegenError(f"protoc failed rc={result.returncode}: {result.stderr.strip()}")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: generate (or with --check only report) the PodResources modules."""
    parser = argparse.ArgumentParser(prog="python -m producers.podresources.codegen")
    parser.add_argument("--force", action="store_true", help="regenerate even when fresh")
    parser.add_argument("--check", action="store_true", help="exit 1 when outputs are stale")
    args = parser.parse_args(argv)
    if args.check:
        fresh = is_fresh()
        print("fresh" if fresh else "stale: run `python -m producers.podresources.codegen`")
        return 0 if fresh else 1
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    try:
        generate(force=args.force)
    except CodegenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
