"""The kernels' block masses against the PyTorch rules', bit for bit, on half precision too.

The residual draw first picks a block of 1024 columns from the block masses ``sum q`` and
``sum max(w q - p, 0)``. :func:`specsample.kernels.triton.padded.kernel_block_masses` runs the
kernel that computes them alone; here its masses must equal those of
:func:`specsample.rules.residual.block_masses` (chain rule, the row at the first rejection)
and :func:`specsample.rules.block.residual_mass_per_position` (block rule, every position
with its weight ``w_i``) under ``torch.equal``.

The rule computes ``w q - p`` in float32 (float64 for float64 rows), never in the inputs'
half precision: in bfloat16 ``q - p`` rounds back to ``q`` whenever ``p < q * 2^-9`` (in
float16 when ``p < q * 2^-12``), which biases the residual towards tokens the draft also
proposes. The rows below have many such tokens, and the test first checks that rounding to
the inputs' dtype would change their masses.

Bit-for-bit equality needs the float64 sums of a block to be exact, as the kernel and the
rule add in different orders: every probability is 0 or a bfloat16 value of at least
``2^-12`` (so a multiple of ``2^-19``, held exactly by every dtype tested), every weight is
1, 1/2 or 1/4 (the drafts' ``q / p`` are 1/2 or 1) and every block's mass stays below 1, so
that each term and partial sum is a multiple of ``2^-21`` below 1, which float32 holds.

These tests need the kernels on CPU tensors: triton installed and ``TRITON_INTERPRET=1``
from the start of the process (``TRITON_INTERPRET=1 pytest tests/test_kernel_masses.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample.kernels import triton as kernels
from specsample.kernels.triton.padded import kernel_block_masses
from specsample.rules.block import block_verify, block_weights, residual_mass_per_position
from specsample.rules.chain import chain_verify, gather_drafts
from specsample.rules.residual import BLOCK, block_masses
from specsample.rules.rows import ProbRows, Selection, flat_rows

pytestmark = pytest.mark.skipif(
    not kernels.supports(torch.zeros(1)),
    reason=(
        "the Triton kernels cannot run on CPU tensors in this process: they need triton "
        "installed and TRITON_INTERPRET=1 set before the process starts"
    ),
)

BATCH = 12
K = 3
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
VOCABS = (700, 2500)
"""One partial block (the kernels' one-kernel case), and three blocks, the last partial."""

SMALL = (-12.0, -7.0)
BIG = (-2.85, -2.5)
TINY = (-12.0, -11.9)
"""Ranges of ``log2`` of the probabilities: the many small ones; the two large target ones of
each block, each paired with a draft probability in ``TINY``, below ``q * 2^-9``."""


def _log_uniform(
    shape: tuple[int, ...], bounds: tuple[float, float], gen: torch.Generator
) -> torch.Tensor:
    """Values ``2^x`` for ``x`` uniform in ``bounds``, rounded to bfloat16, as float64."""
    low, high = bounds
    x = low + (high - low) * torch.rand(shape, generator=gen, dtype=torch.float64)
    return torch.exp2(x).to(torch.bfloat16).double()


def _rows(vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft rows ``[BATCH, K, vocab]`` float64, exact in every dtype tested.

    About 2% of the entries of each row are small; two entries of every block have a large
    ``q`` and a tiny ``p``. Each value has 8 significant bits and is at least ``2^-12``.
    """
    shape = (BATCH, K, vocab)
    q = torch.where(torch.rand(shape, generator=gen) < 0.02, _log_uniform(shape, SMALL, gen), 0)
    p = torch.where(torch.rand(shape, generator=gen) < 0.02, _log_uniform(shape, SMALL, gen), 0)
    blocks = -(-vocab // BLOCK)
    for _ in range(2):
        offset = torch.randint(BLOCK, (BATCH, K, blocks), generator=gen)
        cols = (torch.arange(blocks) * BLOCK + offset).clamp(max=vocab - 1)
        q.scatter_(2, cols, _log_uniform(cols.shape, BIG, gen))
        p.scatter_(2, cols, _log_uniform(cols.shape, TINY, gen))
    return q, p


def _case(
    dtype: torch.dtype, vocab: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows in ``dtype``, drafts with ``q / p`` in {1/2, 1}, bonus ids and uniforms.

    Rows 0 and 1 accept every draft under the chain rule (``u = 0``), row 2 rejects its first
    one, row 3 has an invalid draft (-1) and row 4 a residual without mass (``p = q``) and an
    invalid first draft (``vocab``).
    """
    gen = torch.Generator().manual_seed(seed)
    q, p = _rows(vocab, gen)
    ids = torch.randint(vocab, (BATCH, K), generator=gen)
    ratio = torch.exp2(torch.randint(-1, 1, (BATCH, K), generator=gen).double())
    ratio[2, 0] = 0.5
    at = ids.unsqueeze(-1)
    q.scatter_(2, at, (2.0**-6 * ratio).unsqueeze(-1))
    p.scatter_(2, at, torch.full((BATCH, K, 1), 2.0**-6, dtype=torch.float64))
    ids[3, 1] = -1
    p[4] = q[4]
    ids[4, 0] = vocab
    uniforms = torch.rand(BATCH, K + 1, dtype=torch.float64, generator=gen)
    uniforms[:2, :K] = 0.0
    uniforms[2, 0] = 1.0 - 2.0**-20
    bonus = torch.randint(vocab, (BATCH,), generator=gen)
    return q.to(dtype), p.to(dtype), ids, bonus, uniforms


def _select(probs: torch.Tensor, position: torch.Tensor) -> Selection:
    """The rows ``(b, position[b, i])`` of ``probs [batch, k, vocab]``, in ``(b, i)`` order."""
    rows, stride = flat_rows(probs)
    batch = torch.arange(probs.shape[0]).unsqueeze(-1)
    return ProbRows(rows).select((batch * stride + position).reshape(-1))


def _chain_masses(q: torch.Tensor, p: torch.Tensor, ids, bonus, uniforms) -> torch.Tensor:
    """The rule's masses ``[2, batch, 1, blocks]`` of each rejected row (0 without rejection)."""
    accepted = chain_verify(q, p, ids, bonus, uniforms).num_accepted
    position = accepted.clamp(max=K - 1).unsqueeze(-1)
    masses = block_masses(_select(q, position), q.shape[-1], draft=_select(p, position))
    drawn = (accepted < K).view(1, -1, 1)
    return torch.where(drawn, masses, 0.0).unsqueeze(2)


def _block_masses(q: torch.Tensor, p: torch.Tensor, ids, bonus) -> torch.Tensor:
    """The rule's masses ``[2, batch, K, blocks]`` of every position, with its weight."""
    drafts = gather_drafts(q, p, ids, bonus)
    weights = block_weights(drafts.q_at, drafts.p_at, drafts.valid)
    every = torch.arange(K).expand(q.shape[0], K)
    masses, _ = residual_mass_per_position(
        _select(q, every), _select(p, every), weights, q.shape[-1]
    )
    return masses


def _rounded_to_dtype(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Residual masses ``[batch, K, blocks]`` with ``q - p`` rounded to the inputs' dtype."""
    residual = (q - p).clamp(min=0).float()
    padded = torch.nn.functional.pad(residual, (0, -q.shape[-1] % BLOCK))
    return padded.view(*q.shape[:2], -1, BLOCK).sum(dim=-1)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inputs_expose_rounding_in_the_inputs_dtype(dtype: torch.dtype, vocab: int) -> None:
    """The rows have tokens with ``0 < p < q * 2^-9``; for half precision rounding ``q - p``
    in the inputs' dtype changes their residual masses (what a biased kernel would do)."""
    q, p, _, _, _ = _case(dtype, vocab, seed=vocab)
    below = (p > 0) & (p.double() < q.double() * 2.0**-9)
    assert bool(below.any(dim=-1)[torch.arange(BATCH) != 4].all())
    every = torch.arange(K).expand(BATCH, K)
    exact = block_masses(_select(q, every), vocab, draft=_select(p, every))[1].view(BATCH, K, -1)
    rounded = _rounded_to_dtype(q, p)
    if dtype in (torch.float16, torch.bfloat16):
        assert not torch.equal(rounded, exact)
    else:
        assert torch.equal(rounded, exact)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chain_masses_equal_the_rule(dtype: torch.dtype, vocab: int) -> None:
    """Chain rule: the masses of the row at each first rejection, bit for bit."""
    q, p, ids, bonus, uniforms = _case(dtype, vocab, seed=vocab + 1)
    expected = _chain_masses(q, p, ids, bonus, uniforms)
    masses = kernel_block_masses(q, p, ids, bonus, uniforms, "chain")
    assert masses.dtype == torch.float64
    assert masses.shape == (2, BATCH, 1, -(-vocab // BLOCK))
    assert torch.equal(masses, expected)
    drawn = (expected != 0).flatten(2).any(dim=-1).any(dim=0)
    assert not bool(drawn[:2].any()) and bool(drawn[2:5].all()) and int(drawn.sum()) >= 5


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_block_masses_equal_the_rule(dtype: torch.dtype, vocab: int) -> None:
    """Block rule: the masses of every position with its weight ``w_i``, bit for bit."""
    q, p, ids, bonus, uniforms = _case(dtype, vocab, seed=vocab + 2)
    expected = _block_masses(q, p, ids, bonus)
    masses = kernel_block_masses(q, p, ids, bonus, uniforms, "block")
    assert masses.shape == (2, BATCH, K, -(-vocab // BLOCK))
    assert torch.equal(masses, expected)
    drafts = gather_drafts(q, p, ids, bonus)
    weights = block_weights(drafts.q_at, drafts.p_at, drafts.valid)[:, :K]
    assert {0.25, 0.5, 1.0} <= set(weights.flatten().tolist())


def _one_term_case(
    dtype: torch.dtype, vocab: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows with one nonzero column per block, and weights that are not powers of two.

    The draft of each position is the column of block 0, where ``p > q`` (its ratio
    ``q / p`` in ``(0.3, 0.9)`` makes the next weight); the columns of the other blocks have
    ``p = f q`` with ``f < 0.08``, so that ``w q - p > 0`` there.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks = -(-vocab // BLOCK)
    widths = torch.tensor([min(BLOCK, vocab - b * BLOCK) for b in range(blocks)])
    cols = torch.arange(blocks) * BLOCK + (torch.rand(BATCH, K, blocks, generator=gen) * widths)
    cols = cols.long()
    values = 0.25 + 0.75 * torch.rand(BATCH, K, blocks, generator=gen, dtype=torch.float64)
    values = values.to(dtype).double()
    factor = 0.08 * torch.rand(BATCH, K, blocks, generator=gen, dtype=torch.float64)
    factor[..., 0] = 1 / (0.3 + 0.6 * torch.rand(BATCH, K, generator=gen, dtype=torch.float64))
    q = torch.zeros(BATCH, K, vocab, dtype=torch.float64).scatter_(2, cols, values)
    p = torch.zeros_like(q).scatter_(2, cols, (values * factor).to(dtype).double())
    uniforms = torch.rand(BATCH, K + 1, dtype=torch.float64, generator=gen)
    bonus = torch.zeros(BATCH, dtype=torch.int64)
    return q.to(dtype), p.to(dtype), cols[..., 0].contiguous(), bonus, uniforms


def _interpreter_fma_rounds_once() -> bool:
    """Whether this Triton's interpreter rounds ``tl.fma`` once, as compiled kernels do
    (Triton 3.6's multiplies, then adds): ``x * x - 1`` for ``x = 1 + 2**-12`` keeps its
    ``2**-24`` only when rounded once."""
    import triton.language as tl
    from triton.runtime import interpreter

    x = interpreter.TensorHandle(np.array([1 + 2.0**-12], np.float32), tl.float32)
    minus_one = interpreter.TensorHandle(np.array([-1.0], np.float32), tl.float32)
    fused = interpreter.InterpreterBuilder().create_fma(x, x, minus_one).data[0]
    return bool(fused == np.float32(2.0**-11 + 2.0**-24))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_block_terms_are_rounded_once(dtype: torch.dtype) -> None:
    """``w q - p`` is rounded once (a fused multiply-add), as the rule's ``addcmul`` does.

    With one nonzero column per block each residual mass is a single term, exact whatever
    the order of summation, and the weights are arbitrary float32 values.
    """
    if not _interpreter_fma_rounds_once():
        pytest.skip("this Triton's interpreter rounds tl.fma twice; compiled kernels round once")
    q, p, ids, bonus, uniforms = _one_term_case(dtype, 2500, seed=7)
    expected = _block_masses(q, p, ids, bonus)
    masses = kernel_block_masses(q, p, ids, bonus, uniforms, "block")
    assert bool((expected[1, :, :, 1:] > 0).all())
    assert torch.equal(masses, expected)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("method", ("chain", "block"))
def test_draws_from_these_masses_match_the_rule(
    method: str, dtype: torch.dtype, vocab: int
) -> None:
    """On the same uniforms, the kernels emit the rule's tokens for these rows."""
    q, p, ids, bonus, uniforms = _case(dtype, vocab, seed=vocab + 3)
    reference = chain_verify if method == "chain" else block_verify
    expected = reference(q, p, ids, bonus, uniforms)
    result = kernels.RULES[method](q, p, ids, bonus, uniforms)
    assert torch.equal(result.num_accepted, expected.num_accepted)
    assert torch.equal(result.token_ids, expected.token_ids)


def test_masses_of_no_drafts_and_errors() -> None:
    """``k = 0`` gives empty block-rule masses and zero chain masses; bad arguments raise."""
    q = torch.full((2, 0, 8), 0.125)
    ids, bonus = torch.zeros(2, 0, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    uniforms = torch.rand(2, 1, dtype=torch.float64)
    assert kernel_block_masses(q, q, ids, bonus, uniforms, "block").shape == (2, 2, 0, 1)
    assert torch.equal(kernel_block_masses(q, q, ids, bonus, uniforms), torch.zeros(2, 2, 1, 1))
    with pytest.raises(ValueError, match="method"):
        kernel_block_masses(q, q, ids, bonus, uniforms, "tree")
    with pytest.raises(ValueError, match="uniforms"):
        kernel_block_masses(q, q, ids, bonus, uniforms.float())
