"""The Triton backend: the fused kernels of :mod:`specsample.kernels` behind the backend seam.

Same arguments and results as :mod:`specsample.backends.eager` on the same uniforms (up to
floating-point ties at a boundary of the inverse CDF). It runs on CUDA tensors, and on CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1``, for tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from specsample import kernels
from specsample.metadata import BatchLayout
from specsample.probs import RowStats
from specsample.shared import VerifyResult


def verify_logits(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    stats: RowStats,
    *args: Any,
    bonus_token_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_logits`, by the fused kernels (same arguments)."""
    if bonus_token_ids is not None:
        bonus_token_ids = bonus_token_ids.contiguous()
    return kernels.verify_logits(
        target_logits,
        draft_token_ids,
        layout,
        stats,
        *args,
        bonus_token_ids=bonus_token_ids,
        **kwargs,
    )


def prob_rule(method: str) -> Callable[..., VerifyResult]:
    """The kernel twin of :data:`specsample.backends.eager.PROB_RULES` ``[method]``."""
    return kernels.RULES[method]
