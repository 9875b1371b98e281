"""Batched speculative decoding over a pair of causal LMs, and target-only decoding.

One step of :func:`speculative_generate`, for every active sequence at once:

1. the drafter proposes ``k`` tokens (and, for a draft model, the distributions it sampled
   them from);
2. the target scores the last committed token and the ``k`` drafts in ONE forward over
   ``k + 1`` slots per sequence;
3. :func:`specsample.verify` accepts a prefix of the drafts and emits one more token
   (``method="chain"`` or ``"block"``; greedy where the temperature is 0), with randomness
   keyed by each sequence's seed and position (or, with ``method="typical"``, Medusa's
   lossy typical acceptance does);
4. the emitted tokens are appended; the target's slots of rejected drafts, and the draft
   model's, are masked for good, so both caches stay rectangular while every sequence
   advances by its own accepted length;
5. sequences that produced EOS or reached ``max_new_tokens`` leave the batch (their cache
   rows are dropped), so they stop costing compute.

The only host synchronisation per step is one small transfer that decides termination
(plus the new tokens when ``on_tokens`` streams them). :func:`target_generate` runs the same
loop without drafts: one target forward per token, sampled by the same
:func:`specsample.verify` processing, so the two are directly comparable.

Sequences are decoded in batches of at most ``max_batch_size``; the output is in prompt
order, and a seeded sequence's output depends only on its prompt, its seed and its
sampling parameters (up to floating-point differences between batch shapes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from specsample.api import METHODS, verify
from specsample.generate.drafters import (
    DecodeState,
    Drafter,
    ModelDrafter,
    Prefill,
    SamplingState,
    draft_probs,
)
from specsample.generate.hf import CachedLM
from specsample.generate.stats import GenerationStats
from specsample.metadata import SamplingMetadata, Scalars
from specsample.rules.typical import typical_acceptance

__all__ = ["GENERATE_METHODS", "GenerationOutput", "speculative_generate", "target_generate"]

GENERATE_METHODS = (*METHODS, "typical")
"""Verification rules of the loop: the exact ones of :func:`specsample.verify`, then Medusa's
typical acceptance (LOSSY, see :mod:`specsample.rules.typical`)."""

TokenCallback = Callable[[int, list[int]], None]
"""``on_tokens(sequence_index, new_token_ids)``, called every step a sequence grows."""

ProgressCallback = Callable[[int, int, int], None]
"""``on_progress(finished_sequences, total_sequences, tokens_generated)``, every step."""


class GenerationOutput(NamedTuple):
    """What :func:`speculative_generate` and :func:`target_generate` return.

    Attributes
    ----------
    sequences : list[list[int]]
        The generated token ids of every prompt, in prompt order (prompt excluded; a final
        EOS included).
    stats : GenerationStats
        Counters of the whole run.
    """

    sequences: list[list[int]]
    stats: GenerationStats


def _prompt_list(prompts: object) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2 or prompts.dtype.is_floating_point:
            raise ValueError(
                "prompts must be a 2-D integer tensor [batch, length] or a sequence of token-id "
                f"lists, got a tensor of shape {tuple(prompts.shape)} and dtype {prompts.dtype}"
            )
        return [[int(t) for t in row] for row in prompts.tolist()]
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(
            "prompts must be a sequence of token-id lists or a tensor, "
            f"got {type(prompts).__name__}"
        )
    result = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise TypeError(
                f"prompts[{i}] must be a sequence of token ids, got {type(prompt).__name__}"
            )
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise TypeError(f"prompts[{i}] must hold int token ids")
        result.append(list(prompt))
    return result


def _check_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _eos_ids(eos_token_id: int | Sequence[int] | None) -> list[int]:
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool):
        return [eos_token_id]
    if isinstance(eos_token_id, Sequence) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in eos_token_id
    ):
        return list(eos_token_id)
    raise TypeError(
        f"eos_token_id must be an int, a sequence of ints or None, got {eos_token_id!r}"
    )


def _seed_list(seeds: int | Sequence[int | None] | None, count: int) -> list[int | None] | None:
    if seeds is None:
        return None
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 0:
            raise ValueError(f"seeds must be non-negative, got {seeds}")
        return [seeds + i for i in range(count)]
    if not isinstance(seeds, Sequence):
        raise TypeError(
            f"seeds must be an int, a sequence of (int or None), or None, got {seeds!r}"
        )
    values = list(seeds)
    if len(values) != count:
        raise ValueError(f"seeds must have one entry per prompt ({count}), got {len(values)}")
    return values


class _Run:
    """One call's fixed configuration: models, rule, sampling values, limits, callbacks."""

    def __init__(
        self,
        lm: CachedLM,
        drafter: Drafter | None,
        k: int,
        method: str,
        meta: SamplingMetadata,
        seeds: list[int | None] | None,
        generator: torch.Generator | None,
        eos: list[int],
        on_tokens: TokenCallback | None,
        on_progress: ProgressCallback | None,
        total: int,
    ) -> None:
        self.lm = lm
        self.drafter = drafter
        self.k = k
        self.method = method
        self.meta = meta
        self.seeds = seeds
        self.generator = generator
        self.eos = torch.tensor(eos, dtype=torch.int64, device=lm.device) if eos else None
        self.on_tokens = on_tokens
        self.on_progress = on_progress
        self.total = total
        self.finished = 0
        self.tokens = 0

    def sampling(self, rows: range) -> SamplingState:
        meta = self.meta
        return SamplingState.build(
            len(rows),
            self.lm.device,
            temperature=[meta.temperature[i] for i in rows],
            top_k=[meta.top_k[i] for i in rows],
            top_p=[meta.top_p[i] for i in rows],
            min_p=[meta.min_p[i] for i in rows],
            seeds=None if self.seeds is None else [self.seeds[i] for i in rows],
            generator=self.generator,
        )


def _prefill(state: DecodeState) -> Prefill:
    """Every prompt but its last token, left-padded to a common width (read from ``state``)."""
    width = state.max_length - 1
    cols = torch.arange(width, device=state.tokens.device)
    index = cols - (width + 1 - state.lengths).unsqueeze(1)
    real = index >= 0
    index.clamp_(min=0)
    ids = state.tokens[:, :width].gather(1, index).masked_fill_(~real, 0)
    return Prefill(ids, real.to(torch.int64), index)


def _decode_batch(
    run: _Run,
    prompts: list[list[int]],
    indices: range,
    budgets: list[int],
    results: list[list[int]],
) -> GenerationStats:
    """Decode one batch of prompts to the end; write each output into ``results``."""
    lm, drafter, k = run.lm, run.drafter, run.k
    device = lm.device
    batch = len(prompts)
    lengths = [len(p) for p in prompts]
    capacity = max(lengths) + max(budgets) + k + 2
    tokens = torch.tensor([p + [0] * (capacity - len(p)) for p in prompts], dtype=torch.int64)
    state = DecodeState(
        tokens.to(device), torch.tensor(lengths, device=device), max(lengths), lm.vocab_size
    )
    prompt_lengths = state.lengths.clone()
    budget = torch.tensor(budgets, dtype=torch.int64, device=device)
    sampling = run.sampling(indices)
    rows = list(indices)
    cols = torch.arange(k + 1, device=device)
    counts = torch.zeros(k + 1, dtype=torch.int64, device=device)
    no_drafts = torch.zeros(batch, 0, dtype=torch.int64, device=device)
    method = run.method if k else "chain"
    steps = forwards = generated = 0

    start = time.perf_counter()
    prefill = _prefill(state)
    lm.reset(batch)
    if prefill.input_ids.shape[1]:
        lm.forward(prefill.input_ids, prefill.position_ids, valid=prefill.attention_mask)
    if drafter is not None:
        drafter.start(prefill, state)
    while rows:
        size = len(rows)
        if drafter is not None:
            proposal = drafter.propose(state, k, sampling)
            drafts, probs = proposal.token_ids, proposal.probs
        else:
            drafts, probs = no_drafts[:size], None
        inputs = torch.cat([state.last_tokens().unsqueeze(1), drafts], dim=1)
        logits = lm.forward(inputs, (state.lengths - 1).unsqueeze(1) + cols, keep=k + 1)
        vocab = logits.shape[-1]
        if method == "typical":
            new, emitted = _typical(logits, drafts, sampling)
        else:
            out = verify(
                logits.reshape(size * (k + 1), vocab),
                drafts.reshape(-1),
                [k] * size,
                draft_probs=None if probs is None else probs.reshape(size * k, vocab),
                positions=state.counter_base(k),
                method=method,
                **sampling.verify_kwargs(),  # type: ignore[arg-type]
            )
            emitted, new = out.num_emitted, out.token_ids
        lm.set_tail_valid(cols < emitted.unsqueeze(1))
        state.tokens.scatter_(1, state.lengths.unsqueeze(1) + cols, new.clamp(min=0))
        allowed = budget - (state.lengths - prompt_lengths)
        take = torch.minimum(emitted, allowed)
        finished = take == allowed
        if run.eos is not None:
            hit = torch.isin(new, run.eos) & (cols < emitted.unsqueeze(1))
            stop = torch.where(hit.any(dim=1), hit.to(torch.int64).argmax(dim=1) + 1, k + 2)
            finished |= stop <= take
            take = torch.minimum(take, stop)
        state.lengths = state.lengths + take
        counts.scatter_add_(0, emitted - 1, torch.ones_like(emitted))
        any_finished, longest, step_tokens = torch.stack(
            [finished.any().to(torch.int64), state.lengths.max(), take.sum()]
        ).tolist()
        steps += 1
        forwards += size
        generated += step_tokens
        run.tokens += step_tokens
        state.max_length = longest
        if run.on_tokens is not None:
            _stream(run.on_tokens, rows, take, new)
        if drafter is not None:
            drafter.update(emitted - 1, state)
        if any_finished:
            rows = _retire(state, prompt_lengths, finished, rows, results)
            run.finished += size - len(rows)
            if rows:
                keep_rows = (~finished).nonzero().squeeze(1)
                kept = keep_rows.tolist()
                lm.select(keep_rows)
                if drafter is not None:
                    drafter.select(keep_rows)
                state.select(keep_rows)
                sampling.select(keep_rows, kept)
                prompt_lengths = prompt_lengths[keep_rows]
                budget = budget[keep_rows]
        lm.maybe_compact(state.max_length)
        if run.on_progress is not None:
            run.on_progress(run.finished, run.total, run.tokens)
    wall = time.perf_counter() - start
    return GenerationStats(
        mode="target-only" if drafter is None else "speculative",
        drafter=None if drafter is None else drafter.name,
        method=None if drafter is None else run.method,
        k=k,
        sequences=batch,
        tokens=generated,
        wall_time_s=wall,
        steps=steps,
        sequence_forwards=forwards,
        accepted_counts=tuple(counts.tolist()) if drafter is not None else (),
    )


def _typical(
    logits: torch.Tensor, drafts: torch.Tensor, sampling: SamplingState
) -> tuple[torch.Tensor, torch.Tensor]:
    """Typical acceptance of one step (LOSSY): ``[batch, k + 1]`` tokens, ``[batch]`` emitted.

    The target rows get the requests' processing first (greedy rows become one-hot, so a
    greedy request accepts exactly the drafts equal to the target argmax).
    """
    probs = torch.stack(
        [draft_probs(logits[:, slot], sampling) for slot in range(logits.shape[1])], dim=1
    )
    out = typical_acceptance(probs, drafts)
    return out.token_ids, out.num_accepted + 1


def _stream(
    on_tokens: TokenCallback, rows: list[int], take: torch.Tensor, new: torch.Tensor
) -> None:
    """Hand every sequence's new tokens to ``on_tokens``."""
    for row, values in zip(rows, torch.cat([take.unsqueeze(1), new], dim=1).tolist(), strict=True):
        if values[0]:
            on_tokens(row, values[1 : 1 + values[0]])


def _retire(
    state: DecodeState,
    prompt_lengths: torch.Tensor,
    finished: torch.Tensor,
    rows: list[int],
    results: list[list[int]],
) -> list[int]:
    """Store the outputs of the finished sequences; return the indices still active."""
    done = finished.nonzero().squeeze(1)
    ends = state.lengths[done].tolist()
    starts = prompt_lengths[done].tolist()
    sequences = state.tokens[done].tolist()
    for position, row in enumerate(done.tolist()):
        results[rows[row]] = sequences[position][starts[position] : ends[position]]
    finished_rows = set(done.tolist())
    return [index for position, index in enumerate(rows) if position not in finished_rows]


def _generate(
    target: Any,
    prompts: object,
    drafter: Drafter | None,
    *,
    k: int,
    method: str,
    temperature: Scalars,
    top_k: Scalars,
    top_p: Scalars,
    min_p: Scalars,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None,
    seeds: int | Sequence[int | None] | None,
    generator: torch.Generator | None,
    max_batch_size: int | None,
    on_tokens: TokenCallback | None,
    on_progress: ProgressCallback | None,
) -> GenerationOutput:
    lm = target if isinstance(target, CachedLM) else CachedLM(target, role="target")
    prompt_ids = _prompt_list(prompts)
    if not prompt_ids:
        raise ValueError("prompts must hold at least one prompt")
    _check_int("max_new_tokens", max_new_tokens, 1)
    batch_size = len(prompt_ids) if max_batch_size is None else max_batch_size
    _check_int("max_batch_size", batch_size, 1)
    budgets = []
    for i, prompt in enumerate(prompt_ids):
        if not prompt:
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
        if min(prompt) < 0 or max(prompt) >= lm.vocab_size:
            raise ValueError(f"prompts[{i}] holds token ids outside [0, {lm.vocab_size})")
        context = lm.max_positions
        if context is not None and len(prompt) >= context:
            raise ValueError(
                f"prompts[{i}] has {len(prompt)} tokens but the target's context is {context} "
                "positions: nothing can be generated"
            )
        budgets.append(
            max_new_tokens if context is None else min(max_new_tokens, context - len(prompt))
        )
    meta = SamplingMetadata.build(
        len(prompt_ids), temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
    )
    run = _Run(
        lm,
        drafter,
        k,
        method,
        meta,
        _seed_list(seeds, len(prompt_ids)),
        generator,
        _eos_ids(eos_token_id),
        on_tokens,
        on_progress,
        len(prompt_ids),
    )
    results: list[list[int]] = [[] for _ in prompt_ids]
    stats: GenerationStats | None = None
    with torch.inference_mode():
        for first in range(0, len(prompt_ids), batch_size):
            indices = range(first, min(first + batch_size, len(prompt_ids)))
            part = _decode_batch(
                run,
                [prompt_ids[i] for i in indices],
                indices,
                [budgets[i] for i in indices],
                results,
            )
            stats = part if stats is None else stats.merge(part)
    if stats is None:
        raise ValueError("prompts must hold at least one prompt")
    return GenerationOutput(results, stats)


def speculative_generate(
    target: Any,
    prompts: Sequence[Sequence[int]] | torch.Tensor,
    drafter: Drafter | Any,
    *,
    k: int = 4,
    method: str = "chain",
    temperature: Scalars = 0.0,
    top_k: Scalars = None,
    top_p: Scalars = None,
    min_p: Scalars = None,
    max_new_tokens: int = 64,
    eos_token_id: int | Sequence[int] | None = None,
    seeds: int | Sequence[int | None] | None = None,
    generator: torch.Generator | None = None,
    max_batch_size: int | None = None,
    on_tokens: TokenCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> GenerationOutput:
    """Generate from ``target`` with speculative decoding, a batch of prompts at a time.

    The output follows the target's processed distribution exactly (and, at temperature 0,
    equals the target's greedy decoding token for token).

    Parameters
    ----------
    target : transformers.PreTrainedModel
        The causal LM to sample from (eval mode). Its forward must honour an attention mask
        and explicit position ids with a cache (:func:`specsample.generate.hf.check_masked_cache`).
    prompts : sequence of sequences of int, or torch.Tensor
        Token ids of each prompt (ragged), or a ``[batch, length]`` integer tensor.
    drafter : Drafter or transformers.PreTrainedModel
        A :class:`~specsample.generate.drafters.Drafter` (e.g. an
        :class:`~specsample.generate.drafters.NGramDrafter`), or a draft causal LM sharing
        the target's tokenizer (wrapped in a :class:`~specsample.generate.drafters.ModelDrafter`).
    k : int
        Drafts per step, ``>= 1``.
    method : str
        ``"chain"`` (token by token) or ``"block"`` (block verification; needs a drafter
        that samples, such as a draft model), both exact; or ``"typical"``: Medusa's typical
        acceptance, which is LOSSY (its output does not follow the target's distribution;
        see :mod:`specsample.rules.typical`).
    temperature, top_k, top_p, min_p : scalar or sequence
        Sampling parameters, one value or one per prompt, as in :func:`specsample.verify`
        (temperature 0: greedy). The draft model's distributions get the same processing.
    max_new_tokens : int
        Most tokens generated per prompt (fewer if the target's context ends first).
    eos_token_id : int or sequence of int, optional
        A sequence stops after producing one of these.
    seeds : int or sequence of (int or None), optional
        Per-prompt seeds (an int ``s`` gives prompt ``i`` the seed ``s + i``); randomness is
        keyed by ``(seed, position)``. Unseeded prompts use ``generator``.
    generator : torch.Generator, optional
        Randomness of unseeded prompts (torch's default generator when ``None``).
    max_batch_size : int, optional
        Decode at most this many prompts at once (default: all).
    on_tokens : callable, optional
        ``on_tokens(prompt_index, new_token_ids)`` every step a sequence grows (one extra
        host transfer per step).
    on_progress : callable, optional
        ``on_progress(finished_sequences, total_sequences, tokens_generated)`` every step.

    Returns
    -------
    GenerationOutput
        The generated ids per prompt and the run's :class:`GenerationStats`.
    """
    _check_int("k", k, 1)
    if method not in GENERATE_METHODS:
        raise ValueError(f"method must be one of {GENERATE_METHODS}, got {method!r}")
    if not isinstance(drafter, Drafter):
        if getattr(drafter, "config", None) is None:
            raise TypeError(
                "drafter must be a Drafter (e.g. NGramDrafter()) or a transformers causal LM, "
                f"got {type(drafter).__name__}"
            )
        drafter = ModelDrafter(drafter)
    if method == "block" and not drafter.samples:
        raise ValueError(
            f"method='block' needs draft distributions, which the {drafter.name} drafter does "
            "not provide; use method='chain'"
        )
    return _generate(
        target,
        prompts,
        drafter,
        k=k,
        method=method,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        seeds=seeds,
        generator=generator,
        max_batch_size=max_batch_size,
        on_tokens=on_tokens,
        on_progress=on_progress,
    )


def target_generate(
    target: Any,
    prompts: Sequence[Sequence[int]] | torch.Tensor,
    *,
    temperature: Scalars = 0.0,
    top_k: Scalars = None,
    top_p: Scalars = None,
    min_p: Scalars = None,
    max_new_tokens: int = 64,
    eos_token_id: int | Sequence[int] | None = None,
    seeds: int | Sequence[int | None] | None = None,
    generator: torch.Generator | None = None,
    max_batch_size: int | None = None,
    on_tokens: TokenCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> GenerationOutput:
    """Generate from ``target`` alone, one forward per token: the baseline to compare with.

    Tokens are drawn by :func:`specsample.verify` without drafts, so the processing
    (temperature, top-k, top-p, min-p; greedy at temperature 0) and the randomness keyed by
    ``(seed, position)`` are those of :func:`speculative_generate`. Parameters and return
    value are those of :func:`speculative_generate` (without ``drafter``, ``k`` and
    ``method``).
    """
    return _generate(
        target,
        prompts,
        None,
        k=0,
        method="chain",
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        seeds=seeds,
        generator=generator,
        max_batch_size=max_batch_size,
        on_tokens=on_tokens,
        on_progress=on_progress,
    )
