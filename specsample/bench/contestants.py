"""The timed contestants: ours (its default backend, and its PyTorch backend), the naive
reference, transformers and the memory-read floor."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

import torch

from specsample.bench.inputs import BenchInputs
from specsample.sampler import RejectionSampler
from specsample.testing.reference import naive_rejection_sample

CONTESTANTS = ("ours", "torch", "naive", "hf", "floor")
"""Names of the timed contestants: ``ours`` is :class:`RejectionSampler` with its default
backend (``"auto"``: the fused CPU backend on CPU tensors when numba is installed, Triton on
CUDA), ``torch`` the same sampler on its PyTorch backend."""

SLOW = ("naive", "hf")
"""Contestants timed ``slow_repeats`` times rather than ``repeats`` times."""

_HF_MODULES = ("transformers.generation.utils", "transformers.generation.candidate_generator")

_HF_ARGUMENTS = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")


def _find_transformers_sampler() -> tuple[Callable[..., Any] | None, str]:
    """transformers' ``_speculative_sampling`` and a note on what was found."""
    if importlib.util.find_spec("transformers") is None:
        return None, "hf: transformers is not installed; skipped"
    try:
        import transformers

        version = getattr(transformers, "__version__", "?")
        for name in _HF_MODULES:
            fn = getattr(importlib.import_module(name), "_speculative_sampling", None)
            if callable(fn):
                return fn, f"hf: {name}._speculative_sampling from transformers {version}"
    except Exception as exc:
        return None, f"hf: transformers failed to import ({type(exc).__name__}: {exc}); skipped"
    return None, f"hf: transformers {version} has no _speculative_sampling; skipped"


def _transformers_call(fn: Callable[..., Any], inputs: BenchInputs) -> Callable[[], object] | None:
    """A call of ``fn`` on every sequence of ``inputs``, or ``None`` for an unknown signature.

    The logits are prepared here, outside the timed call: ``log`` of the draft rows
    ``[batch, 1, k, vocab]`` and of the target rows plus the bonus row
    ``[batch, 1, k + 1, vocab]``, whose softmax gives back the probabilities.
    """
    params = inspect.signature(fn).parameters
    batch, k, _ = inputs.target_probs.shape
    extra: dict[str, object] = {}
    for name, value in (
        ("is_done_candidate", False),
        ("last_assistant_token_is_eos", False),
        ("max_matches", k),
    ):
        if name in params:
            extra[name] = value
    known = set(_HF_ARGUMENTS) | set(extra)
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    if not set(_HF_ARGUMENTS) <= set(params) or not required <= known:
        return None
    draft_logits = inputs.draft_probs.log().unsqueeze(1)
    target_rows = torch.cat([inputs.target_probs, inputs.bonus_probs.unsqueeze(1)], dim=1)
    target_logits = target_rows.log().unsqueeze(1)
    ids = inputs.draft_token_ids.unsqueeze(1)

    def call() -> object:
        return [
            fn(
                candidate_input_ids=ids[b],
                candidate_logits=draft_logits[b],
                candidate_length=k,
                new_logits=target_logits[b],
                **extra,
            )
            for b in range(batch)
        ]

    return call


def _contestant_calls(
    inputs: BenchInputs, hf: Callable[..., Any] | None, seed: int
) -> dict[str, Callable[[], object] | None]:
    """One call per name of :data:`CONTESTANTS` on ``inputs`` (``None``: it cannot run)."""
    target, bonus, draft, ids, _ = inputs
    gen = torch.Generator(device=target.device).manual_seed(seed)
    sampler, eager = RejectionSampler(), RejectionSampler(backend="torch")
    return {
        "ours": lambda: sampler(target, bonus, draft, ids, generator=gen),
        "torch": lambda: eager(target, bonus, draft, ids, generator=gen),
        "naive": lambda: naive_rejection_sample(target, bonus, draft, ids, generator=gen),
        "hf": _transformers_call(hf, inputs) if hf is not None else None,
        "floor": lambda: (target[:, 0].sum(-1), draft[:, 0].sum(-1)),
    }
