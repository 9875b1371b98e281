"""The active sequences and the queue of waiting prompts (:mod:`specsample.generate.batch`).

Continuous batching through the loop, on tiny random Llama models: a finished sequence's place
is refilled at once from the queue, and every output equals that prompt decoded alone (greedy
and seeded), with fixed and with adaptive draft lengths.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from specsample.generate import (
    ModelDrafter,
    NGramDrafter,
    speculative_generate,
    target_generate,
)
from tests.tiny_llama import PROMPTS


@pytest.mark.parametrize("drafter", ["model", "ngram", None])
def test_continuous_batching_refills_places_without_changing_outputs(pair, drafter) -> None:
    """Two places, six prompts of different lengths and budgets: each finished sequence is
    replaced at once, and every output equals that prompt decoded alone (greedy and seeded)."""
    target, draft = pair
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13], [5], [4, 9, 1, 2], [3, 3], [8, 1, 6, 2, 7]]
    budgets = [9, 3, 14, 1, 6, 11]
    temps = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    finished: list[int] = []

    def run(rows: list[int], **extra: Any) -> Any:
        common: dict[str, Any] = {
            "max_new_tokens": [budgets[i] for i in rows],
            "temperature": [temps[i] for i in rows],
            "seeds": [40 + i for i in rows],
            **extra,
        }
        chosen = [prompts[i] for i in rows]
        if drafter is None:
            return target_generate(target, chosen, **common)
        source = ModelDrafter(draft) if drafter == "model" else NGramDrafter()
        return speculative_generate(target, chosen, source, k=3, adaptive=False, **common)

    def on_finish(index: int, ids: list[int]) -> None:
        finished.append(index)
        assert len(ids) == budgets[index]

    out = run(list(range(6)), max_batch_size=2, on_finish=on_finish)
    assert sorted(finished) == list(range(6)) and finished != list(range(6))
    assert [len(s) for s in out.sequences] == budgets
    assert out.stats.sequences == 6 and out.stats.tokens == sum(budgets)
    for i in range(6):
        assert run([i]).sequences[0] == out.sequences[i]


def test_adaptive_draft_lengths_keep_greedy_outputs_under_continuous_batching(
    pair, greedy_reference
) -> None:
    target, draft = pair
    for source in (ModelDrafter(draft), NGramDrafter()):
        out = speculative_generate(
            target, PROMPTS, source, k=5, max_new_tokens=24, max_batch_size=2, adaptive=True
        )
        assert out.sequences == greedy_reference
        assert out.stats.tokens == sum(len(s) for s in out.sequences)
