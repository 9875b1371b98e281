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

The steps are those of :mod:`specsample.generate.loop` over the active sequences of
:mod:`specsample.generate.batch`. :func:`target_generate` runs the same loop without drafts:
one target forward per token, sampled by the same :func:`specsample.verify` processing, so
the two are directly comparable. Both are thin wrappers of a :class:`Decoder`, the reusable
object that holds the models, the configuration and the draft-length policy's
:class:`~specsample.generate.policy.PolicyMemory` across its calls.

At most ``max_batch_size`` sequences are decoded at once, entering in prompt order; the
output is in prompt order, and a seeded sequence's output depends only on its prompt, its
seed and its sampling parameters, never on which sequences share its steps (up to
floating-point differences between batch shapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch
from typing_extensions import TypedDict, Unpack

from specsample.adapter import CachedLM, vocab_size
from specsample.generate import inputs
from specsample.generate.batch import Batch
from specsample.generate.config import (
    Callbacks,
    FinishCallback,
    ProgressCallback,
    Run,
    TokenCallback,
)
from specsample.generate.drafters import Drafter, ModelDrafter
from specsample.generate.loop import decode
from specsample.generate.policy import PolicyMemory
from specsample.generate.sampling import SamplingState
from specsample.generate.stats import GenerationStats
from specsample.generate.tree import TreeShape
from specsample.methods import (
    METHODS,
    Drafting,
    chain_methods,
    check_method,
    check_traversal_drafting,
    tree_method,
    tree_methods,
)
from specsample.params import SamplingParams, Seeds
from specsample.params.checks import check_flag, check_int
from specsample.params.metadata import Scalars

MAX_K = 64
"""Most drafts per step. Every step costs ``k`` draft forwards and a target forward over
``k + 1`` slots per sequence, while the chance that all drafts are accepted decays
geometrically with ``k``; the random streams would allow up to
``specsample.random.STEP_STRIDE - 1``."""


class GenerationOutput(NamedTuple):
    """What :meth:`Decoder.generate`, :func:`speculative_generate` and
    :func:`target_generate` return.

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


class CallOptions(TypedDict, total=False):
    """The keyword options of :func:`target_generate` (and of :func:`speculative_generate`),
    as :func:`speculative_generate` documents them."""

    temperature: Scalars
    top_k: Scalars
    top_p: Scalars
    min_p: Scalars
    seeds: int | Sequence[int | None] | None
    generator: torch.Generator | None
    max_new_tokens: int | Sequence[int]
    eos_token_id: int | Sequence[int] | None
    max_batch_size: int | None
    on_tokens: TokenCallback | None
    on_progress: ProgressCallback | None
    on_finish: FinishCallback | None


class SpeculativeOptions(CallOptions, total=False):
    """The keyword options of :func:`speculative_generate`: those of :class:`CallOptions`
    and the configuration of its :class:`Decoder`."""

    k: int
    method: str
    adaptive: bool
    tree: TreeShape | None
    memory: PolicyMemory | None


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
    if method == "gumbel":
        raise ValueError(
            "method='gumbel' verifies chains of drafts; tree drafting takes a tree rule "
            f"{tree_methods()!r}"
        )
    return tree_method(drafting, None if method == "chain" else method)


def _check_context(k: int, lm: CachedLM) -> None:
    """Refuse a ``k`` that is not below the target's context."""
    if lm.max_positions is not None and k >= lm.max_positions:
        raise ValueError(
            f"k must be below the target's context ({lm.max_positions} positions): a step "
            f"scores k + 1 slots, got k={k}"
        )


class Decoder:
    """A target (and a drafter) with the configuration of their decoding, reusable.

    Every :meth:`generate` call decodes its prompts with the same models and rule; the
    draft-length policy of every call starts from what the earlier calls given the same
    :attr:`memory` measured (step timings) and saw (acceptance of first drafts).

    Parameters
    ----------
    target : transformers.PreTrainedModel or CachedLM
        The causal LM to sample from (eval mode). Its forward must honour an attention mask
        and explicit position ids with a cache (:func:`specsample.adapter.check_masked_cache`).
    drafter : Drafter or transformers.PreTrainedModel, optional
        A :class:`~specsample.generate.drafters.Drafter` (e.g. an
        :class:`~specsample.generate.ngram.NGramDrafter`), or a draft causal LM sharing
        the target's tokenizer (wrapped in a :class:`~specsample.generate.drafters.ModelDrafter`),
        whose vocabulary (``config.vocab_size``) must be at least the target's. ``None``:
        target-only decoding (``k``, ``method``, ``adaptive`` are then ignored).
    k : int
        Drafts per step (the most, with ``adaptive``), in ``[1, MAX_K]`` (64) and below the
        target's context (``max_position_embeddings``).
    method : str
        One of :func:`specsample.methods.chain_methods` ``(lossy=True)``: ``"chain"`` (token
        by token) or ``"block"`` (block verification; needs a drafter that samples, such as
        a draft model), both exact; ``"gumbel"`` (exact and drafter-invariant: a seeded
        sequence's output is the one :func:`target_generate` gives for the same seed, whatever
        the drafter, ``k``, the batch or the threads; a draft model then proposes its own
        keyed Gumbel-max tokens, see :mod:`specsample.rules.gumbel`); or ``"typical"``:
        Medusa's typical acceptance, which is LOSSY (its output does not follow the target's
        distribution; see the rule's entry in :data:`specsample.methods.METHODS`).
    adaptive : bool
        Choose each step's draft length in ``0..k`` to maximise tokens per second, from the
        acceptance seen so far and the measured step times (:mod:`specsample.generate.policy`;
        0 is a plain decoding step). The choice reads nothing of the step's own randomness,
        so the output law is unchanged. ``False`` drafts ``k`` every step.
    tree : TreeShape, optional
        Draft a token tree of this shape every step instead of a chain
        (:mod:`specsample.generate.tree`): the draft model (``drafter`` must be one) expands
        it a level per forward, the target scores every node of every sequence's tree in ONE
        forward with a tree attention mask, and only the accepted path's cache slots are
        kept. ``method`` is then a tree rule exact for ``tree.drafting``
        (:func:`specsample.methods.tree_method`; the default ``"chain"`` stands for the
        rule derived from it), or ``"traversal"`` (traversal verification, for sampled
        children), ``k`` and ``adaptive`` are ignored, and greedy rows follow the target's
        argmax down the tree.
    memory : PolicyMemory, optional
        What the draft-length policy starts from and keeps up to date (default: a new one,
        which this decoder's calls share).

    Raises
    ------
    TypeError
        An argument of the wrong type (``drafter`` neither a Drafter nor a causal LM, ...).
    ValueError
        ``k`` out of range; ``method`` unknown, or ``"block"`` with a drafter that does not
        sample; a draft model whose vocabulary is smaller than the target's (both sizes
        named, before either model decodes); a model that does not honour a masked cache.
    """

    def __init__(
        self,
        target: Any,
        drafter: Drafter | Any | None = None,
        *,
        k: int = 4,
        method: str = "chain",
        adaptive: bool = True,
        tree: TreeShape | None = None,
        memory: PolicyMemory | None = None,
    ) -> None:
        self.lm = _target_lm(target)
        if memory is not None and not isinstance(memory, PolicyMemory):
            raise TypeError(f"memory must be a PolicyMemory, got {type(memory).__name__}")
        self.memory = PolicyMemory() if memory is None else memory
        self.tree = tree
        if drafter is None:
            if tree is not None:
                raise ValueError("tree drafting needs a draft model; drafter is None")
            self.drafter: Drafter | None = None
            self.k, self.method, self.adaptive = 0, "chain", False
            return
        source = _as_drafter(drafter, self.lm)
        if tree is not None:
            method, k = _tree_rule(tree, method, source), tree.depth
        else:
            check_method(method, chain_methods(lossy=True))
        check_int("k", k, 1, MAX_K)
        _check_context(k if tree is None else tree.nodes, self.lm)
        if tree is None and METHODS[method].needs_draft_probs and not source.samples:
            raise ValueError(
                f"method={method!r} needs draft distributions, which the {source.name} "
                "drafter does not provide; use method='chain'"
            )
        self.drafter, self.k, self.method = source, k, method
        self.adaptive = check_flag("adaptive", adaptive) and tree is None

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | torch.Tensor,
        sampling: SamplingParams | None = None,
        *,
        max_new_tokens: int | Sequence[int] = 64,
        eos_token_id: int | Sequence[int] | None = None,
        max_batch_size: int | None = None,
        callbacks: Callbacks | None = None,
    ) -> GenerationOutput:
        """Generate from the target, a batch of prompts at a time.

        With a drafter, the output follows the target's processed distribution exactly
        (and, at temperature 0, equals the target's greedy decoding token for token),
        unless ``method="typical"``.

        Parameters
        ----------
        prompts : sequence of sequences of int, or torch.Tensor
            Token ids of each prompt (ragged), or a ``[batch, length]`` integer tensor.
        sampling : SamplingParams, optional
            What each prompt asks, one value or one per prompt (default: greedy,
            ``SamplingParams(temperature=0.0)``): temperature, top-k, top-p and min-p as
            in :func:`specsample.verify` (the draft model's distributions get the same
            processing); ``seeds`` one per prompt (randomness keyed by ``(seed, absolute
            position)``, drafts and verification on streams of their own); the other
            prompts draw from ``generators`` or ``generator``.
        max_new_tokens : int or sequence of int
            Most tokens generated per prompt (one value, or one per prompt), in
            ``[1, MAX_NEW_TOKENS]`` (``2**20``; fewer if the target's context ends first).
        eos_token_id : int or sequence of int, optional
            A sequence stops after producing one of these.
        max_batch_size : int, optional
            Decode at most this many prompts at once (default: all). When a sequence
            finishes, the next prompt takes its place before the next step. A step holds
            about ``batch * (k + 1) * vocab`` logits (and as many draft probabilities), so
            memory grows with it, not with the number of prompts.
        callbacks : Callbacks, optional
            What to call while the prompts decode (``on_finish`` gets what
            ``sequences[prompt_index]`` will hold).

        Returns
        -------
        GenerationOutput
            The generated ids per prompt and the run's :class:`GenerationStats`.

        Raises
        ------
        TypeError
            An argument of the wrong type.
        ValueError
            ``max_new_tokens``, ``max_batch_size``, a prompt, a seed or a sampling
            parameter out of range (the message names it).

        """
        lm = self.lm
        prompt_ids = inputs.prompt_list(prompts)
        count = len(prompt_ids)
        budgets = inputs.token_budgets(prompt_ids, max_new_tokens, lm.vocab_size, lm.max_positions)
        size = check_int("max_batch_size", count if max_batch_size is None else max_batch_size, 1)
        params = SamplingParams(temperature=0.0) if sampling is None else sampling
        method = self.method
        if self.drafter is None and _seeded(params.seeds):
            method = "gumbel"  # seeded target-only decoding: the tokens method="gumbel" emits
        state = SamplingState.build(count, lm.device, params, keyed=METHODS[method].keyed)
        eos = inputs.eos_ids(eos_token_id)
        if callbacks is not None and not isinstance(callbacks, Callbacks):
            raise TypeError(f"callbacks must be a Callbacks, got {type(callbacks).__name__}")
        run = Run(
            lm=lm,
            drafter=self.drafter,
            k=self.k,
            method=method,
            sampling=state,
            eos=torch.tensor(eos, dtype=torch.int64, device=lm.device) if eos else None,
            callbacks=Callbacks() if callbacks is None else callbacks,
            adaptive=self.adaptive,
            tree=self.tree,
            memory=self.memory,
        )
        results: list[list[int]] = [[] for _ in prompt_ids]
        with torch.inference_mode():
            stats = decode(Batch(run, prompt_ids, budgets, size), results)
        return GenerationOutput(results, stats)


def _seeded(seeds: Seeds | None) -> bool:
    """Whether any prompt has a seed (a tensor's negative entries and ``None`` have none)."""
    if isinstance(seeds, torch.Tensor):
        return bool((seeds >= 0).any())
    return seeds is not None and any(s is not None and s >= 0 for s in seeds)


def _seeds(seeds: object, prompts: object) -> Seeds | None:
    """The seeds as :class:`SamplingParams` takes them: an int ``s`` gives prompt ``i`` the
    seed ``s + i``; anything else as given (validated with the other parameters)."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return inputs.seed_list(seeds, len(inputs.prompt_list(prompts)))
    return cast("Seeds | None", seeds)


_DECODER_OPTIONS = ("k", "method", "adaptive", "tree", "memory")
"""The keyword options of :func:`speculative_generate` that configure the :class:`Decoder`."""

_GENERATE_OPTIONS = ("max_new_tokens", "eos_token_id", "max_batch_size")
"""The keyword options that :meth:`Decoder.generate` takes as they are."""


def _taken(options: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The ``options`` among ``names``, removed from ``options``: what was not given keeps
    the default of the function it goes to."""
    return {name: options.pop(name) for name in names if name in options}


def _call(decoder: Decoder, prompts: Any, options: CallOptions, name: str) -> GenerationOutput:
    """``decoder.generate`` with the flat keyword ``options`` of the wrapper ``name``
    gathered into objects (any other keyword is refused)."""
    for option in options:
        if option not in CallOptions.__optional_keys__:
            raise TypeError(f"{name}() got an unexpected keyword argument {option!r}")
    sampling = SamplingParams(
        temperature=options.get("temperature", 0.0),
        top_k=options.get("top_k"),
        top_p=options.get("top_p"),
        min_p=options.get("min_p"),
        seeds=_seeds(options.get("seeds"), prompts),
        generator=options.get("generator"),
    )
    callbacks = Callbacks(
        on_tokens=options.get("on_tokens"),
        on_progress=options.get("on_progress"),
        on_finish=options.get("on_finish"),
    )
    limits = _taken(cast("dict[str, Any]", options), _GENERATE_OPTIONS)
    return decoder.generate(prompts, sampling, callbacks=callbacks, **limits)


def speculative_generate(
    target: Any,
    prompts: Sequence[Sequence[int]] | torch.Tensor,
    drafter: Drafter | Any,
    **options: Unpack[SpeculativeOptions],
) -> GenerationOutput:
    """Generate from ``target`` with speculative decoding, a batch of prompts at a time.

    The output follows the target's processed distribution exactly (and, at temperature 0,
    equals the target's greedy decoding token for token). A thin wrapper of
    ``Decoder(target, drafter, k=..., ...).generate(prompts, ...)``: the keyword options
    are gathered into a :class:`Decoder`, a :class:`~specsample.params.SamplingParams`
    (whose ``temperature`` defaults to 0 here) and :class:`~specsample.generate.config.Callbacks`.

    Parameters
    ----------
    target : transformers.PreTrainedModel or CachedLM
        The causal LM to sample from (see :class:`Decoder`).
    prompts : sequence of sequences of int, or torch.Tensor
        Token ids of each prompt (ragged), or a ``[batch, length]`` integer tensor.
    drafter : Drafter or transformers.PreTrainedModel
        What proposes the drafts (see :class:`Decoder`).
    **options
        Keyword options, each optional. Those of the :class:`Decoder`: ``k`` (default 4),
        ``method`` (``"chain"``), ``adaptive`` (``True``), ``tree`` and ``memory`` (default:
        none, the call starts fresh; calls given the same one share what the draft-length
        policy learnt). Those of :meth:`Decoder.generate`: ``max_new_tokens`` (default 64),
        ``eos_token_id`` and ``max_batch_size``. The sampling parameters, one value or one
        per prompt, as in :func:`specsample.verify`: ``temperature`` (default 0: greedy),
        ``top_k``, ``top_p``, ``min_p``; ``seeds``, an int ``s`` giving prompt ``i`` the
        seed ``s + i``, or one per prompt (randomness keyed by ``(seed, absolute
        position)``); ``generator``, the randomness of unseeded prompts. The callbacks:
        ``on_tokens(prompt_index, new_token_ids)`` every step a sequence grows,
        ``on_progress(finished_sequences, total_sequences, tokens_generated)`` every step,
        ``on_finish(prompt_index, token_ids)`` once per prompt as it finishes.

    Returns
    -------
    GenerationOutput
        What :meth:`Decoder.generate` returns.

    Raises
    ------
    TypeError, ValueError
        As :class:`Decoder` and :meth:`Decoder.generate` (the message names the argument);
        ``TypeError`` for an unknown keyword.
    """
    given = cast("dict[str, Any]", options)
    decoder = Decoder(target, drafter, **_taken(given, _DECODER_OPTIONS))
    return _call(decoder, prompts, options, "speculative_generate")


def target_generate(
    target: Any,
    prompts: Sequence[Sequence[int]] | torch.Tensor,
    **options: Unpack[CallOptions],
) -> GenerationOutput:
    """Generate from ``target`` alone, one forward per token: the baseline to compare with.

    Tokens are drawn by :func:`specsample.verify` without drafts, so the processing
    (temperature, top-k, top-p, min-p; greedy at temperature 0) and the randomness keyed by
    ``(seed, position)`` are those of :func:`speculative_generate`. With seeds, every token is
    the keyed Gumbel-max sample of ``method="gumbel"``: ``speculative_generate(...,
    method="gumbel")`` with the same seeds gives the same tokens (:mod:`specsample.rules.gumbel`).
    A thin wrapper of ``Decoder(target).generate(prompts, ...)``.

    Parameters
    ----------
    target : transformers.PreTrainedModel or CachedLM
        The causal LM to sample from.
    prompts : sequence of sequences of int, or torch.Tensor
        The prompts, as :func:`speculative_generate` takes them.
    **options
        The keyword options of :func:`speculative_generate` but those of the
        :class:`Decoder` (``k``, ``method``, ``adaptive``, ``tree``, ``memory``).

    Returns
    -------
    GenerationOutput
        What :meth:`Decoder.generate` returns.
    """
    return _call(Decoder(target), prompts, options, "target_generate")
