"""A :class:`~specsample.adapter.cache.KVCache` handed to a ``transformers`` model as its cache.

A ``transformers`` causal LM takes its KV cache as a ``transformers.Cache``: each attention
layer calls ``update(key, value, layer_idx)`` and attends to what it returns, and the model
asks ``get_seq_length`` and ``get_mask_sizes`` to place the new tokens and size its masks
(``transformers`` 5 passes the latter the number of new tokens, 4.x their cache positions).
:func:`model_cache` wraps a :class:`~specsample.adapter.cache.KVCache` in the narrowest such
object: those calls read and write the cache's own tensors, and nothing else is kept.

``transformers`` is imported when the first one is built, so ``specsample`` imports
without it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from specsample.adapter.cache import KVCache


def model_cache(cache: KVCache) -> Any:
    """A ``transformers.Cache`` that stores its keys and values in ``cache``.

    Examples
    --------
    >>> import transformers
    >>> cache = KVCache(1)
    >>> boundary = model_cache(cache)
    >>> isinstance(boundary, transformers.Cache), boundary.get_seq_length()
    (True, 0)
    >>> keys, _ = boundary.update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    >>> cache.length(0), boundary.get_mask_sizes(2, 0)
    (3, (5, 0))
    """
    return _cache_class()(cache)


@functools.cache
def _cache_class() -> type:
    """The ``transformers.Cache`` subclass of :func:`model_cache` (built once)."""
    from transformers import Cache

    class ModelCache(Cache):  # type: ignore[misc]
        """Keys and values kept in a :class:`KVCache`, slot for slot."""

        def __init__(self, cache: KVCache) -> None:
            super().__init__(layers=[])
            self.cache = cache

        def update(
            self,
            key_states: torch.Tensor,
            value_states: torch.Tensor,
            layer_idx: int,
            *args: Any,
            **kwargs: Any,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return self.cache.update(layer_idx, key_states, value_states)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.cache.length(layer_idx)

        def get_mask_sizes(
            self, queries: int | torch.Tensor, layer_idx: int = 0
        ) -> tuple[int, int]:
            # transformers 5 passes the number of queries, 4.x their cache positions
            count = queries.shape[0] if isinstance(queries, torch.Tensor) else queries
            return self.cache.length(layer_idx) + count, 0

    return ModelCache
