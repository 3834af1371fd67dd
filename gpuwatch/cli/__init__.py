"""The `gpuwatch` command line: `main` is the console script, one module per verb."""

from gpuwatch.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
