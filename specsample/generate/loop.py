"""Batched speculative decoding over a pair of causal LMs, and target-only decoding.

One step of :func:`speculative_generate`, for every active sequence at once:

1. the drafter proposes ``k`` tokens (and, for a draft model, the distributions it sampled
   them from);
2. the target scores the last committed token and the ``k`` drafts in ONE forward over
   ``k + 1`` slots per sequence;
3. :func:`specsample.verify` accepts a prefix of the drafts and emits one more token
   (``method="chain"`` or ``"block"``; greedy where the temperature is 0), with randomness
   keyed by each sequence's seed and absolute position (or, with ``method="typical"``,
   Medusa's lossy typical acceptance does);
4. the emitted tokens are appended; the target's slots of rejected drafts, and the draft
   model's, are masked for good, so both caches stay rectangular while every sequence
   advances by its own accepted length;
5. sequences that produced EOS or reached ``max_new_tokens`` leave the batch (their cache
   rows are dropped), so they stop costing compute, and the next prompts of the queue take
   their places at once (continuous batching: their prompts are prefilled and join the
   caches).

The steps are those of :mod:`specsample.generate.batch`. :func:`target_generate` runs the same
loop without drafts: one target forward per token, sampled by the same
:func:`specsample.verify` processing, so the two are directly comparable.

At most ``max_batch_size`` sequences are decoded at once, entering in prompt order; the
output is in prompt order, and a seeded sequence's output depends only on its prompt, its
seed and its sampling parameters, never on which sequences share its steps (up to
floating-point differences between batch shapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch

from specsample.generate import inputs
from specsample.generate.batch import (
    FinishCallback,
    ProgressCallback,
    Run,
    TokenCallback,
    decode,
)
from specsample.generate.drafters import Drafter, ModelDrafter
from specsample.generate.hf import CachedLM, vocab_size
from specsample.generate.state import SamplingState
from specsample.generate.stats import GenerationStats
from specsample.generate.tree import TreeShape
from specsample.metadata import Scalars
from specsample.methods import METHODS, chain_methods, check_method
from specsample.rules.tree import Drafting, check_traversal_drafting, tree_method

MAX_K = 64
"""Most drafts per step. Every step costs ``k`` draft forwards and a target forward over
``k + 1`` slots per sequence, while the chance that all drafts are accepted decays
geometrically with ``k``; the random streams would allow up to
``specsample.random.STEP_STRIDE - 1``."""


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


def _generate(
    target: Any,
    prompts: object,
    drafter: Drafter | None,
    *,
    k: int,
    method: str,
    sampling: dict[str, Any],
    max_new_tokens: int | Sequence[int],
    eos_token_id: int | Sequence[int] | None,
    seeds: int | Sequence[int | None] | None,
    generator: torch.Generator | None,
    max_batch_size: int | None,
    on_tokens: TokenCallback | None,
    on_progress: ProgressCallback | None,
    on_finish: FinishCallback | None,
    adaptive: bool = False,
    tree: TreeShape | None = None,
) -> GenerationOutput:
    """Validate the call, then decode the prompts ``max_batch_size`` at a time."""
    lm = _target_lm(target)
    prompt_ids = inputs.prompt_list(prompts)
    count = len(prompt_ids)
    budgets = inputs.token_budgets(prompt_ids, max_new_tokens, lm.vocab_size, lm.max_positions)
    batch_size = inputs.check_int(
        "max_batch_size", count if max_batch_size is None else max_batch_size, 1
    )
    state = SamplingState.build(
        count, lm.device, seeds=inputs.seed_list(seeds, count), generator=generator, **sampling
    )
    eos = inputs.eos_ids(eos_token_id)
    run = Run(lm, drafter, k, method, state, eos, on_tokens, on_progress, adaptive, on_finish, tree)
    results: list[list[int]] = [[] for _ in prompt_ids]
    with torch.inference_mode():
        stats = decode(run, prompt_ids, budgets, batch_size, results)
    return GenerationOutput(results, stats)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _target_lm(target: Any) -> CachedLM:
    """``target`` itself, or a :class:`CachedLM` of a causal LM."""
    return target if isinstance(target, CachedLM) else CachedLM(target, role="target")


def _as_drafter(drafter: object, lm: CachedLM) -> Drafter:
    """``drafter`` itself, or a :class:`ModelDrafter` of a causal LM, checked against ``lm``.

    A draft model must know every token the target may emit: its vocabulary may be larger
    than the target's (the extra tokens are never proposed), never smaller. This is checked
    on the config before the draft model runs at all.
    """
    if isinstance(drafter, ModelDrafter):
        draft_vocab = drafter.lm.vocab_size
    elif isinstance(drafter, Drafter):
        return drafter
    elif getattr(drafter, "config", None) is not None:
        draft_vocab = vocab_size(drafter, role="draft")
    else:
        raise TypeError(
            "drafter must be a Drafter (e.g. NGramDrafter()) or a transformers causal LM, "
            f"got {type(drafter).__name__}"
        )
    if draft_vocab < lm.vocab_size:
        raise ValueError(
            f"drafter: the draft model's vocabulary has {draft_vocab} tokens but the target's "
            f"has {lm.vocab_size}; the draft model cannot read every token the target may "
            "emit (are they from the same tokenizer family?)"
        )
    return drafter if isinstance(drafter, ModelDrafter) else ModelDrafter(drafter)


def _tree_rule(tree: object, method: str, source: Drafter) -> str:
    """The tree rule of a tree run: ``method``, or the rule ``tree.drafting`` calls for."""
    if not isinstance(tree, TreeShape):
        raise TypeError(f"tree must be a TreeShape, got {type(tree).__name__}")
    if not isinstance(source, ModelDrafter):
        raise ValueError(f"tree drafting needs a draft model; the {source.name} drafter has none")
    drafting = cast(Drafting, tree.drafting)
    if method == "traversal":
        check_traversal_drafting(drafting)
        return method
    return tree_method(drafting, None if method == "chain" else method)


def _check_context(k: int, lm: CachedLM) -> None:
    """Refuse a ``k`` that is not below the target's context."""
    if lm.max_positions is not None and k >= lm.max_positions:
        raise ValueError(
            f"k must be below the target's context ({lm.max_positions} positions): a step "
            f"scores k + 1 slots, got k={k}"
        )


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
    max_new_tokens: int | Sequence[int] = 64,
    eos_token_id: int | Sequence[int] | None = None,
    seeds: int | Sequence[int | None] | None = None,
    generator: torch.Generator | None = None,
    max_batch_size: int | None = None,
    on_tokens: TokenCallback | None = None,
    on_progress: ProgressCallback | None = None,
    on_finish: FinishCallback | None = None,
    adaptive: bool = True,
    tree: TreeShape | None = None,
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
        :class:`~specsample.generate.ngram.NGramDrafter`), or a draft causal LM sharing
        the target's tokenizer (wrapped in a :class:`~specsample.generate.drafters.ModelDrafter`).
        A draft model's vocabulary (``config.vocab_size``) must be at least the target's.
    k : int
        Drafts per step (the most, with ``adaptive``), in ``[1, MAX_K]`` (64) and below the
        target's context (``max_position_embeddings``).
    method : str
        One of :func:`specsample.methods.chain_methods` ``(lossy=True)``: ``"chain"`` (token
        by token) or ``"block"`` (block verification; needs a drafter that samples, such as
        a draft model), both exact; or ``"typical"``: Medusa's typical acceptance, which is
        LOSSY (its output does not follow the target's distribution; see
        :mod:`specsample.rules.typical`).
    temperature, top_k, top_p, min_p : scalar or sequence
        Sampling parameters, one value or one per prompt, as in :func:`specsample.verify`
        (temperature 0: greedy). The draft model's distributions get the same processing.
    max_new_tokens : int or sequence of int
        Most tokens generated per prompt (one value, or one per prompt), in
        ``[1, MAX_NEW_TOKENS]`` (``2**20``; fewer if the target's context ends first).
    eos_token_id : int or sequence of int, optional
        A sequence stops after producing one of these.
    seeds : int or sequence of (int or None), optional
        Per-prompt seeds (an int ``s`` gives prompt ``i`` the seed ``s + i``); randomness is
        keyed by ``(seed, absolute position)``, drafts and verification on streams of their
        own. Unseeded prompts use ``generator``.
    generator : torch.Generator, optional
        Randomness of unseeded prompts (torch's default generator when ``None``).
    max_batch_size : int, optional
        Decode at most this many prompts at once (default: all). When a sequence finishes,
        the next prompt takes its place before the next step. A step holds about
        ``batch * (k + 1) * vocab`` logits (and as many draft probabilities), so memory grows
        with it, not with the number of prompts.
    on_tokens : callable, optional
        ``on_tokens(prompt_index, new_token_ids)`` every step a sequence grows (one extra
        host transfer per step).
    on_progress : callable, optional
        ``on_progress(finished_sequences, total_sequences, tokens_generated)`` every step.
    on_finish : callable, optional
        ``on_finish(prompt_index, token_ids)`` once per prompt, as soon as it finishes, with
        its generated ids (what ``sequences[prompt_index]`` will hold).
    adaptive : bool
        Choose each step's draft length in ``0..k`` to maximise tokens per second, from the
        acceptance seen so far and the measured step times (:mod:`specsample.generate.policy`;
        0 is a plain decoding step). The choice reads nothing of the step's own randomness,
        so the output law is unchanged. On by default; ``False`` drafts ``k`` every step.
    tree : TreeShape, optional
        Draft a token tree of this shape every step instead of a chain
        (:mod:`specsample.generate.tree`): the draft model (``drafter`` must be one) expands
        it a level per forward, the target scores every node of every sequence's tree in ONE
        forward with a tree attention mask, and only the accepted path's cache slots are
        kept. ``method`` is then a tree rule exact for ``tree.drafting``
        (:func:`specsample.rules.tree.tree_method`; the default ``"chain"`` stands for the
        rule derived from it), or ``"traversal"`` (traversal verification, for sampled
        children), ``k`` and ``adaptive`` are ignored, and greedy rows follow the target's
        argmax down the tree.

    Returns
    -------
    GenerationOutput
        The generated ids per prompt and the run's :class:`GenerationStats`.

    Raises
    ------
    TypeError
        An argument of the wrong type (``drafter`` neither a Drafter nor a causal LM, ...).
    ValueError
        ``k``, ``max_new_tokens``, ``max_batch_size``, a prompt, a seed or a sampling
        parameter out of range (the message names it); ``method`` unknown, or ``"block"``
        with a drafter that does not sample; a draft model whose vocabulary is smaller than
        the target's (both sizes named, before either model decodes); a model that does not
        honour a masked cache.
    """
    lm = _target_lm(target)
    source = _as_drafter(drafter, lm)
    if tree is not None:
        method, k = _tree_rule(tree, method, source), tree.depth
    else:
        check_method(method, chain_methods(lossy=True))
    inputs.check_int("k", k, 1, MAX_K)
    _check_context(k if tree is None else tree.nodes, lm)
    if tree is None and METHODS[method].needs_draft_probs and not source.samples:
        raise ValueError(
            f"method={method!r} needs draft distributions, which the {source.name} drafter "
            "does not provide; use method='chain'"
        )
    return _generate(
        lm,
        prompts,
        source,
        k=k,
        method=method,
        sampling={"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p},
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        seeds=seeds,
        generator=generator,
        max_batch_size=max_batch_size,
        on_tokens=on_tokens,
        on_progress=on_progress,
        on_finish=on_finish,
        adaptive=_flag("adaptive", adaptive) and tree is None,
        tree=tree,
    )


def target_generate(
    target: Any,
    prompts: Sequence[Sequence[int]] | torch.Tensor,
    *,
    temperature: Scalars = 0.0,
    top_k: Scalars = None,
    top_p: Scalars = None,
    min_p: Scalars = None,
    max_new_tokens: int | Sequence[int] = 64,
    eos_token_id: int | Sequence[int] | None = None,
    seeds: int | Sequence[int | None] | None = None,
    generator: torch.Generator | None = None,
    max_batch_size: int | None = None,
    on_tokens: TokenCallback | None = None,
    on_progress: ProgressCallback | None = None,
    on_finish: FinishCallback | None = None,
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
        sampling={"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p},
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        seeds=seeds,
        generator=generator,
        max_batch_size=max_batch_size,
        on_tokens=on_tokens,
        on_progress=on_progress,
        on_finish=on_finish,
    )
