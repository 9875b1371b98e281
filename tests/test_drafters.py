"""Drafters (:mod:`specsample.generate.drafters`): a draft model's vocabulary against the target's.

A draft model with a smaller vocabulary is refused before it runs; one with a larger
vocabulary (a padded embedding table) proposes target tokens only, and greedy output is
unchanged. Both drafters (:class:`ModelDrafter` and :class:`NGramDrafter`) drive the loop's
tests in ``tests/test_loop.py`` and ``tests/test_batch.py``; the n-gram drafter's proposals
are tested in ``tests/test_ngram.py``.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample.generate import (  # noqa: E402
    ModelDrafter,
    speculative_generate,
)
from tests.tiny_llama import PROMPTS, VOCAB, llama_config  # noqa: E402


def test_a_draft_with_a_smaller_vocabulary_is_refused_before_it_runs(pair) -> None:
    torch.manual_seed(1)
    small = transformers.LlamaForCausalLM(llama_config(1, vocab_size=VOCAB - 8)).eval().double()
    calls: list[int] = []
    small.register_forward_hook(lambda *args: calls.append(1))
    message = f"vocabulary has {VOCAB - 8} tokens but the target's has {VOCAB}"
    with pytest.raises(ValueError, match=message):
        speculative_generate(pair[0], [[1, 2, VOCAB - 1]], small, k=2)
    assert calls == []
    with pytest.raises(ValueError, match=message):
        speculative_generate(pair[0], [[1, 2]], ModelDrafter(small), k=2)


def test_a_draft_with_a_larger_vocabulary_proposes_target_tokens_only(
    pair, greedy_reference
) -> None:
    """Extra draft logits (a padded embedding table) are dropped: the output is unchanged."""
    torch.manual_seed(1)
    big = transformers.LlamaForCausalLM(llama_config(1, vocab_size=VOCAB + 8)).eval().double()
    out = speculative_generate(pair[0], PROMPTS[:2], big, k=3, max_new_tokens=24)
    assert out.sequences == greedy_reference[:2]
    sampled = speculative_generate(
        pair[0], PROMPTS[:2], big, k=3, temperature=1.0, max_new_tokens=24, seeds=2
    )
    assert all(max(s) < VOCAB for s in sampled.sequences)
