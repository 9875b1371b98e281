"""Drafters: what proposes the ``k`` tokens the target then verifies in one forward.

Every drafter implements the small :class:`Drafter` protocol. The decoding loop
(:mod:`specsample.generate.decoder`) owns the committed tokens of every sequence
(:class:`~specsample.generate.state.DecodeState`) and the sampling parameters
(:class:`~specsample.generate.sampling.SamplingState`); a drafter reads them, proposes ``k``
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

from specsample.generate.sampling import SamplingState
from specsample.generate.state import DecodeState, Prefill
from specsample.generate.tree import TreeLayout, TreeShape, draw_children
from specsample.random import inverse_cdf

if TYPE_CHECKING:
    from specsample.adapter import CachedLM


class Proposal(NamedTuple):
    """The drafts of one step.

    Attributes
    ----------
    token_ids : torch.Tensor
        ``[batch, k]`` int64 draft tokens, each in ``[0, vocab)``.
    probs : torch.Tensor or None
        ``[batch, k, vocab]`` the exact distributions the drafts were sampled from, or
        ``None``: one-hot drafts (deterministic proposals, or an all-greedy batch).
    drafting : torch.Tensor or None
        ``[batch]`` bool, which sequences found something to propose (the others' drafts
        are filler), or ``None``: every sequence did.
    """

    token_ids: torch.Tensor
    probs: torch.Tensor | None
    drafting: torch.Tensor | None = None


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

    A drafter may also set ``costless = True``: proposing costs no model forward, and the
    first ``m`` drafts of a proposal of ``k`` are those it would propose for ``m``. A loop
    with an adaptive draft length then proposes ``k`` first and chooses the length knowing
    which sequences found drafts (:attr:`Proposal.drafting`).
    """

    name: str
    samples: bool

    def start(self, prefill: Prefill, state: DecodeState) -> None:
        """Begin a run: ``prefill`` holds every prompt of ``state`` but its last token."""

    def join(self, prefill: Prefill, state: DecodeState) -> None:
        """Sequences were appended to ``state`` (its last rows); ``prefill`` holds their prompts."""

    def propose(self, state: DecodeState, k: int, sampling: SamplingState) -> Proposal:
        """Propose up to ``k`` tokens for every active sequence (``[batch, m]``, ``m <= k``).

        A drafter proposes fewer than ``k`` only where it cannot do more (a draft model near
        the end of its context); how many to draft is the loop's choice.
        """
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
    computed. In a keyed run (``method="gumbel"``) each draft is instead the keyed Gumbel-max
    token of the draft's processed logits at its position
    (:meth:`~specsample.generate.sampling.SamplingState.gumbel_tokens`), the noise the target's
    token there reads, and no distribution is returned.

    Parameters
    ----------
    model : transformers.PreTrainedModel or CachedLM
        A causal LM sharing the target's tokenizer (its vocabulary may be larger than the
        target's, never smaller; extra logits are dropped), whose forward honours an
        attention mask and explicit position ids together with a cache (see
        :func:`specsample.adapter.check_masked_cache`); or a
        :class:`~specsample.adapter.CachedLM` of one, to choose its options (such as
        ``fused=False``).
    """

    samples = True

    def __init__(self, model: object) -> None:
        from specsample.adapter import CachedLM

        self.lm: CachedLM = model if isinstance(model, CachedLM) else CachedLM(model, role="draft")
        self.name = f"model ({self.lm.describe()})"
        self._k = 0
        self._lag = 0
        self._skipped = False
        self._lags = torch.zeros(0, dtype=torch.int64)
        self._pending = torch.zeros(0, dtype=torch.bool)
        self._pending_token = torch.zeros(0, dtype=torch.int64)
        self._drafts = torch.zeros(0, 0, dtype=torch.int64)
        self._tree: TreeLayout | None = None

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
        """Sample up to ``k`` drafts per sequence (``[batch, m]``) and their distributions.

        The distributions (``[batch, m, vocab]`` float32) are ``None`` in an all-greedy batch,
        whose drafts are the argmaxes. Near the end of the draft model's context fewer
        drafts are proposed (none when even the tokens it has not seen yet would not fit),
        so its cache never needs more slots than its context allows.
        """
        batch, vocab = state.batch, state.vocab_size
        device = state.tokens.device
        room = self.lm.room(self._lag + 1 + k) - self._lag - 1
        if room < 1:
            self._k, self._skipped = 0, True
            return Proposal(torch.zeros(batch, 0, dtype=torch.int64, device=device), None)
        k = min(k, room)
        self._skipped = False
        logits = self._first_logits(state)
        drafts = torch.empty(batch, k, dtype=torch.int64, device=device)
        probs = uniforms = None
        keyed = sampling.keyed and not sampling.all_greedy
        if not (sampling.all_greedy or keyed):
            probs = torch.empty(batch, k, vocab, dtype=torch.float32, device=device)
            uniforms = sampling.draft_uniforms(state.lengths, k)
        for j in range(k):
            if j:
                step = (state.lengths - 1 + j).unsqueeze(1)
                logits = self.lm.forward(drafts[:, j - 1 : j], step)[:, -1]
            logits = _fit(logits, vocab)
            if keyed:
                drafts[:, j] = sampling.gumbel_tokens(logits, state.lengths + j)
                continue
            if probs is not None:
                probs[:, j] = sampling.probs(logits)
            if probs is None or uniforms is None:
                drafts[:, j] = logits.argmax(dim=-1)
                continue
            drafts[:, j] = inverse_cdf(probs[:, j], uniforms[:, j])[0]
        self._k = k
        self._drafts = drafts
        return Proposal(drafts, probs)

    def room_for_tree(self, layout: TreeLayout) -> bool:
        """Whether a tree of ``layout`` fits in the draft model's context (compacting first)."""
        fed = layout.levels[-1][0] - 1
        return self.lm.room(self._lag + 2 + fed) == self._lag + 2 + fed

    def propose_tree(
        self, state: DecodeState, shape: TreeShape, layout: TreeLayout, sampling: SamplingState
    ) -> Proposal:
        """Draft a tree of ``shape`` per sequence, a level per draft forward.

        Returns
        -------
        Proposal
            ``token_ids [batch, N + 1]`` (node 0: the last committed token) and ``probs
            [batch, N + 1, vocab]``, row ``i`` the distribution node ``i``'s children were
            drawn from (zero for the leaves; ``None`` in an all-greedy batch, whose children
            are the draft's most likely tokens).

        Every level but the last is fed to the draft model, each node attending to the
        committed tokens, its ancestors and itself; the leaves are not (a leaf on the
        accepted path is fed with the next proposal).
        """
        batch, vocab = state.batch, state.vocab_size
        device = state.tokens.device
        nodes = int(layout.parents.shape[0])
        tokens = torch.zeros(batch, nodes, dtype=torch.int64, device=device)
        tokens[:, 0] = state.last_tokens()
        probs = uniforms = None
        if not sampling.all_greedy:
            probs = torch.zeros(batch, nodes, vocab, dtype=torch.float32, device=device)
            uniforms = sampling.draft_uniforms(state.lengths, nodes - 1)
        logits = _fit(self._first_logits(state), vocab).unsqueeze(1)
        parent_start = 0
        for depth, (start, stop) in enumerate(layout.levels):
            parent_stop = parent_start + logits.shape[1]
            level_probs = None
            if probs is not None:
                level_probs = sampling.probs(logits)
                probs[:, parent_start:parent_stop] = level_probs
            children = draw_children(
                shape.drafting,
                logits,
                level_probs,
                shape.branching[depth],
                None if uniforms is None else uniforms[:, start - 1 : stop - 1],
            )
            tokens[:, start:stop] = children
            if depth + 1 < len(layout.levels):
                positions = (state.lengths + depth).unsqueeze(1).expand(-1, stop - start)
                visible = layout.visible[start:stop, 1:stop]
                out = self.lm.forward(children, positions, keep=0, visible=visible)
                logits = _fit(out, vocab)
            parent_start = start
        self._tree = layout
        return Proposal(tokens, probs)

    def update_tree(self, path: torch.Tensor, state: DecodeState) -> None:
        """Keep the draft slots of the accepted ``path`` (``[batch, depth + 1]`` node ids).

        A leaf on the path was never fed: it is fed, as pending, with the next proposal.
        """
        layout = self._tree
        if layout is None:
            raise RuntimeError("update_tree() called without a tree proposal")
        fed = layout.levels[-1][0] - 1
        nodes = torch.arange(1, fed + 1, device=path.device)
        on_path = (path.unsqueeze(2) == nodes).any(dim=1)
        self.lm.set_tail_valid(on_path)
        deepest = path.max(dim=1).values
        self._pending = deepest >= layout.levels[-1][0]
        self._pending_token = state.tokens.gather(
            1, (state.lengths - 2).clamp(min=0).unsqueeze(1)
        ).squeeze(1)
        self.lm.maybe_compact(state.max_length)

    def update(self, num_accepted: torch.Tensor, state: DecodeState) -> None:
        """Mask the slots of rejected drafts; remember the last draft when all were accepted."""
        if self._skipped:
            self.skip(state)
            return
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
