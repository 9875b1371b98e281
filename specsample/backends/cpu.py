"""The fused CPU backend: the numba kernels of :mod:`specsample.native` behind the seam.

Its chain rule on ``[batch, k, vocab]`` probabilities (what :class:`specsample.RejectionSampler`
runs) is one fused pass per sequence (:func:`specsample.native.chain.chain_rule`); its other
slots run the PyTorch code of :mod:`specsample.backends.eager` until kernels exist for them.
It gives the tokens of the PyTorch backend on the same uniforms (up to a uniform falling
within about ``1e-16`` of a cell boundary, see :mod:`specsample.rules.residual`).

The kernel runs on CPU tensors of float32 or float64 probabilities once its compilation has
finished (:func:`specsample.native.jit.ready`, on a background thread, which is also where
numba is first imported: ``import specsample`` does not load it); other calls (half
precision, another device, a call being traced by ``torch.compile``, or the first calls
while the kernel compiles) run the PyTorch rule, which gives the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specsample.backends import eager
from specsample.native import jit
from specsample.rules.chain import chain_verify, check_rule_inputs
from specsample.shared import ChainStep, PaddedRule, VerifyResult

_FUSED_DTYPES = (torch.float32, torch.float64)


def _fused(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> bool:
    """Whether the kernel takes these rows now (else the PyTorch rule runs)."""
    return (
        target_probs.device.type == "cpu"
        and target_probs.dtype in _FUSED_DTYPES
        and draft_probs.dtype == target_probs.dtype
        and target_probs.shape[1] > 0
        and target_probs.shape[0] > 0
        and not torch.compiler.is_compiling()
        and jit.ready()
    )


class FusedChainRule(PaddedRule):
    """:data:`specsample.rules.chain.chain_verify` by the fused kernel: same arguments (as
    :meth:`PaddedRule.__call__ <specsample.shared.PaddedRule.__call__>` documents), same
    checks, same result on the same uniforms.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    >>> u = torch.tensor([[0.3, 0.9, 0.5]], dtype=torch.float64)
    >>> fused_chain(q, q, torch.tensor([[1, 0]]), torch.tensor([1]), u).num_accepted
    tensor([2])
    """

    def verify(self, step: ChainStep) -> VerifyResult:
        """The chain rule's result on ``step``, by the kernel when it takes the rows."""
        target, draft, ids, bonus, uniforms = step
        if not _fused(target, draft):
            return chain_verify.verify(step)
        check_rule_inputs(*step)
        from specsample.native.chain import chain_rule  # loaded with numba, at the warm-up

        batch, k, _ = target.shape
        token_ids = torch.empty(batch, k + 1, dtype=torch.int64)
        num_accepted = torch.empty(batch, dtype=torch.int64)
        chain_rule(
            _view(target),
            _view(draft),
            _view(ids.to(torch.int64)),
            _view(bonus.reshape(batch).to(torch.int64)),
            _view(uniforms),
            token_ids.numpy(),
            num_accepted.numpy(),
        )
        return VerifyResult(token_ids, num_accepted)


fused_chain = FusedChainRule()
"""The chain rule on probabilities by the fused CPU kernel (:class:`FusedChainRule`)."""


def _view(tensor: torch.Tensor) -> np.ndarray:
    """The NumPy view of a CPU tensor (no copy), any strides."""
    return tensor.detach().numpy()


def _contiguous(shape: tuple[int, ...], dtype: type, value: float = 0.0) -> np.ndarray:
    """A contiguous array."""
    return np.full(shape, value, dtype)


def _strided(shape: tuple[int, ...], dtype: type, value: float = 0.0) -> np.ndarray:
    """A non-contiguous array (every other element of its last axis)."""
    return np.full((*shape[:-1], 2 * shape[-1]), value, dtype)[..., ::2]


def _warm() -> None:
    """Compile the kernel per row dtype for contiguous arrays (numba's ``C`` layout, whose
    loads vectorise) and for arrays of any strides (``A``), then freeze it: a call then
    never starts a compilation (an array of another layout takes the ``A`` version)."""
    from specsample.native.chain import chain_rule

    for dtype in (np.float32, np.float64):
        for make in (_strided, _contiguous):
            rows = make((2, 1, 4), dtype, 0.25)
            chain_rule(
                rows,
                rows,
                make((2, 1), np.int64),
                make((2,), np.int64),
                make((2, 2), np.float64, 0.5),
                make((2, 2), np.int64),
                make((2,), np.int64),
            )
    chain_rule.disable_compile()


jit.on_warm_up(_warm)


def prob_rule(method: str) -> Callable[..., VerifyResult]:
    """The fused chain rule; the PyTorch rule for the other methods."""
    return fused_chain if method == "chain" else eager.prob_rule(method)
