"""Prompt lookup: a drafter without a model.

:class:`NGramDrafter` finds the most recent earlier occurrence of the longest suffix n-gram
of the sequence and proposes the tokens that followed it. Its drafts are one-hot, which
verification treats exactly whatever is proposed.
"""

from __future__ import annotations

import torch

from specsample.generate.drafters import Proposal
from specsample.generate.sampling import SamplingState
from specsample.generate.state import DecodeState, Prefill
from specsample.params.checks import check_int


class NGramDrafter:
    """Prompt lookup: propose what followed the latest earlier match of the sequence's suffix.

    For ``n`` from ``max_ngram`` down to ``min_ngram``, the last ``n`` committed tokens are
    searched for in the sequence's own earlier tokens (within the last ``window`` tokens);
    the most recent occurrence of the longest matching suffix wins and the ``k`` tokens that
    followed it are proposed. When the continuation runs into the suffix itself it is
    extended periodically. A greedy sequence without such a match looks in the run's other
    sequences, those in the batch and the last ones that finished (the same n-grams, in
    their first ``window`` tokens; the latest sequence with the longest match wins), as
    suffix decoding does: a greedy sequence's output is the target's argmax whatever the
    drafts, so this cannot change it (a sampled sequence's drafts come from its own tokens
    only, which its verification's random numbers never depend on). Without any match the
    last token is repeated. Everything runs as batched tensor operations, with no host
    synchronisation.

    Parameters
    ----------
    max_ngram, min_ngram : int
        Longest and shortest suffix tried, ``1 <= min_ngram <= max_ngram``.
    window : int
        How many of the latest tokens are searched.
    others : bool
        Let greedy sequences without a match of their own look in the other sequences.

    Examples
    --------
    >>> tokens = torch.tensor([[5, 6, 7, 8, 5, 6, 0, 0]])
    >>> state = DecodeState(tokens, torch.tensor([6]), 6, 10)
    >>> NGramDrafter().propose(state, 3, None).token_ids.tolist()
    [[7, 8, 5]]
    """

    name = "n-gram"
    samples = False
    costless = True

    def __init__(
        self, max_ngram: int = 3, min_ngram: int = 1, window: int = 1024, others: bool = True
    ) -> None:
        if not isinstance(others, bool):
            raise TypeError(f"others must be a bool, got {type(others).__name__}")
        self.others = others
        self.min_ngram = check_int("min_ngram", min_ngram, 1)
        self.max_ngram = check_int("max_ngram", max_ngram, 1)
        self.window = check_int("window", window, 1)
        if min_ngram > max_ngram:
            raise ValueError(
                f"min_ngram must be <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if window <= max_ngram:
            raise ValueError(f"window must exceed max_ngram ({max_ngram}), got {window}")
        self.name = f"n-gram ({min_ngram}..{max_ngram})"

    def start(self, prefill: Prefill, state: DecodeState) -> None:
        """Nothing to prepare."""

    def join(self, prefill: Prefill, state: DecodeState) -> None:
        """Nothing to prepare: the drafter reads the committed tokens."""

    def propose(self, state: DecodeState, k: int, sampling: SamplingState | None) -> Proposal:
        """Propose ``k`` tokens per sequence from its own history (``[batch, k]``, one-hot).

        ``sampling`` says which sequences are greedy (``None``: none is taken for greedy).
        The proposal's ``drafting`` tells which sequences found a match (the others repeat
        their last token).
        """
        width = min(self.window, state.max_length)
        cols = torch.arange(width, device=state.tokens.device)
        offset = (state.lengths - width).clamp_(min=0)
        tokens = state.tokens.gather(1, offset.unsqueeze(1) + cols)
        lengths = state.lengths - offset
        best = torch.full_like(lengths, -1)
        period = torch.ones_like(lengths)
        for n in range(self.min_ngram, min(self.max_ngram, width - 1) + 1):
            latest = _latest_start(tokens.unfold(1, n, 1), _suffix(tokens, lengths, n), lengths, n)
            found = latest >= 0
            best = torch.where(found, latest + n, best)
            period = torch.where(found, lengths - n - latest, period)
        borrow = None
        if self.others and sampling is not None and sampling.metadata.any_greedy:
            borrow = _Borrowed.find(state, self.min_ngram, self.max_ngram, self.window)
            borrow.rows &= sampling.metadata.greedy & (best < 0)
        drafting = best >= 0 if borrow is None else (best >= 0) | borrow.rows
        steps = torch.arange(k, device=tokens.device)
        follow = best.unsqueeze(1) + steps % period.clamp(min=1).unsqueeze(1)
        last = (lengths - 1).unsqueeze(1).expand(-1, k)
        index = torch.where((best >= 0).unsqueeze(1), follow, last)
        drafts = tokens.gather(1, index)
        if borrow is not None:
            drafts = torch.where(borrow.rows.unsqueeze(1), borrow.drafts(k), drafts)
        return Proposal(drafts, None, drafting)

    def update(self, num_accepted: torch.Tensor, state: DecodeState) -> None:
        """Nothing to update: the drafter reads the committed tokens."""

    def skip(self, state: DecodeState) -> None:
        """Nothing to update: the drafter reads the committed tokens."""

    def select(self, index: torch.Tensor) -> None:
        """Nothing to select."""


def _suffix(tokens: torch.Tensor, lengths: torch.Tensor, n: int) -> torch.Tensor:
    """``[batch, n]`` the last ``n`` of each row's ``lengths`` tokens (``tokens [batch, w]``)."""
    cols = torch.arange(n, device=tokens.device)
    return tokens.gather(1, ((lengths - n).unsqueeze(1) + cols).clamp_(min=0))


def _latest_start(
    windows: torch.Tensor, suffix: torch.Tensor, lengths: torch.Tensor, n: int
) -> torch.Tensor:
    """The latest start of ``suffix`` among ``windows`` with a token after it; -1 if none.

    ``windows [..., s, n]`` are the ``n``-grams of rows of ``lengths [...]`` tokens (start
    ``j`` counts when ``j + n`` is below the row's length) and ``suffix [..., n]`` broadcasts
    against them; returns ``[...]`` int64.
    """
    starts = torch.arange(windows.shape[-2], device=windows.device)
    ok = (windows == suffix.unsqueeze(-2)).all(dim=-1)
    ok &= starts + n < lengths.unsqueeze(-1)
    return torch.where(ok, starts, -1).amax(dim=-1)


class _Borrowed:
    """Where each sequence's suffix occurred last in the run's other sequences.

    Attributes
    ----------
    pool : torch.Tensor
        ``[p, width]`` int64: the finished sequences kept (see
        :attr:`~specsample.generate.state.DecodeState.finished`), then the active ones.
    lengths : torch.Tensor
        ``[p]`` int64 their lengths, at most ``width``.
    rows : torch.Tensor
        ``[batch]`` bool: the sequences whose suffix was found in another one.
    source, start : torch.Tensor
        ``[batch]`` int64: the pool row of that match and the column after it.
    """

    def __init__(
        self,
        pool: torch.Tensor,
        lengths: torch.Tensor,
        rows: torch.Tensor,
        source: torch.Tensor,
        start: torch.Tensor,
    ) -> None:
        self.pool, self.lengths = pool, lengths
        self.rows, self.source, self.start = rows, source, start

    @staticmethod
    def find(state: DecodeState, min_ngram: int, max_ngram: int, window: int) -> _Borrowed:
        """Search the suffixes of ``min_ngram..max_ngram`` tokens in the other sequences."""
        device = state.tokens.device
        width = min(max(state.max_length, state.finished_width), state.tokens.shape[1], window)
        pool, lengths = state.tokens[:, :width], state.lengths
        own = torch.arange(state.batch, device=device)
        if state.finished is not None and state.finished_lengths is not None:
            pool = torch.cat([state.finished[:, :width], pool])
            lengths = torch.cat([state.finished_lengths, lengths])
            own = own + state.finished.shape[0]
        lengths = lengths.clamp(max=width)
        sources = torch.arange(pool.shape[0], device=device)
        own_row = sources == own.unsqueeze(1)
        rows = torch.zeros(state.batch, dtype=torch.bool, device=device)
        source = torch.zeros(state.batch, dtype=torch.int64, device=device)
        start = torch.zeros_like(source)
        for n in range(min_ngram, min(max_ngram, width - 1) + 1):
            suffix = _suffix(state.tokens, state.lengths, n).unsqueeze(1)
            latest = _latest_start(pool.unfold(1, n, 1), suffix, lengths, n)
            latest.masked_fill_(own_row | (state.lengths < n).unsqueeze(1), -1)
            newest = torch.where(latest >= 0, sources, -1).amax(dim=1)
            found = newest >= 0
            after = latest.gather(1, newest.clamp(min=0).unsqueeze(1)).squeeze(1) + n
            rows |= found
            source = torch.where(found, newest, source)
            start = torch.where(found, after, start)
        return _Borrowed(pool, lengths, rows, source, start)

    def drafts(self, k: int) -> torch.Tensor:
        """``[batch, k]`` the tokens that followed each match (the source's last one repeated
        where it ends sooner)."""
        last = (self.lengths[self.source] - 1).clamp(min=0).unsqueeze(1)
        steps = torch.arange(k, device=self.start.device)
        index = torch.minimum(self.start.unsqueeze(1) + steps, last)
        return self.pool[self.source].gather(1, index)
