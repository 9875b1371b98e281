"""The ``specsample`` command line (:mod:`specsample.cli`): help, usage and runtime errors.

Covers :mod:`specsample.cli` and its shared argument helpers, :mod:`specsample.cli.args`.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from specsample.cli import main


def test_main_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: specsample" in out and "demo" in out and "bench" in out
    assert main(["bench", "--help"]) == 0
    assert "--quick" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["bench", "--shapes", "8x4"],
        ["bench", "--repeats", "0"],
        ["demo", "--alpha", "2"],
    ],
)
def test_usage_errors_exit_two(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_runtime_errors_are_one_clean_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--shapes", "2x2x64", "--device", "meta"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "specsample bench: error: the benchmark runs on cpu or cuda, got meta"


def test_python_dash_m_specsample() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specsample", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "usage: specsample" in done.stdout
