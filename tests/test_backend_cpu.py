"""The fused CPU backend (:mod:`specsample.backends.cpu`, kernel
:mod:`specsample.kernels.cpu.chain`).

Given the same uniforms, its chain rule on probabilities returns the PyTorch rule's tokens and
accepted counts, column for column: on random rows of several vocabularies (one block, a
partial last block, many blocks), float32 and float64 rows, strided and contiguous layouts,
extreme rows (one-hot, all-zero residuals, NaN, infinities, ids outside the vocabulary), and
through :class:`specsample.RejectionSampler` on both backends, under float32 or float64
default dtypes. Half-precision rows, calls where the kernels cannot run (numba missing, or a
failed compilation), and calls recorded by ``make_fx``, run the PyTorch rule itself. The
exactness harness also runs on the backend. Every test compiles or loads the kernels first,
and is skipped without numba.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from specsample import RejectionSampler, verify
from specsample.backends import cpu
from specsample.kernels.cpu import chain, compiler
from specsample.rules.chain import chain_verify
from specsample.testing import exactness_report, make_family

pytestmark = pytest.mark.skipif(not compiler.available(), reason="the CPU backend needs numba")


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    compiler.warm_up()
    assert compiler.ready()


def _case(
    batch: int, k: int, vocab: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, ...]:
    """Peaked random rows (so drafts are accepted and rejected), drafts drawn from ``p``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen, dtype=torch.float64) * 3, -1)
    p = torch.softmax(torch.randn(batch, k, vocab, generator=gen, dtype=torch.float64) * 3, -1)
    ids = torch.multinomial(p.view(-1, vocab), 1, generator=gen).view(batch, k)
    bonus = torch.randint(0, vocab, (batch, 1), generator=gen)
    uniforms = torch.rand(batch, k + 1, generator=gen, dtype=torch.float64)
    return q.to(dtype), p.to(dtype), ids, bonus, uniforms


def _assert_same(*args: torch.Tensor) -> None:
    expected = chain_verify(*args)
    got = cpu.fused_chain(*args)
    assert torch.equal(got.token_ids, expected.token_ids)
    assert torch.equal(got.num_accepted, expected.num_accepted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    ("batch", "k", "vocab"), [(64, 4, 3000), (9, 3, 1024), (5, 5, 50), (16, 2, 2049)]
)
def test_same_tokens_as_the_pytorch_rule(
    batch: int, k: int, vocab: int, dtype: torch.dtype
) -> None:
    for seed in range(6):
        _assert_same(*_case(batch, k, vocab, dtype, seed))


def test_strided_rows_give_the_same_tokens() -> None:
    q, p, ids, bonus, uniforms = _case(12, 3, 2500, torch.float32, seed=1)
    wide = torch.cat([q, q], dim=-1)[..., : q.shape[-1]]
    transposed = p.transpose(0, 1).contiguous().transpose(0, 1)
    expected = chain_verify(q, p, ids, bonus, uniforms)
    got = cpu.fused_chain(wide, transposed, ids.t().contiguous().t(), bonus, uniforms)
    assert torch.equal(got.token_ids, expected.token_ids)


def test_rows_with_spaced_elements_and_spaced_or_int32_layouts_give_the_same_tokens() -> None:
    """Rows whose elements are not adjacent (taken from a copy), uniforms and bonus tokens
    with row strides of their own, int32 drafts and bonus tokens (widened for the kernel)."""
    q, p, ids, bonus, uniforms = _case(12, 3, 2500, torch.float32, seed=8)
    spaced = torch.stack([q, torch.zeros_like(q)], dim=-1)[..., 0]
    assert spaced.stride(-1) == 2
    wide_uniforms = torch.cat([uniforms, torch.ones_like(uniforms)], dim=-1)[:, : uniforms.shape[1]]
    wide_bonus = torch.cat([bonus, -bonus], dim=-1)[:, :1]
    expected = chain_verify(q, p, ids, bonus, uniforms)
    for got in (
        cpu.fused_chain(spaced, p, ids, wide_bonus, wide_uniforms),
        cpu.fused_chain(q, p, ids.to(torch.int32), bonus.to(torch.int32), uniforms),
    ):
        assert torch.equal(got.token_ids, expected.token_ids)
        assert torch.equal(got.num_accepted, expected.num_accepted)


def test_extreme_rows_give_the_same_tokens() -> None:
    """One-hot rows, a residual with no mass (``q == p``), zeros, NaN and infinities."""
    q, p, ids, bonus, uniforms = _case(8, 3, 1500, torch.float32, seed=2)
    q[0] = p[0]
    q[1, 0] = torch.nn.functional.one_hot(torch.tensor(7), 1500).float()
    p[2, 0] = torch.nn.functional.one_hot(ids[2, 0], 1500).float()
    q[3, 0, 5] = float("nan")
    p[4, 0, 9] = float("nan")
    q[5, 0, 11] = float("inf")
    p[6, 0] = 0.0
    ids[7, 1] = 1500
    ids[7, 2] = -1
    uniforms[:, 0] = 0.999
    _assert_same(q, p, ids, bonus, uniforms)


def test_edges_fall_back_or_match() -> None:
    """No drafts, an empty batch, a one-token vocabulary, and half precision (PyTorch)."""
    for batch, k, vocab in [(3, 0, 10), (0, 2, 10), (4, 2, 1)]:
        _assert_same(*_case(batch, k, vocab, torch.float32, seed=3))
    _assert_same(*_case(6, 2, 300, torch.bfloat16, seed=4))
    _assert_same(*_case(6, 2, 300, torch.float16, seed=5))


def test_the_sampler_gives_the_same_tokens_on_both_backends() -> None:
    q, p, ids, bonus, _ = _case(32, 4, 5000, torch.float32, seed=6)
    for seeds in (torch.arange(32), None):
        outputs = []
        for backend in ("cpu", "torch"):
            gen = torch.Generator().manual_seed(11)
            sampler = RejectionSampler(backend=backend)
            at = None if seeds is None else torch.zeros_like(seeds)
            outputs.append(sampler(q, bonus, p, ids, generator=gen, seeds=seeds, positions=at))
        assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("filters", [{}, {"top_k": 7, "top_p": 0.9}], ids=["plain", "filtered"])
def test_a_float64_default_dtype_changes_nothing(filters: dict[str, float]) -> None:
    """Every tensor handed to a kernel has an explicit dtype: under
    ``torch.set_default_dtype(torch.float64)``, ``verify`` on float32 logits and the sampler
    on float32 rows give the tokens they give under float32."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 3000, generator=gen)
    drafts = torch.randint(0, 3000, (32,), generator=gen)
    q, p, ids, bonus, _ = _case(8, 4, 3000, torch.float32, seed=8)
    seeded = {"seeds": torch.arange(8), "positions": torch.zeros(8, dtype=torch.int64)}

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        out = verify(logits, drafts, [4] * 8, backend="cpu", temperature=1.0, **seeded, **filters)
        return out.token_ids, RejectionSampler(backend="cpu")(q, bonus, p, ids, **seeded)

    expected = run()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = run()
    finally:
        torch.set_default_dtype(previous)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_calls_without_kernels_run_the_pytorch_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    def kernel(*args: object) -> None:
        raise AssertionError("the kernel ran where it could not")

    monkeypatch.setattr(compiler, "ready", lambda: False)
    monkeypatch.setattr(chain, "chain_rule", kernel)
    monkeypatch.setattr(chain, "chain_rule_serial", kernel)
    _assert_same(*_case(2, 2, 50, torch.float32, seed=7))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["sparse", "markov"])
def test_exact_on_the_cpu_backend(family: str) -> None:
    """The harness on ``RejectionSampler(backend="cpu")``: 100,000 rows, k = 3, 8 tokens.

    False-failure rate <= 1e-4 (Bonferroni over the k + 3 tests); TV >= 0.0123 at position 0
    detected with probability >= 99%.
    """
    report = exactness_report(
        RejectionSampler(backend="cpu"), make_family(family, k=3, seed=5), rows=100_000, seed=9
    )
    assert report.passed(1e-4), str(report)
    assert report.detectable_tv(0, 1e-4) <= 0.0123


def _recorded_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(3, 4, 50, generator=gen) * 3, -1)
    draft = torch.softmax(torch.randn(3, 4, 50, generator=gen) * 3, -1)
    ids = torch.randint(0, 50, (3, 4), generator=gen)
    bonus = torch.randint(0, 50, (3, 1), generator=gen)
    return target, draft, ids, bonus, torch.rand(3, 5, generator=gen, dtype=torch.float64)


def test_a_recorded_call_records_pytorch_operations_not_the_kernels_result() -> None:
    """Under ``make_fx`` the backend runs PyTorch's code, so the graph computes the tokens of
    other inputs; a kernel run there would leave the recorded call's tokens as a constant."""

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        return cpu.fused_chain(*inputs).token_ids

    recorded, other = _recorded_inputs(0), _recorded_inputs(1)
    assert not torch.equal(step(*recorded), step(*other))
    graph = make_fx(step)(*recorded)
    assert torch.equal(graph(*other), step(*other))
