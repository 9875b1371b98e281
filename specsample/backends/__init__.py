"""Backends execute a planned verification step; :func:`resolve` picks one.

* ``"torch"`` (:mod:`specsample.backends.eager`): plain PyTorch, any device; the reference.
* ``"triton"`` (:mod:`specsample.backends.triton`): fused Triton kernels, on CUDA tensors (or
  on CPU tensors under ``TRITON_INTERPRET=1``).
* ``"auto"``: Triton on CUDA tensors when it is installed, PyTorch otherwise.

Both take the same arguments and, given the same uniforms, return the same tokens.

Examples
--------
>>> import torch
>>> resolve("auto", torch.zeros(1))
'torch'
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specsample import kernels
from specsample.backends import eager, triton
from specsample.shared import VerifyResult

BACKENDS = ("auto", "torch", "triton")
"""The names :func:`resolve` accepts."""


LogitsStep = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""A backend's ``verify_logits`` (arguments of :func:`specsample.backends.eager.verify_logits`)."""


def resolve(backend: object, tensor: torch.Tensor) -> str:
    """The concrete backend (``"torch"`` or ``"triton"``) for a step on ``tensor``.

    Raises
    ------
    ValueError
        When ``backend`` is unknown, or is ``"triton"`` and the kernels cannot run on
        ``tensor`` here.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if tensor.is_cuda and kernels.available() else "torch"
    if backend == "triton" and not kernels.supports(tensor):
        raise ValueError(
            f"backend='triton' cannot run on {tensor.device} tensors here: it needs triton "
            "and a CUDA device (or TRITON_INTERPRET=1 for CPU tensors)"
        )
    return str(backend)


def logits_step(backend: str) -> LogitsStep:
    """The ``verify_logits`` of a concrete backend."""
    return triton.verify_logits if backend == "triton" else eager.verify_logits


def prob_rule(backend: str, method: str) -> Callable[..., VerifyResult]:
    """The rule on ``[batch, k, vocab]`` probabilities of a concrete backend."""
    return triton.prob_rule(method) if backend == "triton" else eager.PROB_RULES[method]
