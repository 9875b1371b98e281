"""Drafters: what proposes the ``k`` tokens the target then verifies in one forward.

Every drafter implements the small :class:`Drafter` protocol. The decoding loop
(:mod:`specsample.generate.loop`) owns the committed tokens of every sequence
(:class:`~specsample.generate.state.DecodeState`) and the sampling parameters
(:class:`~specsample.generate.state.SamplingState`); a drafter reads them, proposes ``k``
tokens per active sequence and, when it samples them, returns the exact distributions it
sampled from. Two drafters are provided:

* :class:`ModelDrafter`: a small causal LM with its own KV cache. Each draft token is sampled
  from the draft model's distribution after the same temperature, top-k, top-p and min-p
  processing the verifier applies to the target (greedy rows take the argmax), and that very
  distribution is handed to the verifier.
* :class:`~specsample.generate.ngram.NGramDrafter`: prompt lookup, without a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch

from specsample.generate.state import DecodeState, Prefill, SamplingState
from specsample.random import inverse_cdf

if TYPE_CHECKING:
    from specsample.generate.hf import CachedLM


class Proposal(NamedTuple):
    """The drafts of one step.

    Attributes
    ----------
    token_ids : torch.Tensor
        ``[batch, k]`` int64 draft tokens, each in ``[0, vocab)``.
    probs : torch.Tensor or None
        ``[batch, k, vocab]`` the exact distributions the drafts were sampled from, or
        ``None``: one-hot drafts (deterministic proposals, or an all-greedy batch).
    """

    token_ids: torch.Tensor
    probs: torch.Tensor | None


@runtime_checkable
class Drafter(Protocol):
    """What the decoding loop needs from a drafter.

    The loop calls :meth:`start` with the first sequences and :meth:`join` whenever more
    sequences take the places of finished ones (continuous batching). Every step it calls
    :meth:`propose`, verifies, appends the emitted tokens to the state and calls
    :meth:`update`; a step that drafts nothing (the adaptive policy chose a plain step)
    calls :meth:`skip` instead.
    :meth:`select` drops finished sequences. A drafter must not read the verifier's
    randomness.

    Attributes
    ----------
    name : str
        Short description for reports.
    samples : bool
        Whether :meth:`propose` returns draft distributions for sampled batches (needed by
        ``method="block"``).
    """

    name: str
    samples: bool

    def start(self, prefill: Prefill, state: DecodeState) -> None:
        """Begin a run: ``prefill`` holds every prompt of ``state`` but its last token."""

    def join(self, prefill: Prefill, state: DecodeState) -> None:
        """Sequences were appended to ``state`` (its last rows); ``prefill`` holds their prompts."""

    def propose(self, state: DecodeState, k: int, sampling: SamplingState) -> Proposal:
        """Propose ``k`` tokens for every active sequence (``[batch, k]``)."""
        ...

    def update(self, num_accepted: torch.Tensor, state: DecodeState) -> None:
        """``num_accepted [batch]`` drafts were accepted; ``state`` already holds the new tokens."""

    def skip(self, state: DecodeState) -> None:
        """A step without drafts committed one token per sequence (``state`` holds it)."""

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences at ``index`` (``[kept]`` int64), in that order."""


def _fit(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[batch, vocab]`` logits over the target's vocabulary.

    Extra columns of ``logits`` (``[batch, width]``) are dropped, missing ones are ``-inf``.
    """
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[:, :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - width), value=-torch.inf)


class ModelDrafter:
    """A Hugging Face causal LM drafting with its own KV cache.

    Every step it runs ``k`` forwards: the first feeds two slots (the last draft of the
    previous step when all ``k`` drafts were accepted, which the draft model has not seen,
    masked out otherwise; then the last committed token), the others one slot each. Slots of
    rejected drafts stay in the cache, permanently masked, so the cache is rectangular and
    every row advances by its own accepted length. The cache is compacted (masked slots
    dropped) when more than half of it is masked.

    Each draft is sampled from the draft model's distribution processed exactly like the
    target's (temperature, top-k, top-p, min-p of the request; greedy rows take the argmax),
    by inverting its CDF (:func:`specsample.random.inverse_cdf`) at a uniform keyed by
    ``(seed, position)`` on a stream of its own (see :mod:`specsample.generate.state`), and
    that distribution is returned with the drafts. In an all-greedy batch no distribution is
    computed.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM sharing the target's tokenizer (its vocabulary may be larger than the
        target's, never smaller; extra logits are dropped), whose forward honours an
        attention mask and explicit position ids together with a cache (see
        :func:`specsample.generate.hf.check_masked_cache`).
    """

    samples = True

    def __init__(self, model: object) -> None:
        from specsample.generate.hf import CachedLM

        self.lm: CachedLM = CachedLM(model, role="draft")
        self.name = f"model ({self.lm.describe()})"
        self._k = 0
        self._lag = 0
        self._lags = torch.zeros(0, dtype=torch.int64)
        self._pending = torch.zeros(0, dtype=torch.bool)
        self._pending_token = torch.zeros(0, dtype=torch.int64)
        self._drafts = torch.zeros(0, 0, dtype=torch.int64)

    def start(self, prefill: Prefill, state: DecodeState) -> None:
        """Reset the cache and feed the prompts (but their last tokens)."""
        device = state.tokens.device
        self.lm.reset(0)
        self._k = self._lag = 0
        self._lags = torch.zeros(0, dtype=torch.int64, device=device)
        self._pending = torch.zeros(0, dtype=torch.bool, device=device)
        self._pending_token = torch.zeros(0, dtype=torch.int64, device=device)
        self._drafts = torch.zeros(0, 0, dtype=torch.int64, device=device)
        self.join(prefill, state)

    def join(self, prefill: Prefill, state: DecodeState) -> None:
        """Feed the prompts of the sequences just appended to ``state`` (its last rows)."""
        self.lm.join(prefill.input_ids, prefill.position_ids, prefill.attention_mask)
        new = prefill.input_ids.shape[0]
        device = state.tokens.device
        self._lags = torch.cat([self._lags, torch.zeros(new, dtype=torch.int64, device=device)])
        self._pending = torch.cat(
            [self._pending, torch.zeros(new, dtype=torch.bool, device=device)]
        )
        self._pending_token = torch.cat(
            [self._pending_token, torch.zeros(new, dtype=torch.int64, device=device)]
        )
        self._drafts = torch.cat([self._drafts, self._drafts.new_zeros(new, self._drafts.shape[1])])

    def _first_logits(self, state: DecodeState) -> torch.Tensor:
        """``[batch, vocab]`` logits after the tokens the cache has not seen yet.

        Those are, per sequence, the pending draft (masked if none), the tokens committed by
        the plain steps since its last proposal (``lags``, at most ``lag``) and the last
        committed token: ``lag + 2`` slots, of which a sequence with a shorter lag masks the
        first ones (its cache holds those tokens already).
        """
        lag = self._lag
        offsets = torch.arange(-1 - lag, 1, device=state.lengths.device)
        positions = ((state.lengths - 1).unsqueeze(1) + offsets).clamp_(min=0)
        ids = state.tokens.gather(1, positions)
        slots = torch.arange(lag + 2, device=ids.device)
        first = (lag - self._lags).unsqueeze(1)
        ids = torch.where(slots == first, self._pending_token.unsqueeze(1), ids)
        valid = (slots > first) | ((slots == first) & self._pending.unsqueeze(1))
        self._lag = 0
        self._lags.zero_()
        return self.lm.forward(ids, positions, valid=valid)[:, -1]

    def propose(self, state: DecodeState, k: int, sampling: SamplingState) -> Proposal:
        """Sample ``k`` drafts per sequence (``[batch, k]``) and their distributions.

        The distributions (``[batch, k, vocab]`` float32) are ``None`` in an all-greedy batch,
        whose drafts are the argmaxes.
        """
        batch, vocab = state.batch, state.vocab_size
        device = state.tokens.device
        logits = self._first_logits(state)
        drafts = torch.empty(batch, k, dtype=torch.int64, device=device)
        probs = uniforms = None
        if not sampling.all_greedy:
            probs = torch.empty(batch, k, vocab, dtype=torch.float32, device=device)
            uniforms = sampling.draft_uniforms(state.lengths, k)
        for j in range(k):
            if j:
                step = (state.lengths - 1 + j).unsqueeze(1)
                logits = self.lm.forward(drafts[:, j - 1 : j], step)[:, -1]
            logits = _fit(logits, vocab)
            if probs is None or uniforms is None:
                drafts[:, j] = logits.argmax(dim=-1)
                continue
            probs[:, j] = sampling.probs(logits)
            drafts[:, j] = inverse_cdf(probs[:, j], uniforms[:, j])[0]
        self._k = k
        self._drafts = drafts
        return Proposal(drafts, probs)

    def update(self, num_accepted: torch.Tensor, state: DecodeState) -> None:
        """Mask the slots of rejected drafts; remember the last draft when all were accepted."""
        k = self._k
        if k > 1:
            cols = torch.arange(1, k, device=num_accepted.device)
            self.lm.set_tail_valid(cols <= num_accepted.unsqueeze(1))
        self._pending = num_accepted == k
        self._pending_token = self._drafts[:, -1]
        self.lm.maybe_compact(state.max_length)

    def skip(self, state: DecodeState) -> None:
        """A plain step: the committed token is fed with the next proposal."""
        self._lag += 1
        self._lags += 1

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences at ``index`` in the cache and the pending state."""
        self.lm.select(index)
        self._lags = self._lags[index]
        self._pending = self._pending[index]
        self._pending_token = self._pending_token[index]
        self._drafts = self._drafts[index]
