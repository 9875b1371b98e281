"""One call's fixed configuration: models, rule, sampling, limits, callbacks, policy memory.

:class:`Callbacks` gathers what a caller wants to hear while a call runs; :class:`Run` is
everything the steps of one call read and never change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specsample.adapter import CachedLM
from specsample.generate.drafters import Drafter
from specsample.generate.policy import PolicyMemory
from specsample.generate.sampling import SamplingState
from specsample.generate.tree import TreeShape

TokenCallback = Callable[[int, list[int]], None]
"""``on_tokens(sequence_index, new_token_ids)``, called every step a sequence grows."""

ProgressCallback = Callable[[int, int, int], None]
"""``on_progress(finished_sequences, total_sequences, tokens_generated)``, every step."""

FinishCallback = Callable[[int, list[int]], None]
"""``on_finish(sequence_index, generated_token_ids)``, once per sequence, as it finishes."""


@dataclass(frozen=True)
class Callbacks:
    """What a caller hears while a call runs (each optional).

    Attributes
    ----------
    on_tokens : callable, optional
        ``on_tokens(prompt_index, new_token_ids)`` every step a sequence grows (one extra
        host transfer per step).
    on_progress : callable, optional
        ``on_progress(finished_sequences, total_sequences, tokens_generated)`` every step.
    on_finish : callable, optional
        ``on_finish(prompt_index, token_ids)`` once per prompt, as soon as it finishes, with
        its generated ids.

    Examples
    --------
    >>> Callbacks(on_finish=print).on_tokens is None
    True
    """

    on_tokens: TokenCallback | None = None
    on_progress: ProgressCallback | None = None
    on_finish: FinishCallback | None = None


@dataclass(frozen=True, kw_only=True)
class Run:
    """One call's fixed configuration, built keyword by keyword.

    Attributes
    ----------
    lm : CachedLM
        The target.
    drafter : Drafter or None
        ``None``: target-only decoding (``k`` is then 0).
    k : int
        Drafts per step (the most, with ``adaptive``).
    method : str
        Verification rule (a name of :func:`specsample.methods.chain_methods`, or a tree
        rule with ``tree``).
    sampling : SamplingState
        The parameters of every prompt of the call, validated.
    eos : torch.Tensor or None
        ``[n]`` int64 end-of-sequence ids on the target's device (``None``: no EOS).
    callbacks : Callbacks
        What the caller hears.
    adaptive : bool
        Choose each step's draft length in ``0..k`` (:mod:`.policy`); otherwise always
        ``k``. Only with a chain drafter (a drafter and no tree).
    tree : TreeShape or None
        Draft a token tree of this shape every step (the drafter must be a
        :class:`~specsample.generate.drafters.ModelDrafter`; ``method`` is then a tree rule,
        ``k`` the tree's depth).
    memory : PolicyMemory
        The timings and acceptance the policy starts from and keeps up to date.
    """

    lm: CachedLM
    drafter: Drafter | None
    k: int
    method: str
    sampling: SamplingState
    eos: torch.Tensor | None = None
    callbacks: Callbacks = Callbacks()
    adaptive: bool = False
    tree: TreeShape | None = None
    memory: PolicyMemory = field(default_factory=PolicyMemory)
