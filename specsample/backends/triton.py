"""The Triton backend: the kernels of :mod:`specsample.kernels.triton` behind the backend seam.

Same arguments and results as :mod:`specsample.backends.eager` on the same uniforms (up to
floating-point ties at a boundary of the inverse CDF). It runs on CUDA tensors, and on CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1``, for tests).
"""

from __future__ import annotations

import torch

from specsample.kernels import triton as kernels
from specsample.kernels.triton import gumbel
from specsample.plan import LogitsStep
from specsample.rules.chain import PaddedRule


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
