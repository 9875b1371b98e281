"""The Triton backend: the kernels of :mod:`specsample.kernels.triton` behind the backend seam.

Same arguments and results as :mod:`specsample.backends.eager` on the same uniforms (up to
floating-point ties at a boundary of the inverse CDF). It runs on CUDA tensors, and on CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1``, for tests). The statistics of a
step's plan come from the row-statistics kernel (:mod:`specsample.kernels.triton.norms`),
which reads each row once, and, where a request has a top-k, top-p or min-p filter, the
filter kernel after it (:mod:`specsample.kernels.triton.filters`).
"""

from __future__ import annotations

import torch

from specsample.kernels import triton as kernels
from specsample.kernels.triton import filters, gumbel
from specsample.params.metadata import SamplingMetadata
from specsample.plan import LogitsStep
from specsample.probs import RowNorms
from specsample.rules.chain import PaddedRule


def row_norms(
    logits: torch.Tensor, sampling: SamplingMetadata, *, need_norm: bool = False
) -> RowNorms:
    """:func:`specsample.backends.eager.row_norms` by the statistics and filter kernels
    (:func:`specsample.kernels.triton.filters.row_norms`; same arguments, the same results up
    to float32 rounding of ``log_norm``).

    Examples
    --------
    >>> from specsample.backends import eager
    >>> from specsample.kernels import triton as kernels
    >>> meta = SamplingMetadata.build(1, torch.device("cpu"), temperature=0.0)
    >>> logits = torch.tensor([[1.0, 3.0]])
    >>> compute = row_norms if kernels.supports(logits) else eager.row_norms
    >>> compute(logits, meta).argmax.tolist()
    [1]
    """
    return filters.row_norms(logits, sampling, need_norm=need_norm)


def verify_logits(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_logits`, by the fused kernels (same step)."""
    if step.bonus_token_ids is not None:
        step = step._replace(bonus_token_ids=step.bonus_token_ids.contiguous())
    return kernels.verify_logits(step)


def verify_gumbel(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_gumbel`, by the keyed Gumbel-max kernel
    (:func:`specsample.kernels.triton.gumbel.verify_gumbel`; same step, same tokens)."""
    if step.bonus_token_ids is not None:
        step = step._replace(bonus_token_ids=step.bonus_token_ids.contiguous())
    return gumbel.verify_gumbel(step)


def prob_rule(method: str) -> PaddedRule:
    """The kernel twin of :func:`specsample.backends.eager.prob_rule`."""
    return kernels.RULES[method]
