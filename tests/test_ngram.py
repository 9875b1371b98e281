"""Prompt lookup (:mod:`specsample.generate.ngram`): the n-gram drafter's proposals.

On hand-built token rows: the continuation of the longest suffix seen before, the last token
repeated where nothing matches, the window, greedy rows borrowing from other rows and from
finished sequences (sampled rows never do), and the argument checks.
"""

from __future__ import annotations

import pytest
import torch

from specsample.generate import (
    DecodeState,
    NGramDrafter,
    SamplingState,
)
from specsample.params import SamplingParams


def test_ngram_proposals() -> None:
    tokens = torch.tensor(
        [
            [5, 6, 7, 8, 5, 6, 0, 0, 0, 0],
            [1, 2, 1, 2, 1, 0, 0, 0, 0, 0],
            [9, 8, 7, 0, 0, 0, 0, 0, 0, 0],
            [4, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ]
    )
    state = DecodeState(tokens, torch.tensor([6, 5, 3, 1]), 6, 10)
    proposal = NGramDrafter().propose(state, 4, None)
    assert proposal.probs is None
    assert proposal.token_ids.tolist() == [
        [7, 8, 5, 6],  # "5 6" seen at 0: what followed, then periodically
        [2, 1, 2, 1],  # "1 2 1" seen at 0
        [7, 7, 7, 7],  # no match: the last token repeated
        [4, 4, 4, 4],
    ]
    windowed = NGramDrafter(max_ngram=2, window=4).propose(state, 2, None)
    assert windowed.token_ids.tolist()[0] == [6, 6]
    with pytest.raises(ValueError, match="min_ngram"):
        NGramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(TypeError, match="window"):
        NGramDrafter(window=2.5)  # type: ignore[arg-type]


def test_greedy_sequences_without_a_match_borrow_from_the_others() -> None:
    """A greedy row whose suffix never occurred in its own tokens takes what followed it in
    another row, or in a finished sequence; a sampled row never does."""
    tokens = torch.tensor(
        [
            [9, 8, 7, 0, 0, 0, 0, 0],
            [3, 8, 7, 6, 5, 4, 0, 0],
            [1, 2, 0, 0, 0, 0, 0, 0],
        ]
    )
    state = DecodeState(tokens, torch.tensor([3, 6, 2]), 6, 10)
    cpu = torch.device("cpu")
    greedy = SamplingState.build(3, cpu, SamplingParams(temperature=[0.0, 0.0, 0.0]))
    sampled = SamplingState.build(
        3, cpu, SamplingParams(temperature=[1.0, 0.0, 0.0], seeds=[0, 1, 2])
    )
    proposal = NGramDrafter().propose(state, 3, greedy)
    assert proposal.token_ids.tolist()[0] == [6, 5, 4]  # "8 7" found in row 1
    assert proposal.token_ids.tolist()[2] == [2, 2, 2]  # "2" found nowhere else
    assert NGramDrafter().propose(state, 3, sampled).token_ids.tolist()[0] == [7, 7, 7]
    assert NGramDrafter(others=False).propose(state, 3, greedy).token_ids.tolist()[0] == [7, 7, 7]
    state.archive(state.tokens[1:2], state.lengths[1:2], 6)
    state.select(torch.tensor([0, 2]))
    state.max_length = 3
    kept = NGramDrafter().propose(state, 4, greedy.rows([0, 2]))
    assert kept.token_ids.tolist()[0] == [6, 5, 4, 4]  # from the finished row, then its end
    with pytest.raises(TypeError, match="others"):
        NGramDrafter(others=1)  # type: ignore[arg-type]
