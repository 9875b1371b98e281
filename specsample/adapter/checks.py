"""What the masked-cache check of :mod:`specsample.adapter.lm` needs of a bare model.

The check (:func:`specsample.adapter.lm.check_masked_cache`) compares a model's logits
through the loop's cache with its own; here are its tolerance by dtype (:func:`tolerance`),
the diagnosis of NaN logits (:func:`nan_diagnosis`: broken weights, or attention that turns
padding into NaN), and the record of the models that passed (:func:`passed`,
:func:`remember`), so each is checked once.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

from specsample.adapter.config import text_config
from specsample.adapter.quantize import computes_in_bfloat16

_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Models that passed the masked-cache check (checked once per model object)."""


def remember(model: Any) -> None:
    """Record that ``model`` passed the masked-cache check (nothing if it cannot be)."""
    with contextlib.suppress(TypeError):
        _CHECKED.add(model)


def passed(model: Any) -> bool:
    """Whether ``model`` passed the masked-cache check already (``False`` if it cannot be
    remembered)."""
    try:
        return model in _CHECKED
    except TypeError:
        return False


def tolerance(model: Any, reference: torch.Tensor, atol: float | None = None) -> float:
    """How far probe logits may stray: ``atol`` (default by dtype) times the logits' scale.

    A model with quantized linear layers computes them in bfloat16
    (:func:`~specsample.adapter.quantize.computes_in_bfloat16`): it gets the tolerance of
    a half-precision one.

    Examples
    --------
    >>> tolerance(torch.nn.Linear(1, 1), torch.tensor([1.0, -3.0]))
    0.004
    """
    if atol is None:
        half = getattr(model, "dtype", torch.float32) in (torch.float16, torch.bfloat16)
        half = half or computes_in_bfloat16(model)
        atol = 5e-2 if half else 1e-3
    return atol * (1.0 + float(reference.abs().max()))


def nan_when_padded(model: Any, tokens: torch.Tensor) -> bool:
    """Whether ``model`` gives NaN logits for ``tokens [1, n]`` behind one padding slot."""
    padded = torch.cat([torch.zeros_like(tokens[:, :1]), tokens], dim=1)
    mask = torch.ones_like(padded)
    mask[:, 0] = 0
    with torch.inference_mode():
        logits = model(input_ids=padded, attention_mask=mask).logits
    return bool(logits[:, 1:].isnan().any())


def nan_unpadded(model: Any, tokens: torch.Tensor) -> bool:
    """Whether ``model`` gives NaN logits for ``tokens [1, n]`` alone: no padding, no cache."""
    with torch.inference_mode():
        logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
    return bool(logits.isnan().any())


def nan_diagnosis(model: Any, tokens: torch.Tensor, role: str) -> str | None:
    """Why ``model`` gave NaN logits through the cache, when it does without it too.

    A model that returns NaN for the plain input ``tokens [1, n]`` is broken itself (its
    weights, named when one holds NaN or infinity); one that does only behind a padding
    slot has attention that turns a slot attending to nothing into NaN. ``None``: neither,
    the cache is at fault (the caller reports it).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> class Model(torch.nn.Linear):
    ...     def forward(self, input_ids, attention_mask):
    ...         return SimpleNamespace(logits=super().forward(input_ids[..., None].float()))
    >>> model = Model(1, 4)
    >>> _ = model.weight.data.fill_(float("nan"))
    >>> nan_diagnosis(model, torch.tensor([[1, 2]]), "draft")  # doctest: +ELLIPSIS
    'the draft model returns NaN logits for a plain input ...(the first: weight); load ...'
    """
    if nan_unpadded(model, tokens):
        bad = next(
            (
                name
                for name, parameter in model.named_parameters()
                if parameter.is_floating_point() and not bool(parameter.isfinite().all())
            ),
            None,
        )
        where = (
            f"its weights hold NaN or infinity (the first: {bad})"
            if bad is not None
            else "its weights or its computation overflow"
        )
        return (
            f"the {role} model returns NaN logits for a plain input (no padding, no cache): "
            f"the model itself is broken, {where}; load intact weights"
        )
    if not nan_when_padded(model, tokens):
        return None
    implementation = getattr(text_config(model), "_attn_implementation", None)
    return (
        f"the {role} model returns NaN for a left-padded input even without a cache "
        f"(attention {implementation!r}, {getattr(model, 'dtype', 'unknown dtype')}): "
        "a padding slot that attends to nothing turns its softmax into NaN, as "
        "transformers' own padded batches do; load the model with "
        "attn_implementation='sdpa' or in float32"
    )
