"""Drafters: what proposes the ``k`` tokens the target then verifies in one forward.

Every drafter implements the small :class:`Drafter` protocol. The decoding loop
(:mod:`specsample.generate.loop`) owns the committed tokens of every sequence
(:class:`DecodeState`) and the sampling parameters (:class:`SamplingState`); a drafter reads
them, proposes ``k`` tokens per active sequence and, when it samples them, returns the exact
distributions it sampled from. Two drafters are provided:

* :class:`ModelDrafter`: a small causal LM with its own KV cache. Each draft token is sampled
  from the draft model's distribution after the same temperature, top-k, top-p and min-p
  processing the verifier applies to the target (greedy rows take the argmax), and that very
  distribution is handed to the verifier.
* :class:`NGramDrafter`: prompt lookup. It finds the most recent earlier occurrence of the
  longest suffix n-gram of the sequence and proposes the tokens that followed it. It needs no
  model, and its drafts are one-hot, which verification treats exactly whatever is proposed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch

from specsample.metadata import SamplingMetadata, Scalars
from specsample.probs import row_stats
from specsample.random import row_uniforms

if TYPE_CHECKING:
    from specsample.generate.hf import CachedLM

__all__ = [
    "DecodeState",
    "Drafter",
    "ModelDrafter",
    "NGramDrafter",
    "Prefill",
    "Proposal",
    "SamplingState",
    "draft_probs",
    "sample_rows",
]

DRAFT_STREAM = 2
"""Counter stream of :mod:`specsample.random` the draft samples read (verification uses 0, 1)."""


@dataclass
class DecodeState:
    """The committed tokens of the active sequences, as the decoding loop keeps them.

    Attributes
    ----------
    tokens : torch.Tensor
        ``[batch, capacity]`` int64: sequence ``i`` holds its prompt and generated tokens in
        columns ``0 .. lengths[i] - 1``; later columns hold stale values.
    lengths : torch.Tensor
        ``[batch]`` int64 number of committed tokens (prompt included).
    max_length : int
        Host-side upper bound of ``lengths``.
    vocab_size : int
        Width of the target's logits; every draft id must lie in ``[0, vocab_size)``.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    max_length: int
    vocab_size: int

    @property
    def batch(self) -> int:
        """Number of active sequences."""
        return int(self.tokens.shape[0])

    def last_tokens(self) -> torch.Tensor:
        """``[batch]`` the last committed token of every sequence."""
        return self.tokens.gather(1, (self.lengths - 1).unsqueeze(1)).squeeze(1)

    def counter_base(self, k: int) -> torch.Tensor:
        """``[batch]`` first random-stream counter of this step: ``lengths * (k + 1)``.

        A step starting at position ``L`` reads counters ``L (k + 1) .. L (k + 1) + k``. The
        start position grows every step, so no counter is ever read twice: not even the
        numbers of positions past the accepted ones, which block verification does look at.
        """
        return self.lengths * (k + 1)

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences at ``index`` (``[kept]`` int64), in that order."""
        self.tokens = self.tokens[index]
        self.lengths = self.lengths[index]


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


@dataclass
class SamplingState:
    """Per-sequence sampling parameters, on the host and as device tensors.

    Build it with :meth:`build`; the processing is that of :mod:`specsample.probs`
    (temperature, top-k, top-p, min-p; temperature 0 is greedy).

    Attributes
    ----------
    meta : SamplingMetadata
        Host-side values and flags (what :func:`specsample.verify` receives).
    inv_temperature : torch.Tensor
        ``[batch]`` float32 ``1 / T`` (1 for greedy rows).
    top_k, top_p, min_p : torch.Tensor or None
        ``[batch]`` filters, ``None`` when no row uses them.
    greedy : torch.Tensor
        ``[batch]`` bool.
    seeds : torch.Tensor or None
        ``[batch]`` int64 per-sequence seeds (-1: unseeded); ``None`` when none is seeded.
    generator : torch.Generator or None
        Randomness of unseeded sequences (torch's default generator when ``None``).
    """

    meta: SamplingMetadata
    inv_temperature: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    greedy: torch.Tensor
    seeds: torch.Tensor | None
    generator: torch.Generator | None

    @staticmethod
    def build(
        batch: int,
        device: torch.device,
        *,
        temperature: Scalars = 0.0,
        top_k: Scalars = None,
        top_p: Scalars = None,
        min_p: Scalars = None,
        seeds: Sequence[int | None] | None = None,
        generator: torch.Generator | None = None,
    ) -> SamplingState:
        """Validate the parameters (scalars or one value per sequence) and build the state.

        Examples
        --------
        >>> s = SamplingState.build(2, torch.device("cpu"), temperature=[0.0, 0.5], seeds=[3, None])
        >>> s.all_greedy, s.inv_temperature.tolist(), s.seeds.tolist()
        (False, [1.0, 2.0], [3, -1])
        """
        meta = SamplingMetadata.build(
            batch, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
        )
        seed_t = None
        if seeds is not None:
            values = [-1 if s is None else int(s) for s in seeds]
            if len(values) != batch:
                raise ValueError(
                    f"seeds must have one entry per sequence ({batch}), got {len(values)}"
                )
            if any(v < -1 for v in values):
                raise ValueError("seeds must be non-negative (None: unseeded)")
            if any(v >= 0 for v in values):
                seed_t = torch.tensor(values, dtype=torch.int64, device=device)
        inv_t = [1.0 / t if t > 0 else 1.0 for t in meta.temperature]
        return SamplingState(
            meta=meta,
            inv_temperature=torch.tensor(inv_t, dtype=torch.float32, device=device),
            top_k=torch.tensor(meta.top_k, dtype=torch.int64, device=device)
            if meta.max_top_k
            else None,
            top_p=torch.tensor(meta.top_p, dtype=torch.float32, device=device)
            if meta.any_top_p
            else None,
            min_p=torch.tensor(meta.min_p, dtype=torch.float32, device=device)
            if meta.any_min_p
            else None,
            greedy=torch.tensor([t == 0.0 for t in meta.temperature], device=device),
            seeds=seed_t,
            generator=generator,
        )

    @property
    def all_greedy(self) -> bool:
        """Every sequence decodes greedily."""
        return self.meta.all_greedy

    def verify_kwargs(self) -> dict[str, object]:
        """The sampling arguments of :func:`specsample.verify` for the current batch."""
        return {
            "temperature": self.meta.temperature,
            "top_k": self.meta.top_k,
            "top_p": self.meta.top_p,
            "min_p": self.meta.min_p,
            "seeds": self.seeds,
            "generator": self.generator,
        }

    def uniforms(self, n: int, counter_base: torch.Tensor, stream: int) -> torch.Tensor:
        """``[batch, n]`` float64 uniforms: seeded rows read counters ``base .. base + n - 1``.

        Parameters
        ----------
        n : int
            Uniforms per row.
        counter_base : torch.Tensor
            ``[batch]`` int64 first counter of each row.
        stream : int
            Counter stream (see :func:`specsample.random.counter_uniform`).
        """
        return row_uniforms(
            int(self.inv_temperature.shape[0]),
            n,
            device=self.inv_temperature.device,
            generator=self.generator,
            seeds=self.seeds,
            offsets=counter_base,
            stream=stream,
        )

    def select(self, index: torch.Tensor, rows: Sequence[int]) -> None:
        """Keep the sequences at ``index`` (device tensor) / ``rows`` (the same, on the host)."""
        meta = self.meta
        self.meta = SamplingMetadata(
            [meta.temperature[i] for i in rows],
            [meta.top_k[i] for i in rows],
            [meta.top_p[i] for i in rows],
            [meta.min_p[i] for i in rows],
        )
        self.inv_temperature = self.inv_temperature[index]
        self.greedy = self.greedy[index]
        self.top_k = None if self.top_k is None else self.top_k[index]
        self.top_p = None if self.top_p is None else self.top_p[index]
        self.min_p = None if self.min_p is None else self.min_p[index]
        self.seeds = None if self.seeds is None else self.seeds[index]


def draft_probs(logits: torch.Tensor, sampling: SamplingState) -> torch.Tensor:
    """Each row's processed distribution, exactly as :func:`specsample.verify` processes q.

    Parameters
    ----------
    logits : torch.Tensor
        ``[batch, vocab]`` draft logits.
    sampling : SamplingState
        Per-row parameters; greedy rows get the one-hot distribution of their argmax.

    Returns
    -------
    torch.Tensor
        ``[batch, vocab]`` float32 probabilities.

    Examples
    --------
    >>> s = SamplingState.build(2, torch.device("cpu"), temperature=[1.0, 0.0], top_k=1)
    >>> draft_probs(torch.tensor([[0.0, 1.0], [3.0, 1.0]]), s).tolist()
    [[0.0, 1.0], [1.0, 0.0]]
    """
    meta = sampling.meta
    stats = row_stats(
        logits,
        sampling.inv_temperature,
        top_k=sampling.top_k,
        max_top_k=meta.max_top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
    )
    z = logits.to(torch.float32) * stats.inv_temperature.unsqueeze(-1)
    dropped = z < stats.cutoff.unsqueeze(-1)
    probs = z.sub_(stats.log_norm.unsqueeze(-1)).exp_().masked_fill_(dropped, 0.0)
    if meta.any_greedy:
        onehot = torch.nn.functional.one_hot(stats.argmax, logits.shape[-1]).to(probs.dtype)
        probs = torch.where(sampling.greedy.unsqueeze(-1), onehot, probs)
    return probs


def sample_rows(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per row of ``probs`` by inverting its CDF at ``uniforms``.

    Parameters
    ----------
    probs : torch.Tensor
        ``[batch, vocab]`` non-negative weights (need not sum to 1).
    uniforms : torch.Tensor
        ``[batch]`` float64 in ``[0, 1)``.

    Returns
    -------
    torch.Tensor
        ``[batch]`` int64. A token of probability 0 is never returned (a row without mass
        returns its argmax, 0).

    Examples
    --------
    >>> p = torch.tensor([[0.25, 0.0, 0.75]])
    >>> [int(sample_rows(p, torch.tensor([u], dtype=torch.float64))) for u in (0.1, 0.3)]
    [0, 2]
    """
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    point = (uniforms * cdf[:, -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, point, right=True).clamp_(max=probs.shape[-1] - 1)
    positive = probs.gather(1, index) > 0
    return torch.where(positive, index, probs.argmax(dim=-1, keepdim=True)).squeeze(-1)


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

    The loop calls :meth:`start` once per batch, then every step :meth:`propose`, verifies,
    appends the emitted tokens to the state and calls :meth:`update`; :meth:`select` drops
    finished sequences. A drafter must not read the verifier's randomness.

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
        """Begin a batch: ``prefill`` holds every prompt but its last token."""

    def propose(self, state: DecodeState, k: int, sampling: SamplingState) -> Proposal:
        """Propose ``k`` tokens for every active sequence (``[batch, k]``)."""
        ...

    def update(self, num_accepted: torch.Tensor, state: DecodeState) -> None:
        """``num_accepted [batch]`` drafts were accepted; ``state`` already holds the new tokens."""

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences at ``index`` (``[kept]`` int64), in that order."""


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
        for label, value in (
            ("max_ngram", max_ngram),
            ("min_ngram", min_ngram),
            ("window", window),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{label} must be an int, got {type(value).__name__}")
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                "need 1 <= min_ngram <= max_ngram, "
                f"got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if window <= max_ngram:
            raise ValueError(f"window must exceed max_ngram ({max_ngram}), got {window}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.window = window
        self.name = f"n-gram ({min_ngram}..{max_ngram})"

    def start(self, prefill: Prefill, state: DecodeState) -> None:
        """Nothing to prepare."""

    def propose(self, state: DecodeState, k: int, sampling: SamplingState | None) -> Proposal:
        """Propose ``k`` tokens per sequence from its own history (``[batch, k]``, one-hot)."""
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
        steps = torch.arange(k, device=tokens.device)
        follow = best.unsqueeze(1) + steps % period.clamp(min=1).unsqueeze(1)
        last = (lengths - 1).unsqueeze(1).expand(-1, k)
        index = torch.where((best >= 0).unsqueeze(1), follow, last)
        return Proposal(tokens.gather(1, index), None)

    def update(self, num_accepted: torch.Tensor, state: DecodeState) -> None:
        """Nothing to update: the drafter reads the committed tokens."""

    def select(self, index: torch.Tensor) -> None:
        """Nothing to select."""


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
    with uniforms keyed by ``(seed, step)`` on a stream of its own, and that distribution is
    returned with the drafts. In an all-greedy batch no distribution is computed.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM sharing the target's tokenizer, whose forward honours an attention mask
        and explicit position ids together with a cache (see
        :func:`specsample.generate.hf.check_masked_cache`).
    """

    samples = True

    def __init__(self, model: object) -> None:
        from specsample.generate.hf import CachedLM

        self.lm: CachedLM = CachedLM(model, role="draft")
        self.name = f"model ({self.lm.describe()})"
        self._k = 0
        self._pending = torch.zeros(0, dtype=torch.bool)
        self._pending_token = torch.zeros(0, dtype=torch.int64)
        self._drafts = torch.zeros(0, 0, dtype=torch.int64)

    def start(self, prefill: Prefill, state: DecodeState) -> None:
        """Reset the cache and feed the prompts (but their last tokens)."""
        self.lm.reset(state.batch)
        device = state.tokens.device
        if prefill.input_ids.shape[1]:
            self.lm.forward(prefill.input_ids, prefill.position_ids, valid=prefill.attention_mask)
        self._k = 0
        self._pending = torch.zeros(state.batch, dtype=torch.bool, device=device)
        self._pending_token = torch.zeros(state.batch, dtype=torch.int64, device=device)

    def _fit(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Logits over the target's vocabulary: extra columns dropped, missing ones ``-inf``."""
        width = logits.shape[-1]
        if width == vocab:
            return logits
        if width > vocab:
            return logits[:, :vocab]
        return torch.nn.functional.pad(logits, (0, vocab - width), value=-torch.inf)

    def propose(self, state: DecodeState, k: int, sampling: SamplingState) -> Proposal:
        """Sample ``k`` drafts per sequence (``[batch, k]``) and their distributions."""
        batch, vocab = state.batch, state.vocab_size
        device = state.tokens.device
        position = state.lengths - 1
        ids = torch.stack([self._pending_token, state.last_tokens()], dim=1)
        positions = torch.stack([(position - 1).clamp_(min=0), position], dim=1)
        valid = torch.stack([self._pending, torch.ones_like(self._pending)], dim=1)
        logits = self.lm.forward(ids, positions, valid=valid)[:, -1]
        sample = not sampling.all_greedy
        drafts = torch.empty(batch, k, dtype=torch.int64, device=device)
        probs = torch.empty(batch, k, vocab, dtype=torch.float32, device=device) if sample else None
        uniforms = sampling.uniforms(k, state.counter_base(k), DRAFT_STREAM) if sample else None
        for j in range(k):
            if j:
                logits = self.lm.forward(drafts[:, j - 1 : j], (position + j).unsqueeze(1))[:, -1]
            logits = self._fit(logits, vocab)
            if probs is None or uniforms is None:
                drafts[:, j] = logits.argmax(dim=-1)
                continue
            probs[:, j] = draft_probs(logits, sampling)
            drafts[:, j] = sample_rows(probs[:, j], uniforms[:, j])
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

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences at ``index`` in the cache and the pending state."""
        self.lm.select(index)
        self._pending = self._pending[index]
        self._pending_token = self._pending_token[index]
        self._drafts = self._drafts[index]
