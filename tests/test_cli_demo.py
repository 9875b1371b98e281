"""``specsample demo`` (:mod:`specsample.cli.demo`), on few rows and a tiny speed table."""

from __future__ import annotations

import pytest

from specsample.bench import runner
from specsample.cli import demo, main


@pytest.fixture
def small_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "cache_flush_bytes", lambda device: 2**20)


def test_demo_reports_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "3000", "--k", "2", "--no-speed"]) == 0
    out = capsys.readouterr().out
    for name in demo.FAMILIES:
        assert f"exactness of family {name!r}" in out
    assert f"{len(demo.FAMILIES)}/{len(demo.FAMILIES)} families passed" in out


def test_demo_speed_table(
    small_flush: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "SPEED_SHAPES", ((2, 2, 64),))
    monkeypatch.setattr(demo, "FAMILIES", ("equal",))
    assert main(["demo", "--rows", "500", "--k", "1"]) == 0
    out = capsys.readouterr().out
    assert "exactness of family 'equal'" in out and "cold caches" in out
