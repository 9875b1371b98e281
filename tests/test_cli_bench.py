"""``specsample bench`` (:mod:`specsample.cli.bench`), on a tiny shape.

Nothing here asserts on timings; the cache flush is shrunk to 1 MiB.
"""

from __future__ import annotations

import argparse

import pytest

from specsample.bench import runner
from specsample.cli import main
from specsample.cli.bench import parse_shape


@pytest.fixture
def small_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "cache_flush_bytes", lambda device: 2**20)


def test_parse_shape() -> None:
    assert parse_shape("8x4x32000") == (8, 4, 32000)
    assert parse_shape("1X1X2") == (1, 1, 2)
    for bad in ("8x4", "8x4x-1", "axbxc", "8x0x10", "8x4x1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shape(bad)


def test_main_bench_on_a_tiny_shape(small_flush: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--shapes", "2x2x64", "--repeats", "1"]) == 0
    captured = capsys.readouterr()
    assert "cold caches" in captured.out and "[1/1] batch=2" in captured.err
