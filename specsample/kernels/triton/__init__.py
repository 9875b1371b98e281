"""Triton kernels for the exact verifiers, with the pure-PyTorch rules as reference.

The kernels compute what :mod:`specsample.rules` computes, with the same randomness: given the
same ``[batch, k + 1]`` float64 uniforms they pick the same tokens, up to floating-point ties
(a uniform within rounding of a boundary of the inverse CDF). Per request, the accept test
reads only the ``k`` draft probabilities; the residual ``normalize(max(w q - p, 0))`` is built
lazily at the one row the draw reads, from probabilities or directly from logits (with the
row's temperature, cutoff and log-normaliser; no softmax is materialised), and sampled by the
same hierarchical inverse CDF as :mod:`specsample.rules.residual`: block masses over 1024
columns (residual mass a sum of non-negative terms), then a 32-token part, then a token, with
float64 prefix sums, the target row as fallback when the residual has no mass, never a token
of zero residual mass, ids always in ``[0, vocab)``. Two launches per step, no host
synchronisation.

Entry points:

* :data:`RULES`, one :class:`KernelRule` per exact chain method (:data:`chain_kernel_verify`,
  :data:`block_kernel_verify`): the arguments and result of
  :func:`specsample.rules.chain.chain_verify` and :func:`specsample.rules.block.block_verify`;
* :func:`verify_logits`: the step of :func:`specsample.verify` after its row statistics
  (ragged batches, greedy and sampled requests, draft probabilities, draft logits or one-hot
  drafts, both rules).

For tests, :func:`specsample.kernels.triton.padded.kernel_block_masses` runs the first launch alone
and returns the block masses the draw reads, computed as the rule computes them (terms in
float32, or float64 for float64 probabilities, never in half precision; sums in float64).

:func:`available` says whether the kernels can serve CUDA tensors here (triton installed and a
GPU present); :func:`supports` whether they can run on a given tensor, which includes CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1``, for tests). Importing this package
never imports triton.

Examples
--------
>>> import torch
>>> from specsample.kernels import triton as kernels
>>> isinstance(kernels.available(), bool)
True
>>> kernels.supports(torch.zeros(1)) == (kernels.triton_available() and kernels.interpreting())
True
"""

from __future__ import annotations

import torch

from specsample.kernels.triton.launch import interpreting, supports, triton_available
from specsample.kernels.triton.logits import verify_logits
from specsample.kernels.triton.padded import (
    RULES,
    KernelRule,
    block_kernel_verify,
    chain_kernel_verify,
)

__all__ = [
    "RULES",
    "KernelRule",
    "available",
    "block_kernel_verify",
    "chain_kernel_verify",
    "interpreting",
    "supports",
    "triton_available",
    "verify_logits",
]


def available() -> bool:
    """Whether the kernels can serve CUDA tensors: triton is installed and a GPU is present."""
    return triton_available() and torch.cuda.is_available()
