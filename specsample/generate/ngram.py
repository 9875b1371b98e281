"""Prompt lookup: a drafter without a model.

:class:`NGramDrafter` finds the most recent earlier occurrence of the longest suffix n-gram
of the sequence and proposes the tokens that followed it. Its drafts are one-hot, which
verification treats exactly whatever is proposed.
"""

from __future__ import annotations

import torch

from specsample.generate.drafters import Proposal
from specsample.generate.state import DecodeState, Prefill, SamplingState


def _check_int(label: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{label} must be an int, got {type(value).__name__}")
    return value


class NGramDrafter:
    """Prompt lookup: propose what followed the latest earlier match of the sequence's suffix.

    For ``n`` from ``max_ngram`` down to ``min_ngram``, the last ``n`` committed tokens are
    searched for in the sequence's own earlier tokens (within the last ``window`` tokens);
    the most recent occurrence of the longest matching suffix wins and the ``k`` tokens that
    followed it are proposed. When the continuation runs into the suffix itself it is
    extended periodically. Without a match the last token is repeated. Everything runs as
    batched tensor operations, with no host synchronisation.

    Parameters
    ----------
    max_ngram, min_ngram : int
        Longest and shortest suffix tried, ``1 <= min_ngram <= max_ngram``.
    window : int
        How many of the latest tokens are searched.

    Examples
    --------
    >>> tokens = torch.tensor([[5, 6, 7, 8, 5, 6, 0, 0]])
    >>> state = DecodeState(tokens, torch.tensor([6]), 6, 10)
    >>> NGramDrafter().propose(state, 3, None).token_ids.tolist()
    [[7, 8, 5]]
    """

    name = "n-gram"
    samples = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, window: int = 1024) -> None:
        self.max_ngram = _check_int("max_ngram", max_ngram)
        self.min_ngram = _check_int("min_ngram", min_ngram)
        self.window = _check_int("window", window)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                "need 1 <= min_ngram <= max_ngram, "
                f"got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if window <= max_ngram:
            raise ValueError(f"window must exceed max_ngram ({max_ngram}), got {window}")
        self.name = f"n-gram ({min_ngram}..{max_ngram})"

    def start(self, prefill: Prefill, state: DecodeState) -> None:
        """Nothing to prepare."""

    def join(self, prefill: Prefill, state: DecodeState) -> None:
        """Nothing to prepare: the drafter reads the committed tokens."""

    def propose(
        self,
        state: DecodeState,
        k: int,
        sampling: SamplingState | None,
        may_stop: bool = False,
    ) -> Proposal:
        """Propose ``k`` tokens per sequence from its own history (``[batch, k]``, one-hot).

        With ``may_stop``, nothing (``[batch, 0]``) when no sequence found a match (one host
        synchronisation): the step is then a plain decoding step.
        """
        width = min(self.window, state.max_length)
        cols = torch.arange(width, device=state.tokens.device)
        offset = (state.lengths - width).clamp_(min=0)
        tokens = state.tokens.gather(1, offset.unsqueeze(1) + cols)
        lengths = state.lengths - offset
        best = torch.full_like(lengths, -1)
        period = torch.ones_like(lengths)
        for n in range(self.min_ngram, min(self.max_ngram, width - 1) + 1):
            windows = tokens.unfold(1, n, 1)
            suffix = tokens.gather(1, ((lengths - n).unsqueeze(1) + cols[:n]).clamp_(min=0))
            starts = cols[: windows.shape[1]]
            ok = (windows == suffix.unsqueeze(1)).all(dim=-1)
            ok &= starts + n < lengths.unsqueeze(1)
            latest = torch.where(ok, starts, -1).amax(dim=1)
            found = latest >= 0
            best = torch.where(found, latest + n, best)
            period = torch.where(found, lengths - n - latest, period)
        if may_stop and not bool((best >= 0).any()):
            k = 0
        steps = torch.arange(k, device=tokens.device)
        follow = best.unsqueeze(1) + steps % period.clamp(min=1).unsqueeze(1)
        last = (lengths - 1).unsqueeze(1).expand(-1, k)
        index = torch.where((best >= 0).unsqueeze(1), follow, last)
        return Proposal(tokens.gather(1, index), None)

    def update(self, num_accepted: torch.Tensor, state: DecodeState) -> None:
        """Nothing to update: the drafter reads the committed tokens."""

    def skip(self, state: DecodeState) -> None:
        """Nothing to update: the drafter reads the committed tokens."""

    def select(self, index: torch.Tensor) -> None:
        """Nothing to select."""
