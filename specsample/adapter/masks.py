"""The 4-D additive attention masks of a forward over a :class:`~specsample.adapter.cache.KVCache`.

A query sees the valid slots up to its own, those less than the sliding window before it on
sliding layers, and, among the last slots, only those a token tree allows (its ancestors and
itself). Sliding-window layers (Mistral, Phi-3 and Qwen2 with a window; Gemma 2 and 3, which
mix them with full layers) must not count masked slots in their windows, so their masks are
built here from each slot's recorded position rather than by ``transformers``.
"""

from __future__ import annotations

import torch

from specsample.adapter.cache import KVCache
from specsample.adapter.config import FULL, SLIDING, AttentionWindow


def additive_masks(
    cache: KVCache,
    positions: torch.Tensor,
    visible: torch.Tensor | None,
    attention: AttentionWindow,
    dtype: torch.dtype,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The masks of a forward whose queries, the last ``n`` slots, sit at ``positions [batch, n]``.

    Parameters
    ----------
    cache : KVCache
        The cache, its slots for this forward already added.
    positions : torch.Tensor
        ``[batch, n]`` int64 the queries' positions.
    visible : torch.Tensor or None
        ``[n, t]`` bool: which of the last ``t`` slots each query may see, on top of the
        usual rules (a token tree: its ancestors and itself).
    attention : AttentionWindow
        The model's sliding window, if any.
    dtype : torch.dtype
        The model's dtype.

    Returns
    -------
    torch.Tensor or dict of str to torch.Tensor
        ``[batch, 1, n, width]`` in ``dtype``, 0 where a query may attend and a very negative
        value elsewhere: the lowest float32 (or the dtype's lowest, if higher), never
        ``-inf``, so that a query of a padding slot, which sees nothing, produces no NaN, even
        where attention takes its softmax in float32. Hybrid models get one mask per layer
        type (keyed by ``transformers``' layer type names).

    Examples
    --------
    >>> cache = KVCache(1)
    >>> cache.add_slots(2)
    >>> mask = additive_masks(cache, torch.tensor([[0, 1]]), None, AttentionWindow(None, False),
    ...                       torch.float32)
    >>> (mask == 0).tolist()
    [[[[True, False], [True, True]]]]
    """
    n, width = positions.shape[1], cache.width
    slots = torch.arange(width, device=positions.device)
    causal = slots <= (slots[width - n :]).unsqueeze(-1)
    if visible is not None:
        causal[:, width - visible.shape[1] :] &= visible
    allowed = cache.mask[:, None, :].bool() & causal
    low = max(torch.finfo(dtype).min, torch.finfo(torch.float32).min)
    zeros = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    full = zeros.masked_fill(allowed.logical_not(), low).unsqueeze(1)
    window = attention.window
    if window is None:
        return full
    near = positions.unsqueeze(-1) - cache.positions[:, None, :] < window
    sliding = zeros.masked_fill_((allowed & near).logical_not_(), low).unsqueeze(1)
    return {SLIDING: sliding, FULL: full} if attention.hybrid else sliding
