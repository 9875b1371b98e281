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
from specsample.rules.chain import VerifyResult


def _with_spare_row(logits: torch.Tensor, stats: RowStats) -> tuple[torch.Tensor, RowStats]:
    """Append one row, a copy of the last, so that every request has a row after its drafts.

    Without bonus rows (the target rows of the drafts only), the kernels still read the row
    after each request's drafts; for the last request that row would lie past the end.
    """
    spare = RowStats(*(torch.cat([s, s[-1:]]) for s in stats))
    return torch.cat([logits, logits[-1:]]), spare


def verify_logits(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    stats: RowStats,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_logits`, by the fused kernels (same arguments)."""
    if target_logits.shape[0] < layout.total_drafts + layout.batch:
        target_logits, stats = _with_spare_row(target_logits, stats)
    return kernels.verify_logits(target_logits, draft_token_ids, layout, stats, *args, **kwargs)


def prob_rule(method: str) -> Callable[..., VerifyResult]:
    """The kernel twin of :data:`specsample.backends.eager.PROB_RULES` ``[method]``."""
    return kernels.RULES[method]
