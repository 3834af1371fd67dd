"""`--plot` without matplotlib (an optional extra): exit 2 with how to install it, before
any read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuwatch.cli import main
from gpuwatch.plotting import PlotUnavailable, pyplot

INSTALL = (
    "gpuwatch: --plot needs matplotlib, which is not installed: pip install 'gpuwatch[plot]'\n"
)


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib as if not installed: `import matplotlib` raises ImportError."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--from", "-1d"],
        ["replay", "--pod", "ml/train-0", "--from", "-1h"],
        ["bench", "worker"],
    ],
    ids=["report", "replay", "bench-worker"],
)
@pytest.mark.usefixtures("no_matplotlib")
def test_plot_without_matplotlib_exits_2_saying_how_to_install_it(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "out.png"
    assert main([*argv, "--plot", str(png)]) == 2  # a read first would touch a socket: refused
    out, err = capsys.readouterr()
    assert (out, err) == ("", INSTALL)
    assert not png.exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_drawing_without_matplotlib_says_the_same() -> None:
    with pytest.raises(PlotUnavailable) as raised:
        pyplot()
    assert f"gpuwatch: {raised.value}\n" == INSTALL


def test_with_matplotlib_the_backend_draws_files_only() -> None:
    assert pyplot().get_backend().lower() == "agg"
