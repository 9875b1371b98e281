"""The rule comparison: tokens per step, confidence intervals, exact values and the plot."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specsample.compare import RULES, compare_rules, format_comparison, plot_comparison


def test_compare_reports_every_rule_with_its_exact_value() -> None:
    """Chain and block means lie within 4.5 half-widths of their exact values.

    A half-width is 1.96 standard errors, so 4.5 of them is 8.8 standard errors: a correct
    implementation fails with probability far below 1e-9 per comparison.
    """
    results = compare_rules(["random", "zipf"], [1, 3], rows=4000, vocab=8, seed=2)
    assert [r.rule for r in results[:4]] == list(RULES)
    for r in results:
        assert r.mean >= 1.0
        if r.rule in ("chain", "block"):
            assert abs(r.mean - r.theory) < 4.5 * r.half_width + 1e-9
        else:
            assert math.isnan(r.theory)
    table = format_comparison(results)
    assert "NOT exact" in table and "block" in table


def test_block_beats_chain_on_the_realistic_family() -> None:
    """Exact expectations on the Zipf family (vocab 8, k = 4): block > chain by over 3%."""
    results = compare_rules(["zipf"], [4], rows=200, vocab=8)
    chain, block = (r.theory for r in results if r.rule in ("chain", "block"))
    assert block > 1.03 * chain


def test_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = compare_rules(["peaked"], [1, 2], rows=300)
    out = plot_comparison(results, tmp_path / "rules.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="k must be"):
        compare_rules(["random"], [0])
    with pytest.raises(ValueError, match="rows"):
        compare_rules(["random"], [1], rows=1)


def test_compare_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specsample.cli import main

    pytest.importorskip("matplotlib")
    plot = tmp_path / "rules.png"
    status = main(
        ["compare", "--families", "random", "--k", "1", "2", "--rows", "500", "--plot", str(plot)]
    )
    assert status == 0
    out = capsys.readouterr().out
    assert "tokens/step" in out and plot.exists()
    assert main(["compare", "--families", "nope", "--k", "1", "--rows", "10"]) == 1
