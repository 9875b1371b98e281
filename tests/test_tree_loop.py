"""Tree drafting in the generation loop, on tiny random models: shapes and rules.

Covers :mod:`specsample.generate.tree` (the static tree shape, its node layout and how
children are drawn) in the loop.

The end-to-end exactness of tree drafting (the two-token chi-square test, greedy identity on
the shipped pair) is in ``tests/test_default_pair_e2e.py``; here every drafting mode and rule
runs on small float64 Llama models built in the test, where greedy output must equal
target-only greedy output token for token.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample.generate import (  # noqa: E402
    NGramDrafter,
    TreeShape,
    speculative_generate,
    target_generate,
)
from specsample.generate.tree import TreeLayout  # noqa: E402

PROMPTS = [[3, 7, 1, 9, 4, 2, 8], [5, 5, 6, 1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11]]


def _tiny(seed: int, layers: int = 2, noise: float = 0.0, context: int = 2048) -> Any:
    """A tiny random float64 Llama (vocabulary 64, ``context`` positions); ``noise`` perturbs
    a copy of seed 0."""
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(
        "llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
    )
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(6.0).add_(noise * torch.randn_like(parameter))
    return model


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    """A target and a draft close to it (so trees get accepted nodes at every depth)."""
    return _tiny(0), _tiny(0, noise=0.3)


@pytest.mark.parametrize("drafting", ["iid", "without_replacement", "deterministic"])
@pytest.mark.parametrize("branching", [(2,), (2, 1, 1), (3, 2, 1)])
def test_greedy_tree_output_equals_target_greedy(
    pair: tuple[Any, Any], drafting: str, branching: tuple[int, ...]
) -> None:
    """Greedy tree decoding, two places for three prompts, equals target-only greedy output."""
    target, draft = pair
    expected = target_generate(target, PROMPTS, max_new_tokens=24).sequences
    out = speculative_generate(
        target,
        PROMPTS,
        draft,
        tree=TreeShape.build(branching, drafting),
        max_new_tokens=24,
        max_batch_size=2,
    )
    assert out.sequences == expected
    assert out.stats.tokens_per_forward > 1.0


@pytest.mark.parametrize(
    ("drafting", "method"),
    [
        ("iid", "chain"),
        ("iid", "traversal"),
        ("without_replacement", "rrs"),
        ("deterministic", "onehot"),
    ],
)
def test_sampled_tree_runs_are_reproducible_and_reach_the_budget(
    pair: tuple[Any, Any], drafting: str, method: str
) -> None:
    """Seeded sampled tree runs give the same tokens twice and stop at their budgets."""
    target, draft = pair
    runs = [
        speculative_generate(
            target,
            PROMPTS,
            draft,
            tree=TreeShape.build((2, 1, 1), drafting),
            method=method,
            temperature=1.0,
            seeds=5,
            max_new_tokens=[20, 7, 13],
            max_batch_size=2,
        )
        for _ in range(2)
    ]
    assert runs[0].sequences == runs[1].sequences
    assert [len(s) for s in runs[0].sequences] == [20, 7, 13]


@pytest.mark.parametrize("method", ["chain", "traversal"])
def test_tree_runs_reach_the_end_of_the_context(method: str) -> None:
    """Where no tree fits before the context ends, the steps left are plain decoding steps:
    greedy output equals target-only greedy output up to the last position, and sampled
    runs reach it too."""
    target, draft = _tiny(0, context=24), _tiny(0, noise=0.3, context=24)
    tree = TreeShape.build((2, 1, 1), "iid")
    expected = target_generate(target, PROMPTS, max_new_tokens=64).sequences
    assert [len(p) + len(e) for p, e in zip(PROMPTS, expected, strict=True)] == [24] * 3
    greedy = speculative_generate(target, PROMPTS, draft, tree=tree, max_new_tokens=64)
    assert greedy.sequences == expected
    sampled = speculative_generate(
        target,
        PROMPTS,
        draft,
        tree=tree,
        method=method,
        temperature=1.0,
        seeds=1,
        max_new_tokens=64,
    )
    assert [len(s) for s in sampled.sequences] == [len(s) for s in expected]


def test_tree_options_are_refused_where_they_cannot_apply(pair: tuple[Any, Any]) -> None:
    """A tree without a draft model, a biased rule, or a malformed shape is named."""
    target, draft = pair
    with pytest.raises(ValueError, match="needs a draft model"):
        speculative_generate(target, PROMPTS, NGramDrafter(), tree=TreeShape((2,)))
    with pytest.raises(ValueError, match="traversal"):
        speculative_generate(
            target, PROMPTS, draft, tree=TreeShape((2,), "deterministic"), method="traversal"
        )
    with pytest.raises(TypeError, match="TreeShape"):
        speculative_generate(target, PROMPTS, draft, tree=(2, 1))  # type: ignore[arg-type]
    for branching, error in (([], ValueError), ([0], ValueError), ([9, 9], ValueError)):
        with pytest.raises(error):
            TreeShape.build(branching)


def test_layout_numbers_nodes_level_by_level() -> None:
    """Parents precede children, each level is contiguous, nodes see their ancestors only."""
    layout = TreeLayout.build(TreeShape((2, 2)), torch.device("cpu"))
    assert layout.parents.tolist() == [-1, 0, 0, 1, 1, 2, 2]
    assert layout.levels == ((1, 3), (3, 7))
    assert layout.visible[5].tolist() == [True, False, True, False, False, True, False]
