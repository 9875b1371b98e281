"""The backend seam (:mod:`specsample.backends`): :func:`resolve` picks, :func:`get` hands out.

Every backend fills every slot of :class:`Backend`; the PyTorch backend's slots are the eager
steps, and the Triton backend runs the eager code in the slots it has no kernel for (typical
acceptance, trees, log-probabilities). :func:`resolve` maps ``"auto"`` to PyTorch off CUDA and
refuses an unknown name or a Triton backend that cannot run here, naming ``backend``. That
both backends return the same tokens is tested in ``tests/test_kernels.py``.
"""

from __future__ import annotations

import pytest
import torch

from specsample import backends, kernels
from specsample.backends import BACKENDS, Backend, eager, lossy, trees
from specsample.rules.block import block_verify
from specsample.rules.chain import chain_verify


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_every_backend_fills_every_slot(name: str) -> None:
    backend = backends.get(name)
    assert isinstance(backend, Backend)
    assert all(callable(slot) for slot in backend)


def test_the_torch_backend_runs_the_eager_steps() -> None:
    backend = backends.get("torch")
    assert backend == Backend(
        eager.verify_logits, eager.prob_rule, lossy.verify_typical, trees.verify_tree, eager.log_q
    )
    assert backend.prob_rule("chain") is chain_verify
    assert backend.prob_rule("block") is block_verify


def test_the_triton_backend_runs_the_eager_code_where_it_has_no_kernel() -> None:
    torch_backend, triton_backend = backends.get("torch"), backends.get("triton")
    assert triton_backend.typical is torch_backend.typical
    assert triton_backend.tree is torch_backend.tree
    assert triton_backend.log_q is torch_backend.log_q
    assert triton_backend.verify_logits is not torch_backend.verify_logits


def test_resolve_picks_the_backend_for_the_tensor() -> None:
    cpu = torch.zeros(2, 3)
    assert backends.resolve("auto", cpu) == "torch"
    assert backends.resolve("torch", cpu) == "torch"
    assert backends.resolve("torch", torch.zeros(0, dtype=torch.float16)) == "torch"
    if kernels.supports(cpu):
        assert backends.resolve("triton", cpu) == "triton"
    else:
        with pytest.raises(ValueError, match="backend='triton' cannot run on cpu tensors"):
            backends.resolve("triton", cpu)
    assert set(BACKENDS) == {"auto", "torch", "triton"}


@pytest.mark.parametrize("name", ["cuda", "Torch", "", None, 1])
def test_resolve_refuses_an_unknown_backend_naming_it(name: object) -> None:
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'torch', 'triton'\)"):
        backends.resolve(name, torch.zeros(1))
