"""The rule comparison: tokens per step, confidence intervals, exact values and the plot.

Covers :mod:`specsample.testing.compare`, :mod:`specsample.testing.exact_values` and the
``specsample compare`` command, :mod:`specsample.cli.compare`.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from specsample.rules.tree import check_traversal, traversal_expected_tokens
from specsample.testing import make_family
from specsample.testing.compare import RULES, compare_rules, format_comparison, plot_comparison


def test_compare_reports_every_rule_with_its_exact_value() -> None:
    """Every mean with an exact value lies within 4.5 half-widths of it.

    A half-width is 1.96 standard errors, so 4.5 of them is 8.8 standard errors: a correct
    implementation fails with probability far below 1e-9 per comparison. The exact value is
    missing only for typical acceptance (lossy).
    """
    results = compare_rules(["random", "zipf"], [1, 3], rows=4000, vocab=8, seed=2)
    assert [r.rule for r in results[: len(RULES)]] == list(RULES)
    assert RULES == ("chain", "block", "gumbel", "mss", "traversal", "typical")
    for r in results:
        assert r.mean >= 1.0
        unknown = r.rule == "typical"
        assert math.isnan(r.theory) == unknown, (r.rule, r.k)
        if not unknown:
            assert abs(r.mean - r.theory) < 4.5 * r.half_width + 1e-9, (r.rule, r.k)
    table = format_comparison(results)
    assert "NOT exact" in table and "block" in table and "traversal" in table


def test_tree_rules_exact_values() -> None:
    """The exact values of the tree rules, cross-checked.

    With one child per node the tree is a chain: MSS is token-by-token verification and
    traversal is block verification, so their exact values (a recursion and an enumeration
    of trees) match :meth:`specsample.testing.Family.accepted_length_law` to 1e-12. On
    binary trees traversal beats MSS, exactly.
    """
    chains = compare_rules(["markov"], [3], rows=200, vocab=5, branching=1)
    theory = {r.rule: r.theory for r in chains}
    assert abs(theory["mss"] - theory["chain"]) < 1e-12
    assert abs(theory["traversal"] - theory["block"]) < 1e-12
    assert theory["block"] > theory["chain"] + 1e-3
    for name in ("markov", "zipf"):
        trees = {r.rule: r.theory for r in compare_rules([name], [2], rows=200, vocab=6)}
        assert trees["traversal"] > trees["mss"] + 1e-3, name


def test_traversal_exact_value_is_the_enumeration() -> None:
    """The recursion behind traversal's exact value equals the average, over all 3**6 binary
    trees of depth 2 with their drafting probability, of the library's exact per-tree
    expectation (:func:`specsample.rules.tree.traversal_expected_tokens`), to 1e-12."""
    family = make_family("markov", k=2, vocab=3, seed=4)
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 2])
    depth = torch.tensor([0, 1, 1, 2, 2, 2, 2])
    q = family.reference()
    p = family.draft.to(torch.float64)
    p = p / p.sum(-1, keepdim=True)
    trees = torch.tensor([[family.start, *t] for t in itertools.product(range(3), repeat=6)])
    above = trees[:, parents[1:]]
    chance = p[depth[parents[1:]], above, trees[:, 1:]].prod(dim=-1)
    expected = traversal_expected_tokens(
        check_traversal(q[depth, trees], trees, parents, "iid", p[depth.clamp(max=1), trees])
    )
    (result,) = (r for r in compare_rules(["markov"], [2], rows=2, vocab=3, seed=4)
                 if r.rule == "traversal")  # fmt: skip
    assert abs(float((chance * expected).sum()) - result.theory) < 1e-12


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
    assert main(["compare", "--families", "nope", "--k", "1", "--rows", "10"]) == 2


def test_compare_reports_progress() -> None:
    """``on_progress(done, total)`` after each family and draft length."""
    seen: list[tuple[int, int]] = []
    compare_rules(["random", "markov"], [1, 2], rows=50, on_progress=lambda *a: seen.append(a))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
