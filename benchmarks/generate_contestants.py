"""The contestants of ``bench_generate.py``: transformers' own generation and ours.

Every contestant is a :class:`Contestant`: a set of prompts and a function that generates
their continuations. :meth:`Contestant.tokens_per_s` times that whole call with
:class:`specsample.timing.Stopwatch` and counts the generated tokens in what it returned (EOS
included), the same way for both sides.

transformers generates one prompt at a time (its assisted generation and prompt lookup
support batch size 1 only) with an explicit :class:`transformers.GenerationConfig`. The
number of drafts of assisted generation is read from the *assistant's* generation config,
not from the call's, so each assisted contestant installs its own config on the draft
model before generating.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from specsample.generate import NGramDrafter, PolicyMemory, speculative_generate, target_generate
from specsample.timing import Stopwatch

Prompts = list[list[int]]
Generate = Callable[[Prompts, int], list[list[int]]]
"""Continue every prompt by at most ``max_new_tokens``; the new tokens of each prompt."""

HF_TARGET = "hf target"
HF_ASSISTED = "hf assisted"
HF_LOOKUP = "hf prompt lookup"
OURS_TARGET = "ours target"
DRAFTS = ("model", "n-gram")

SEED_STRIDE = 1000
"""Seeds between two calls of one of our contestants (more than the prompts of a call)."""


def hf_assisted_k(k: int) -> str:
    """Name of transformers' assisted generation with ``k`` drafts per step, always."""
    return f"hf assisted k={k}"


def ours(adaptive: bool, drafts: str) -> str:
    """Name of our speculative generation with ``drafts`` (one of :data:`DRAFTS`)."""
    return f"ours {'adaptive' if adaptive else 'fixed k'} ({drafts})"


class Slot(NamedTuple):
    """What a contestant is: a section of the report, a name, a temperature, a batch size."""

    section: str
    name: str
    temperature: float
    batch: int


class Contestant(NamedTuple):
    """A slot, its prompts and the call that generates them."""

    slot: Slot
    prompts: Prompts
    generate: Generate

    def tokens_per_s(self, max_new_tokens: int) -> float:
        """Generated tokens per second of one timed call."""
        watch = Stopwatch()
        sequences = self.generate(self.prompts, max_new_tokens)
        return sum(map(len, sequences)) / watch.elapsed()


def _hf_config(target: Any, temperature: float, max_new_tokens: int, eos: int) -> Any:
    """The target's generation config, set for this run (no top-k cut when sampling)."""
    config = copy.deepcopy(target.generation_config)
    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_k": 0}
        if temperature > 0
        else {"do_sample": False}
    )
    config.update(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos, **sampling)
    return config


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def hf_generate(
    target: Any,
    temperature: float,
    eos: int,
    *,
    assistant: Any = None,
    assistant_config: Any = None,
    lookup: int | None = None,
) -> Generate:
    """transformers' ``generate``, prompt by prompt.

    Parameters
    ----------
    target : transformers.PreTrainedModel
    temperature : float
        0 decodes greedily.
    eos : int
        Stops a sequence; also its padding token.
    assistant : transformers.PreTrainedModel, optional
        Draft model of assisted generation, run with ``assistant_config`` as its generation
        config.
    lookup : int, optional
        Prompt lookup with this many drafts per step.
    """

    def generate(prompts: Prompts, max_new_tokens: int) -> list[list[int]]:
        config = _hf_config(target, temperature, max_new_tokens, eos)
        config.update(prompt_lookup_num_tokens=lookup)
        if assistant is not None:
            assistant.generation_config = assistant_config
        sequences = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=config,
                assistant_model=assistant,
            )
            sequences.append(_until_eos(out[0, len(prompt) :].tolist(), eos))
        return sequences

    return generate


def hf_contestants(
    target: Any, draft: Any, temperature: float, k: int, eos: int
) -> dict[str, Generate]:
    """The four transformers contestants at ``temperature``, by name.

    ``hf assisted`` keeps the draft model's own generation config, that is transformers'
    defaults; ``hf assisted k=K`` drafts ``k`` tokens every step (constant schedule, no
    early stop on the assistant's confidence).
    """
    default = copy.deepcopy(draft.generation_config)
    fixed = copy.deepcopy(default)
    fixed.update(
        num_assistant_tokens=k,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
    )
    return {
        HF_TARGET: hf_generate(target, temperature, eos),
        HF_ASSISTED: hf_generate(
            target, temperature, eos, assistant=draft, assistant_config=default
        ),
        hf_assisted_k(k): hf_generate(
            target, temperature, eos, assistant=draft, assistant_config=fixed
        ),
        HF_LOOKUP: hf_generate(target, temperature, eos, lookup=k),
    }


def ours_generate(
    target: Any,
    temperature: float,
    batch: int,
    eos: int,
    *,
    drafter: Any = None,
    k: int = 0,
    adaptive: bool = False,
    memory: PolicyMemory | None = None,
) -> Generate:
    """Our generation, ``batch`` sequences at a time: speculative with ``drafter`` (a draft
    model or an :class:`NGramDrafter`), target-only without. With ``memory``, the adaptive
    draft length starts from what the calls given the same one learnt.

    Call ``c`` of a contestant seeds prompt ``i`` with ``SEED_STRIDE * c + i``: in a round
    every one of ours samples with the same seeds, and each round with other ones. With a
    single set of seeds, each contestant would meet the same luck every round (seeded draws
    depend on the draft lengths, so a sequence that stops early at EOS under one contestant
    may run to its budget under another, and a batch whose sequences end early spends its
    last steps nearly empty), and a ratio at T > 0 would measure that luck, not speed.
    """
    calls = itertools.count()

    def generate(prompts: Prompts, max_new_tokens: int) -> list[list[int]]:
        common: dict[str, Any] = {
            "temperature": temperature,
            "max_new_tokens": max_new_tokens,
            "eos_token_id": eos,
            "seeds": SEED_STRIDE * next(calls),
            "max_batch_size": batch,
        }
        if drafter is None:
            return target_generate(target, prompts, **common).sequences
        return speculative_generate(
            target, prompts, drafter, k=k, adaptive=adaptive, memory=memory, **common
        ).sequences

    return generate


def ours_contestants(
    target: Any,
    draft: Any,
    temperature: float,
    batch: int,
    k: int,
    eos: int,
    memory: PolicyMemory,
) -> dict[str, Generate]:
    """Our five contestants at ``temperature`` and ``batch``, by name; their adaptive draft
    lengths share ``memory`` (what the policy learnt of timings and acceptance)."""
    contestants = {OURS_TARGET: ours_generate(target, temperature, batch, eos)}
    for drafts, drafter in zip(DRAFTS, (draft, NGramDrafter()), strict=True):
        for adaptive in (False, True):
            contestants[ours(adaptive, drafts)] = ours_generate(
                target,
                temperature,
                batch,
                eos,
                drafter=drafter,
                k=k,
                adaptive=adaptive,
                memory=memory,
            )
    return contestants
