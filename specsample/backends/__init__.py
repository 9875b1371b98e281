"""Backends execute a planned verification step; :func:`resolve` picks one, :func:`get` hands
out what it runs.

* ``"torch"`` (:mod:`specsample.backends.eager`): plain PyTorch, any device; the reference.
* ``"triton"`` (:mod:`specsample.backends.triton`): fused Triton kernels, on CUDA tensors (or
  on CPU tensors under ``TRITON_INTERPRET=1``).
* ``"cpu"`` (:mod:`specsample.backends.cpu`): fused numba kernels on CPU tensors (needs
  numba, the ``cpu`` extra).
* ``"auto"``: Triton on CUDA tensors when it is installed, the fused CPU backend on CPU
  tensors when numba is installed, PyTorch otherwise.

A backend is a :class:`Backend`: one function per kind of step (a chain or block step on
flattened logits, a rule on ``[batch, k, vocab]`` probabilities, a typical-acceptance step, a
tree step) and the log-probabilities of emitted tokens. Every entry point reaches them through
:mod:`specsample.pipeline` and :func:`get`, so a kernel takes over a kind of step by filling
its slot here. The Triton backend has kernels for the chain, block and keyed Gumbel-max
steps; its typical, tree and log-probability slots run the PyTorch code
(:mod:`~specsample.backends.lossy`, :mod:`~specsample.backends.trees`) until kernels exist
for them. The CPU backend has kernels for the chain rule on probabilities and on logits, the
keyed Gumbel-max step, and the statistics of rows processed with a temperature alone; its
other slots run the PyTorch code.

Given the same uniforms (or, for ``method="gumbel"``, the same row keys), every backend
returns the same tokens.

Examples
--------
>>> import torch
>>> resolve("auto", torch.zeros(1)) in ("cpu", "torch")
True
>>> get("torch").tree.__name__
'tree_step'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from specsample.backends import cpu, eager, lossy, trees, triton
from specsample.extras import install_command
from specsample.kernels import triton as kernels
from specsample.kernels.cpu import compiler
from specsample.probs import RowNorms
from specsample.rules.chain import PaddedRule
from specsample.rules.tree.structure import TreeVerifyResult

BACKENDS = ("auto", "torch", "triton", "cpu")
"""The names :func:`resolve` accepts."""


Step = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""A step returning ``(token_ids, num_accepted)``."""


class Backend(NamedTuple):
    """What a concrete backend runs, one function per kind of step.

    Attributes
    ----------
    verify_logits : callable
        A chain or block step on flattened logits after its plan
        (:func:`specsample.backends.eager.verify_logits`).
    prob_rule : callable
        ``prob_rule(method)``: the rule on ``[batch, k, vocab]`` probabilities.
    typical : callable
        A typical-acceptance step (:func:`specsample.backends.lossy.verify_typical`).
    tree : callable
        A tree step (:func:`specsample.backends.trees.tree_step`).
    log_q : callable
        ``log q`` of tokens at target rows (:func:`specsample.backends.eager.log_q`).
    row_norms : callable
        ``row_norms(logits, sampling, need_norm=...)``: the statistics of processed rows
        that a step's plan holds (:func:`specsample.backends.eager.row_norms`).
    gumbel : callable
        A ``method="gumbel"`` step on flattened logits after its plan (the PyTorch one:
        :func:`specsample.backends.eager.verify_gumbel`).
    """

    verify_logits: Step
    prob_rule: Callable[[str], PaddedRule]
    typical: Step
    tree: Callable[..., TreeVerifyResult]
    log_q: Callable[..., torch.Tensor]
    row_norms: Callable[..., RowNorms]
    gumbel: Step


_BACKENDS = {
    "torch": Backend(
        eager.verify_logits,
        eager.prob_rule,
        lossy.verify_typical,
        trees.tree_step,
        eager.log_q,
        eager.row_norms,
        eager.verify_gumbel,
    ),
    "triton": Backend(
        triton.verify_logits,
        triton.prob_rule,
        lossy.verify_typical,
        trees.tree_step,
        eager.log_q,
        triton.row_norms,
        triton.verify_gumbel,
    ),
    "cpu": Backend(
        cpu.verify_logits,
        cpu.prob_rule,
        lossy.verify_typical,
        trees.tree_step,
        eager.log_q,
        cpu.row_norms,
        cpu.verify_gumbel,
    ),
}


def resolve(backend: object, tensor: torch.Tensor) -> str:
    """The concrete backend (``"torch"``, ``"triton"`` or ``"cpu"``) for a step on ``tensor``.

    Raises
    ------
    ValueError
        When ``backend`` is unknown, or is ``"triton"`` and the kernels cannot run on
        ``tensor`` here.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if tensor.is_cuda and kernels.available():
            return "triton"
        return "cpu" if tensor.device.type == "cpu" and compiler.available() else "torch"
    if backend == "cpu" and not (tensor.device.type == "cpu" and compiler.available()):
        raise ValueError(
            f"backend='cpu' cannot run on {tensor.device} tensors here: it needs numba "
            f"({install_command('cpu')}) and CPU tensors"
        )
    if backend == "triton" and not kernels.supports(tensor):
        raise ValueError(
            f"backend='triton' cannot run on {tensor.device} tensors here: it needs triton "
            "and a CUDA device (or TRITON_INTERPRET=1 for CPU tensors)"
        )
    return str(backend)


def get(backend: str) -> Backend:
    """The steps of a concrete backend (``"torch"``, ``"triton"`` or ``"cpu"``, see
    :func:`resolve`)."""
    return _BACKENDS[backend]
