"""What the masked-cache check of :mod:`specsample.adapter.lm` needs of a bare model.

The check (:func:`specsample.adapter.lm.check_masked_cache`) compares a model's logits
through the loop's cache with its own; here are its tolerance by dtype (:func:`tolerance`),
the diagnosis of attention that turns padding into NaN, and the record of the models that
passed (:func:`passed`, :func:`remember`), so each is checked once.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

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

    Examples
    --------
    >>> tolerance(torch.nn.Linear(1, 1), torch.tensor([1.0, -3.0]))
    0.004
    """
    if atol is None:
        half = getattr(model, "dtype", torch.float32) in (torch.float16, torch.bfloat16)
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
