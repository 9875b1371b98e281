"""The progress reporter of the commands (:mod:`specsample.cli.progress`)."""

from __future__ import annotations

import pytest

from specsample.cli.progress import PartsProgress, Progress


class _Bar:
    def __init__(self) -> None:
        self.postfixes: list[str] = []

    def set_postfix_str(self, text: str) -> None:
        self.postfixes.append(text)


def test_a_line_on_stderr_with_the_rate(capsys: pytest.CaptureFixture[str]) -> None:
    Progress("speculative", every=0.0)(2, 5, 40)
    captured = capsys.readouterr()
    assert captured.out == ""
    line = captured.err.strip()
    assert line.startswith("[speculative] 2/5 sequences done, 40 tokens, ")
    assert line.endswith(" tokens/s")


def test_the_bar_gets_the_rate_and_nothing_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    bar = _Bar()
    progress = Progress(every=0.0, bar=bar)
    progress(1, 3, 10)
    progress(2, 3, 20)
    assert len(bar.postfixes) == 2 and all(p.endswith(" tokens/s") for p in bar.postfixes)
    assert capsys.readouterr() == ("", "")


def test_reports_are_at_least_every_seconds_apart(capsys: pytest.CaptureFixture[str]) -> None:
    bar = _Bar()
    progress = Progress(every=3600.0, bar=bar)
    for finished in range(5):
        progress(finished, 5, finished * 10)
    assert bar.postfixes == []
    Progress("target-only", every=3600.0)(1, 2, 3)
    assert capsys.readouterr().err == ""


def test_parts_done_and_time_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    PartsProgress("compare", "points", every=0.0)(3, 20)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("[compare] 3/20 points done in ")
    assert captured.err.endswith(" s\n")
    PartsProgress("compare", "points", every=3600.0)(3, 20)
    assert capsys.readouterr().err == ""
