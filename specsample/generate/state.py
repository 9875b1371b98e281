"""What the decoding loop keeps per active sequence: the committed tokens.

:class:`DecodeState` holds the committed tokens of the active sequences (and the last ones
that finished); :class:`Prefill` is the first forward of each model. Their sampling
parameters are kept apart (:class:`specsample.generate.sampling.SamplingState`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

FINISHED_KEPT = 16
"""Finished sequences a run keeps the tokens of (see :attr:`DecodeState.finished`)."""


@dataclass
class DecodeState:
    """The committed tokens of the active sequences, as the decoding loop keeps them.

    Attributes
    ----------
    tokens : torch.Tensor
        ``[batch, capacity]`` int64: sequence ``i`` holds its prompt and generated tokens in
        columns ``0 .. lengths[i] - 1``; later columns hold stale values.
    lengths : torch.Tensor
        ``[batch]`` int64 number of committed tokens (prompt included): the absolute position
        of the step's first draft.
    max_length : int
        Host-side upper bound of ``lengths``.
    vocab_size : int
        Width of the target's logits; every draft id must lie in ``[0, vocab_size)``.
    finished : torch.Tensor or None
        ``[f, capacity]`` int64 the tokens of the last (at most :data:`FINISHED_KEPT`)
        sequences of the run that finished, oldest first; ``None`` before the first one.
    finished_lengths : torch.Tensor or None
        ``[f]`` int64 their lengths.
    finished_width : int
        Host-side upper bound of ``finished_lengths``.

    Examples
    --------
    >>> state = DecodeState(torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([3, 2]), 3, 10)
    >>> state.batch, state.last_tokens().tolist()
    (2, [6, 8])
    >>> state.archive(state.tokens[1:], state.lengths[1:], 2); state.finished.tolist()
    [[7, 8, 0]]
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    max_length: int
    vocab_size: int
    finished: torch.Tensor | None = None
    finished_lengths: torch.Tensor | None = None
    finished_width: int = 0

    @property
    def batch(self) -> int:
        """Number of active sequences."""
        return int(self.tokens.shape[0])

    def last_tokens(self) -> torch.Tensor:
        """``[batch]`` int64 the last committed token of every sequence."""
        return self.tokens.gather(1, (self.lengths - 1).unsqueeze(1)).squeeze(1)

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences at ``index`` (``[kept]`` int64), in that order."""
        self.tokens = self.tokens[index]
        self.lengths = self.lengths[index]

    def archive(self, tokens: torch.Tensor, lengths: torch.Tensor, longest: int) -> None:
        """Keep the ``tokens [f, capacity]`` and ``lengths [f]`` of sequences that finished.

        ``longest`` is a host-side upper bound of ``lengths``. Only the last
        :data:`FINISHED_KEPT` finished sequences are kept.
        """
        if self.finished is not None and self.finished_lengths is not None:
            tokens = torch.cat([self.finished, tokens])
            lengths = torch.cat([self.finished_lengths, lengths])
        self.finished, self.finished_lengths = tokens[-FINISHED_KEPT:], lengths[-FINISHED_KEPT:]
        self.finished_width = max(self.finished_width, longest)


class Prefill(NamedTuple):
    """The prompts without their last token, left-padded, for the first forward of each model.

    Attributes
    ----------
    input_ids, attention_mask, position_ids : torch.Tensor
        ``[batch, width]`` int64; ``width`` may be 0 (every prompt has one token).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
