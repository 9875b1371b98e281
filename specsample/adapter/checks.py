"""Whether a model computes through the loop's cache what it computes without one.

:func:`verify_masked_cache` feeds a short sequence through a cached LM in two blocks, with
left padding and a masked garbage slot between them, at explicit position ids, and compares
the last logits with those of the model's own forward without a cache; a model that ignores
the mask or the positions is refused with a ``ValueError``. Models that passed are
remembered (:func:`passed`), so each is checked once.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import TYPE_CHECKING, Any

import torch

from specsample.adapter.config import text_config

if TYPE_CHECKING:
    from specsample.adapter.lm import CachedLM

_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Models that passed :func:`verify_masked_cache` (checked once per model object)."""


def passed(model: Any) -> bool:
    """Whether ``model`` passed :func:`verify_masked_cache` already (``False`` if it cannot be
    remembered)."""
    try:
        return model in _CHECKED
    except TypeError:
        return False


def verify_masked_cache(lm: CachedLM, role: str, atol: float | None = None) -> None:
    """Check that ``lm.model`` honours a masked slot and explicit positions through ``lm``.

    The check behind :func:`specsample.adapter.lm.check_masked_cache`, on a cached LM that
    runs the model's own forward; ``role`` names the model in messages and ``atol`` bounds
    the logits' difference (default: by the model's dtype, :func:`tolerance`).

    Raises
    ------
    ValueError
        The model ignores the mask or the position ids, or returns NaN for a left-padded
        input even without a cache.
    """
    got, reference, tokens = probe(lm)
    error = float((got - reference).abs().max())
    if math.isnan(error) and _nan_when_padded(lm.model, tokens):
        implementation = getattr(text_config(lm.model), "_attn_implementation", None)
        raise ValueError(
            f"the {role} model returns NaN for a left-padded input even without a cache "
            f"(attention {implementation!r}, {getattr(lm.model, 'dtype', 'unknown dtype')}): "
            "a padding slot that attends to nothing turns its softmax into NaN, as "
            "transformers' own padded batches do; load the model with "
            "attn_implementation='sdpa' or in float32"
        )
    if not error <= tolerance(lm.model, reference, atol):
        raise ValueError(
            f"the {role} model does not honour attention_mask and position_ids with a cache "
            f"(logits differ by {error:.3g}); it cannot be used for batched speculative decoding"
        )
    with contextlib.suppress(TypeError):
        _CHECKED.add(lm.model)


def probe(lm: CachedLM) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The last two logits of a probe sequence through ``lm``'s cache, and without a cache.

    The sequence goes through the cache in two blocks, with left padding and a masked
    garbage slot between them, at explicit positions; for a model with a sliding window of
    up to 37 positions it is longer than the window, so the window's edge is covered too.

    Returns
    -------
    tuple of torch.Tensor
        ``(cached, reference, tokens)``: ``[2, vocab]`` float32 each, and the probe's
        ``[1, length]`` tokens.
    """
    device = lm.device
    vocab = lm.vocab_size
    length = 6
    if lm.attention.window is not None:
        length = max(length, min(lm.attention.window + 3, 40))
    tokens = (torch.arange(length, device=device) * 5 + 1).remainder(vocab).unsqueeze(0)
    half = length // 2
    with torch.inference_mode():
        reference = lm.model(input_ids=tokens).logits[0, -2:].to(torch.float32)
        lm.reset(1)
        pad = torch.zeros(1, 1, dtype=torch.int64, device=device)
        first = torch.cat([pad, tokens[:, :half], pad + 9 % vocab], dim=1)
        positions = torch.arange(half + 1, device=device)
        lm.forward(
            first,
            torch.cat([pad, positions.unsqueeze(0)], dim=1),
            valid=torch.cat([pad, torch.ones_like(tokens[:, :half]), pad], dim=1),
        )
        rest = torch.arange(half, length, device=device).unsqueeze(0)
        got = lm.forward(tokens[:, half:], rest, keep=2)[0]
    return got.to(torch.float32), reference, tokens


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


def _nan_when_padded(model: Any, tokens: torch.Tensor) -> bool:
    """Whether ``model`` gives NaN logits for ``tokens [1, n]`` behind one padding slot."""
    padded = torch.cat([torch.zeros_like(tokens[:, :1]), tokens], dim=1)
    mask = torch.ones_like(padded)
    mask[:, 0] = 0
    with torch.inference_mode():
        logits = model(input_ids=padded, attention_mask=mask).logits
    return bool(logits[:, 1:].isnan().any())
