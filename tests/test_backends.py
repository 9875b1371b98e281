"""The backend seam (:mod:`specsample.backends`): :func:`resolve` picks, :func:`get` hands out.

Every backend fills every slot of :class:`Backend`; the PyTorch backend's slots are the eager
steps, and the Triton and CPU backends run the eager code in the slots they have no kernel for.
:func:`resolve` maps ``"auto"`` to the fused CPU backend on CPU tensors when numba is installed
(PyTorch otherwise) and refuses an unknown name or a backend that cannot run here, naming
``backend``. That the backends return the same tokens is tested in ``tests/test_kernels.py``
(Triton) and ``tests/test_backend_cpu.py`` (CPU).
"""

from __future__ import annotations

import pytest
import torch

from specsample import backends
from specsample.backends import BACKENDS, Backend, cpu, eager, lossy, trees
from specsample.kernels import triton as kernels
from specsample.kernels.cpu import compiler
from specsample.rules.block import block_verify
from specsample.rules.chain import chain_verify


@pytest.mark.parametrize("name", ["torch", "triton", "cpu"])
def test_every_backend_fills_every_slot(name: str) -> None:
    backend = backends.get(name)
    assert isinstance(backend, Backend)
    assert all(callable(slot) for slot in backend)


def test_the_torch_backend_runs_the_eager_steps() -> None:
    backend = backends.get("torch")
    assert backend == Backend(
        eager.verify_logits,
        eager.prob_rule,
        lossy.verify_typical,
        trees.tree_step,
        eager.log_q,
        eager.row_norms,
        eager.verify_gumbel,
    )
    assert backend.prob_rule("chain") is chain_verify
    assert backend.prob_rule("block") is block_verify


def test_the_triton_backend_runs_the_eager_code_where_it_has_no_kernel() -> None:
    torch_backend, triton_backend = backends.get("torch"), backends.get("triton")
    assert triton_backend.typical is torch_backend.typical
    assert triton_backend.tree is torch_backend.tree
    assert triton_backend.log_q is torch_backend.log_q
    assert triton_backend.verify_logits is not torch_backend.verify_logits


def test_the_cpu_backend_has_kernels_for_the_chain_rule_and_row_statistics() -> None:
    torch_backend, cpu_backend = backends.get("torch"), backends.get("cpu")
    assert cpu_backend.prob_rule("chain") is cpu.fused_chain
    assert cpu_backend.prob_rule("block") is block_verify
    assert cpu_backend.verify_logits is cpu.verify_logits
    assert cpu_backend.row_norms is cpu.row_norms
    assert cpu_backend.typical is torch_backend.typical
    assert cpu_backend.tree is torch_backend.tree


def test_resolve_picks_the_backend_for_the_tensor() -> None:
    cpu_tensor = torch.zeros(2, 3)
    assert backends.resolve("auto", cpu_tensor) == ("cpu" if compiler.available() else "torch")
    assert backends.resolve("torch", cpu_tensor) == "torch"
    assert backends.resolve("torch", torch.zeros(0, dtype=torch.float16)) == "torch"
    if kernels.supports(cpu_tensor):
        assert backends.resolve("triton", cpu_tensor) == "triton"
    else:
        with pytest.raises(ValueError, match="backend='triton' cannot run on cpu tensors"):
            backends.resolve("triton", cpu_tensor)
    if compiler.available():
        assert backends.resolve("cpu", cpu_tensor) == "cpu"
    else:
        with pytest.raises(ValueError, match="backend='cpu' cannot run on cpu tensors"):
            backends.resolve("cpu", cpu_tensor)
    assert set(BACKENDS) == {"auto", "torch", "triton", "cpu"}


@pytest.mark.parametrize("name", ["cuda", "Torch", "", None, 1])
def test_resolve_refuses_an_unknown_backend_naming_it(name: object) -> None:
    with pytest.raises(
        ValueError, match=r"backend must be one of \('auto', 'torch', 'triton', 'cpu'\)"
    ):
        backends.resolve(name, torch.zeros(1))
