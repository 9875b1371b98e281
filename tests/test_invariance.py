"""Speculation that never changes the text: with ``method="gumbel"`` a seeded sequence is the
one :func:`target_generate` gives for the same seed, token for token.

Whatever the drafter (draft model or n-gram), the draft length (fixed or adaptive), the order
of the prompts, the batch they share and the thread count. On the tiny float64 pair of
``tests.tiny_llama`` (where no near-tie can flip between batch shapes) and on the shipped
default pair (float32, whose fused forward gives the same logits for a position whatever
the batch shape).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample import adapter  # noqa: E402
from specsample.generate import NGramDrafter, speculative_generate, target_generate  # noqa: E402
from tests.tiny_llama import PROMPTS  # noqa: E402

SAMPLINGS = {
    "T=1": {"temperature": 1.0},
    "T=0.8, top-p 0.9, top-k 50": {"temperature": 0.8, "top_p": 0.9, "top_k": 50},
}
SEEDS = [101, 102, 103, 104, 105]


def _drafter(kind: str, draft: Any) -> Any:
    return draft if kind == "model" else NGramDrafter()


@pytest.fixture(scope="module")
def tiny_reference(pair: tuple[Any, Any]) -> dict[str, list[list[int]]]:
    return {
        name: target_generate(pair[0], PROMPTS, max_new_tokens=24, seeds=SEEDS, **options).sequences
        for name, options in SAMPLINGS.items()
    }


@pytest.mark.parametrize("name", SAMPLINGS)
@pytest.mark.parametrize("kind", ["model", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_speculation_gives_the_target_only_text(
    pair: tuple[Any, Any], tiny_reference: dict[str, Any], name: str, kind: str, k: int
) -> None:
    out = speculative_generate(
        pair[0],
        PROMPTS,
        _drafter(kind, pair[1]),
        k=k,
        adaptive=False,
        method="gumbel",
        max_new_tokens=24,
        seeds=SEEDS,
        **SAMPLINGS[name],
    )
    assert out.sequences == tiny_reference[name]


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_adaptive_draft_lengths_and_shared_batches_give_the_same_text(
    pair: tuple[Any, Any], tiny_reference: dict[str, Any], kind: str
) -> None:
    order = [3, 0, 4, 2, 1]
    out = speculative_generate(
        pair[0],
        [PROMPTS[i] for i in order],
        _drafter(kind, pair[1]),
        k=6,
        method="gumbel",
        max_new_tokens=24,
        seeds=[SEEDS[i] for i in order],
        max_batch_size=2,
        temperature=1.0,
    )
    assert out.sequences == [tiny_reference["T=1"][i] for i in order]


def test_the_thread_count_does_not_change_the_text(
    pair: tuple[Any, Any], tiny_reference: dict[str, Any]
) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = speculative_generate(
            pair[0],
            PROMPTS,
            pair[1],
            k=4,
            method="gumbel",
            max_new_tokens=24,
            seeds=SEEDS,
            temperature=1.0,
        )
    finally:
        torch.set_num_threads(before)
    assert out.sequences == tiny_reference["T=1"]


def test_unseeded_prompts_keep_target_only_decoding_as_it_was(pair: tuple[Any, Any]) -> None:
    """Without seeds target-only decoding draws as the chain rule does (its generator's
    numbers, inverse CDF); a seed switches it to the keyed Gumbel-max."""

    def run(**options: Any) -> list[list[int]]:
        generator = torch.Generator().manual_seed(3)
        return target_generate(
            pair[0], PROMPTS, max_new_tokens=12, temperature=1.0, generator=generator, **options
        ).sequences

    assert run() == run()
    chain = speculative_generate(
        pair[0], PROMPTS, pair[1], k=1, max_new_tokens=12, temperature=1.0, seeds=SEEDS
    )
    assert run(seeds=SEEDS) != chain.sequences


def test_a_tree_run_refuses_gumbel(pair: tuple[Any, Any]) -> None:
    from specsample.generate import TreeShape

    with pytest.raises(ValueError, match="gumbel"):
        speculative_generate(
            pair[0], PROMPTS, pair[1], tree=TreeShape.build([2, 1]), method="gumbel"
        )


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    dirs = adapter.default_pair()
    if dirs is None:
        pytest.fail("the default model pair is not installed")
    tokenizer = adapter.load_tokenizer(dirs[0])
    prompts = ["def parse(text):", "class Node:\n    def __init__(self, value):", "    for"]
    return {
        "prompts": [tokenizer.encode(p) for p in prompts],
        "target": adapter.load_model(dirs[0], role="target"),
        "draft": adapter.load_model(dirs[1], role="draft"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLINGS)
def test_the_shipped_pair_gives_the_target_only_text_whatever_the_drafter(
    shipped: dict[str, Any], name: str
) -> None:
    target, prompts = shipped["target"], shipped["prompts"]
    options = {"max_new_tokens": 32, "seeds": SEEDS[:3], **SAMPLINGS[name]}
    reference = target_generate(target, prompts, **options).sequences
    for kind in ("model", "ngram"):
        drafter = _drafter(kind, shipped["draft"])
        for k in range(1, 9):
            out = speculative_generate(
                target, prompts, drafter, k=k, adaptive=False, method="gumbel", **options
            )
            assert out.sequences == reference, (kind, k)
        out = speculative_generate(
            target,
            prompts[::-1],
            drafter,
            k=8,
            method="gumbel",
            **{**options, "seeds": SEEDS[:3][::-1]},
        )
        assert out.sequences == reference[::-1], (kind, "adaptive, reversed")
