"""Deterministic behaviour of the chain verifier and of :class:`RejectionSampler`.

Covers :mod:`specsample.sampler` (its helpers included: the target given under either
name, the bonus row dropped) and the chain rule it runs: :mod:`specsample.rules.chain`, the
residual draw :mod:`specsample.rules.residual` and the row helpers :mod:`specsample.rules.rows`
(their statistical exactness is in ``tests/test_exactness.py``; the call forms of vLLM v0's
worker in ``tests/conformance/test_vllm_v0_worker_calls.py``).
"""

from __future__ import annotations

import pytest
import torch

from specsample.rules.chain import chain_verify
from specsample.rules.residual import sample_residual, sample_rows
from specsample.rules.rows import ProbRows
from specsample.sampler import (
    RejectionSampler,
    TypicalAcceptanceSampler,
    draft_positions,
    target_argument,
)
from specsample.testing import draw_inputs, make_family

LARGEST_BELOW_ONE = 1.0 - 2.0**-53


def _normalised(*shape: int, generator: torch.Generator, zeros: float = 0.0) -> torch.Tensor:
    rows = torch.rand(*shape, generator=generator, dtype=torch.float64)
    if zeros:
        drop = torch.rand(*shape, generator=generator) < zeros
        keep = torch.nn.functional.one_hot(rows.argmax(dim=-1), shape[-1]).bool()
        rows = rows.masked_fill(drop & ~keep, 0.0)
    return (rows / rows.sum(dim=-1, keepdim=True)).to(torch.float32)


def _random_inputs(batch: int, k: int, vocab: int, seed: int = 0, zeros: float = 0.0):
    generator = torch.Generator().manual_seed(seed)
    target = _normalised(batch, k, vocab, generator=generator, zeros=zeros)
    draft = _normalised(batch, k, vocab, generator=generator, zeros=zeros)
    ids = torch.randint(vocab, (batch, k), generator=generator)
    bonus = torch.randint(vocab, (batch, 1), generator=generator)
    return target, bonus, draft, ids


def _check_layout(out: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Assert the ``[batch, k + 1]`` layout and return the number accepted per row."""
    batch, k = ids.shape
    assert out.shape == (batch, k + 1)
    assert out.dtype == torch.int64
    length = (out != -1).sum(dim=1)
    assert bool((length >= 1).all())
    cols = torch.arange(k + 1)
    body = cols < length.unsqueeze(-1)
    assert bool(torch.where(body, (out >= 0) & (out < vocab), out == -1).all())
    accepted = cols[:k] < (length - 1).unsqueeze(-1)
    assert bool((~accepted | (out[:, :k] == ids)).all())
    return length - 1


# ----------------------------------------------------------------------------------------
# Output layout and counters
# ----------------------------------------------------------------------------------------


def test_output_layout_on_random_rows() -> None:
    target, bonus, draft, ids = draw_inputs(make_family("random", 4, vocab=7), rows=5000, seed=1)
    out = RejectionSampler()(target, bonus, draft, ids)
    accepted = _check_layout(out, ids, 7)
    full = accepted == 4
    assert torch.equal(out[full, 4], bonus[full, 0])
    assert 0 < int(full.sum()) < 5000
    assert int((accepted == 0).sum()) > 0


def _counter_case() -> tuple[torch.Tensor, ...]:
    """Three rows of k = 3 whose acceptance does not depend on the uniforms.

    Row 0: ``p == q`` everywhere, all accepted. Row 1: the draft at position 1 has target
    probability 0 (rejected), the one at position 2 would be accepted but comes after the
    rejection. Row 2: rejected at position 0.
    """
    vocab = 4
    target = torch.full((3, 3, vocab), 0.25)
    draft = target.clone()
    ids = torch.tensor([[0, 1, 2], [0, 1, 2], [0, 1, 2]])
    target[1, 1] = torch.tensor([1 / 3, 0.0, 1 / 3, 1 / 3])
    target[2, 0] = torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3])
    bonus = torch.tensor([[3], [3], [3]])
    return target, bonus, draft, ids


def test_counters_count_only_in_order_acceptance() -> None:
    sampler = RejectionSampler()
    target, bonus, draft, ids = _counter_case()
    out = sampler(target, bonus, draft, ids)
    assert out[0].tolist() == [0, 1, 2, 3]
    assert out[1, 0] == 0 and out[1, 1] in (0, 2, 3) and out[1, 2:].tolist() == [-1, -1]
    assert out[2, 0] in (1, 2, 3) and out[2, 1:].tolist() == [-1, -1, -1]
    assert isinstance(sampler.num_accepted_tokens, torch.Tensor)
    assert sampler.num_accepted_tokens.dtype == torch.int64
    assert int(sampler.num_accepted_tokens) == 4
    assert int(sampler.num_emitted_tokens) == 7
    assert sampler.num_draft_tokens == 9
    assert sampler.stats.accepted_per_position.tolist() == [2, 1, 1]
    sampler(target, bonus, draft, ids)
    assert int(sampler.num_accepted_tokens) == 8
    assert int(sampler.num_emitted_tokens) == 14
    assert sampler.num_draft_tokens == 18
    assert int(sampler.num_emitted_tokens) == int((torch.cat([out, out]) != -1).sum())


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_init_gpu_tensors_accepts_a_device(device: str | torch.device) -> None:
    sampler = RejectionSampler()
    sampler.init_gpu_tensors(device)
    assert sampler.num_accepted_tokens.device.type == "cpu"
    sampler(*_counter_case())
    assert int(sampler.num_accepted_tokens) == 4


def test_counters_on_k_zero() -> None:
    sampler = RejectionSampler()
    target = torch.empty(5, 0, 3)
    bonus = torch.tensor([[0], [1], [2], [1], [0]])
    out = sampler(target, bonus, target.clone(), torch.empty(5, 0, dtype=torch.int64))
    assert out.tolist() == bonus.tolist()
    assert int(sampler.num_accepted_tokens) == 0
    assert int(sampler.num_emitted_tokens) == 5
    assert sampler.num_draft_tokens == 0


# ----------------------------------------------------------------------------------------
# Boundary cases with injected uniforms
# ----------------------------------------------------------------------------------------


def _uniforms(batch: int, k: int, value: float) -> torch.Tensor:
    return torch.full((batch, k + 1), value, dtype=torch.float64)


def test_zero_target_probability_is_never_accepted() -> None:
    """``q(x) = 0`` rejects even with the uniform exactly 0.0 (``0 * p < 0`` is false)."""
    target = torch.tensor([[[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]])
    draft = torch.tensor([[[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]])
    ids, bonus = torch.tensor([[0, 2]]), torch.tensor([1])
    result = chain_verify(target, draft, ids, bonus, _uniforms(1, 2, 0.0))
    assert result.num_accepted.tolist() == [0]
    assert result.token_ids[0, 0] in (1, 2)
    assert result.token_ids[0, 1:].tolist() == [-1, -1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_equal_rows_always_accept(dtype: torch.dtype) -> None:
    """``p == q`` accepts every draft with positive probability for any ``u < 1``."""
    generator = torch.Generator().manual_seed(3)
    probs = _normalised(64, 5, 33, generator=generator, zeros=0.3).to(dtype)
    ids = torch.multinomial(probs.float().view(-1, 33), 1, generator=generator).view(64, 5)
    bonus = torch.arange(64) % 33
    for value in (0.0, 0.5, LARGEST_BELOW_ONE):
        result = chain_verify(probs, probs, ids, bonus, _uniforms(64, 5, value))
        assert result.num_accepted.tolist() == [5] * 64
        assert torch.equal(result.token_ids[:, :5], ids)
        assert torch.equal(result.token_ids[:, 5], bonus)


def test_accept_threshold_is_strict() -> None:
    """With ``q(x) / p(x) = 1/2``: ``u = 1/2`` rejects, the next float below accepts."""
    target = torch.tensor([[[0.25, 0.75]]])
    draft = torch.tensor([[[0.5, 0.5]]])
    ids, bonus = torch.tensor([[0]]), torch.tensor([1])
    below = torch.tensor([[0.5 - 2.0**-54, 0.0]], dtype=torch.float64)
    at = torch.tensor([[0.5, 0.0]], dtype=torch.float64)
    assert chain_verify(target, draft, ids, bonus, below).token_ids.tolist() == [[0, 1]]
    assert chain_verify(target, draft, ids, bonus, at).token_ids.tolist() == [[1, -1]]


@pytest.mark.parametrize("bad_id", [-1, 5, 6, 1 << 40])
def test_out_of_vocabulary_drafts_are_rejected(bad_id: int) -> None:
    """Ids outside ``[0, vocab)`` reject even with ``u = 0`` and ``p == q``.

    Drafts after such an id are not accepted either.
    """
    probs = torch.full((2, 3, 5), 0.2)
    ids = torch.tensor([[bad_id, 1, 2], [0, bad_id, 2]])
    result = chain_verify(probs, probs, ids, torch.tensor([4, 4]), _uniforms(2, 3, 0.0))
    assert result.num_accepted.tolist() == [0, 1]
    assert 0 <= result.token_ids[0, 0] < 5 and result.token_ids[0, 1:].tolist() == [-1] * 3
    assert result.token_ids[1, 0] == 0 and 0 <= result.token_ids[1, 1] < 5
    assert result.token_ids[1, 2:].tolist() == [-1, -1]


@pytest.mark.parametrize("bonus_shape", [(3,), (3, 1)])
def test_k_zero_emits_the_bonus(bonus_shape: tuple[int, ...]) -> None:
    bonus = torch.tensor([2, 0, 1]).view(bonus_shape)
    empty = torch.empty(3, 0, 4)
    ids = torch.empty(3, 0, dtype=torch.int64)
    result = chain_verify(empty, empty, ids, bonus, _uniforms(3, 0, 0.5))
    assert result.token_ids.tolist() == [[2], [0], [1]]
    assert result.num_accepted.tolist() == [0, 0, 0]


@pytest.mark.parametrize("bonus_shape", [(2,), (2, 1)])
def test_all_accepted_emits_the_bonus(bonus_shape: tuple[int, ...]) -> None:
    # q >= p at every drafted token, so every uniform accepts.
    target = torch.tensor([[[0.1, 0.9], [0.6, 0.4]]] * 2)
    draft = torch.tensor([[[0.2, 0.8], [0.5, 0.5]]] * 2)
    bonus = torch.tensor([0, 1]).view(bonus_shape)
    ids = torch.tensor([[1, 0], [1, 0]])
    result = chain_verify(target, draft, ids, bonus, _uniforms(2, 2, 0.0))
    assert result.token_ids.tolist() == [[1, 0, 0], [1, 0, 1]]
    out = RejectionSampler()(target, bonus.view(2, 1), draft, ids)
    assert out.tolist() == [[1, 0, 0], [1, 0, 1]]


# ----------------------------------------------------------------------------------------
# The residual draw
# ----------------------------------------------------------------------------------------


def _residual(
    target: torch.Tensor,
    target_rows: torch.Tensor,
    draft: torch.Tensor,
    draft_rows: torch.Tensor,
    uniform: torch.Tensor,
) -> torch.Tensor:
    """``sample_residual`` on dense ``[rows, vocab]`` target and draft rows."""
    return sample_residual(
        ProbRows(target).select(target_rows),
        uniform,
        target.shape[-1],
        draft=ProbRows(draft).select(draft_rows),
    )


def _edge_uniforms(count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    grid = torch.arange(count, dtype=torch.float64) / count
    drawn = torch.rand(count, dtype=torch.float64, generator=generator)
    edges = [0.0, 2.0**-53, 0.5, 1.0 - 2.0**-24, LARGEST_BELOW_ONE]
    return torch.cat([torch.tensor(edges, dtype=torch.float64), grid, drawn])


def test_flat_draw_of_rows_equals_the_hierarchical_draw_without_drafts() -> None:
    """A draft-free draw: ``sample_rows`` picks the token the residual hierarchy picks.

    3 vocabularies (one block, several blocks, a partial last block), 40 rows each, and the
    edge uniforms (0, the smallest, 1/2, the largest float below 1) plus a grid; the two
    prefix sums may round differently only within float32's epsilon of a cell boundary, so
    at most one draw in a thousand may differ, and never onto a zero-probability token.
    """
    generator = torch.Generator().manual_seed(5)
    for vocab in (7, 4096, 5000):
        probs = torch.rand(40, vocab, generator=generator) ** 4
        probs[:, ::3] = 0.0
        probs /= probs.sum(dim=-1, keepdim=True)
        uniforms = _edge_uniforms(95, seed=vocab)
        rows = torch.arange(uniforms.shape[0]) % 40
        flat = sample_rows(ProbRows(probs), rows, uniforms)
        tree = sample_residual(ProbRows(probs).select(rows), uniforms, vocab)
        assert int((flat != tree).sum()) <= 1
        assert bool((probs[rows, flat] > 0).all())


def test_flat_draw_of_rows_takes_big_batches_in_chunks() -> None:
    """More rows than one chunk holds: the same tokens as drawing each row alone."""
    vocab = 5000
    probs = torch.softmax(torch.randn(300, vocab, generator=torch.Generator().manual_seed(2)), -1)
    uniforms = torch.rand(300, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rows = torch.arange(300)
    together = sample_rows(ProbRows(probs), rows, uniforms)
    alone = [int(sample_rows(ProbRows(probs), rows[i : i + 1], uniforms[i : i + 1])) for i in rows]
    assert together.tolist() == alone


@pytest.mark.parametrize("residual_mass", [1e-2, 1e-5])
def test_residual_never_returns_a_token_without_residual_mass(residual_mass: float) -> None:
    """Vocab 50_000 with ``q - p > 0`` on two tokens only (one in the last, partial block)."""
    vocab, support = 50_000, (7, 49_999)
    draft = torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)
    target = draft * (1.0 - residual_mass)
    lift = residual_mass * (vocab - 2) / vocab / 2
    for token in support:
        target[token] = draft[token] + lift
    target32, draft32 = target.to(torch.float32), draft.to(torch.float32)
    assert int(((target32 - draft32) > 0).sum()) == 2
    uniforms = _edge_uniforms(2000)
    rows = torch.zeros(uniforms.shape[0], dtype=torch.int64)
    tokens = _residual(target32.view(1, -1), rows, draft32.view(1, -1), rows, uniforms)
    assert set(tokens.tolist()) == set(support)
    assert tokens[0] == support[0] and tokens[4] == support[1]
    grid = tokens[5:2005]
    assert abs(float((grid == support[0]).to(torch.float64).mean()) - 0.5) < 0.01


def test_one_hot_residual_never_returns_the_draft() -> None:
    """With a one-hot draft ``x`` (a drafter without probabilities) the residual is ``q``
    without ``x``: ``x`` is never drawn, whatever the uniform."""
    vocab = 50_000
    generator = torch.Generator().manual_seed(2)
    target = torch.rand(1, vocab, generator=generator)
    target /= target.sum()
    uniforms = _edge_uniforms(500)
    rows = torch.zeros(uniforms.shape[0], dtype=torch.int64)
    for drafted in (0, 1023, 1024, 49_999):
        target_sel = ProbRows(target).select(rows)
        draft_token = torch.full_like(rows, drafted)
        tokens = sample_residual(target_sel, uniforms, vocab, draft_token=draft_token)
        assert not bool((tokens == drafted).any())
        assert bool(((tokens >= 0) & (tokens < vocab)).all())


def test_tiny_residual_is_not_lost_in_block_rounding() -> None:
    """Only token 0 has ``q > p`` (by one float32 ulp); after a rejection it must be drawn.

    ``q = [0.1 + ulp, 0.3 - ulp, 0.6]``, ``p = [0.1, 0.3, 0.6]``: the residual
    ``max(0, q - p)`` is ``[7.5e-9, 0, 0]``, so the only valid residual token is 0. The block
    sums ``sum q`` and ``sum min(q, p)`` round to the same float32, so a residual mass taken
    as their difference would be lost and the row would fall back to sampling ``q``.
    """
    p = torch.tensor([0.1, 0.3, 0.6])
    q = p.clone()
    q[0] = torch.nextafter(p[0], torch.tensor(1.0))
    q[1] = torch.nextafter(p[1], torch.tensor(0.0))
    uniforms = torch.tensor([[LARGEST_BELOW_ONE, 0.5]], dtype=torch.float64)
    result = chain_verify(
        q.view(1, 1, 3), p.view(1, 1, 3), torch.tensor([[1]]), torch.tensor([0]), uniforms
    )
    assert result.num_accepted.tolist() == [0]
    assert result.token_ids.tolist() == [[0, -1]]


def test_one_hot_residual_near_certain_draft() -> None:
    """A one-hot draft ``x = 0`` with ``q(0) = 1 - 4e-8`` must never be redrawn.

    The residual is ``q`` without token 0 (mass 4e-8); a block mass taken as
    ``sum q - q(0)`` would round to 0 in float32, and a fallback to ``q`` would return the
    rejected draft itself.
    """
    q = torch.tensor([[1 - 4e-8, 2e-8, 2e-8]])
    rows = torch.zeros(3, dtype=torch.int64)
    uniforms = torch.tensor([0.0, 0.5, LARGEST_BELOW_ONE], dtype=torch.float64)
    tokens = sample_residual(ProbRows(q).select(rows), uniforms, 3, draft_token=rows)
    assert not bool((tokens == 0).any()), tokens.tolist()


def test_residual_without_mass_falls_back_to_the_target() -> None:
    """``q == p`` leaves no residual: the draw is an inverse CDF of ``q`` itself."""
    target = torch.tensor([0.1, 0.0, 0.25, 0.0, 0.4, 0.25])
    count = 10_000
    uniforms = torch.arange(count, dtype=torch.float64) / count
    rows = torch.zeros(count, dtype=torch.int64)
    tokens = _residual(target.view(1, -1), rows, target.view(1, -1), rows, uniforms)
    histogram = torch.bincount(tokens, minlength=6).to(torch.float64)
    assert bool(((histogram - count * target.to(torch.float64)).abs() <= 1).all())
    assert histogram[1] == 0 and histogram[3] == 0
    edge = _residual(
        target.view(1, -1),
        rows[:2],
        target.view(1, -1),
        rows[:2],
        torch.tensor([0.0, LARGEST_BELOW_ONE], dtype=torch.float64),
    )
    assert edge.tolist() == [0, 5]


def test_residual_reads_the_requested_rows() -> None:
    """Each draw reads its own target and draft rows (here one-hot residuals)."""
    vocab = 3000
    target = torch.zeros(4, vocab)
    draft = torch.zeros(4, vocab)
    for row, token in enumerate((5, 1024, 2047, 2999)):
        target[row, token] = 1.0
        draft[row, (token + 1) % vocab] = 1.0
    rows = torch.tensor([3, 0, 2, 1, 3])
    uniforms = torch.tensor([0.0, 0.3, 0.6, 0.9, LARGEST_BELOW_ONE], dtype=torch.float64)
    tokens = _residual(target, rows, draft, rows, uniforms)
    assert tokens.tolist() == [2999, 5, 2047, 1024, 2999]


GARBAGE = {
    "nan": float("nan"),
    "inf": float("inf"),
    "negative": -0.5,
    "unnormalised": 7.0,
    "zero": 0.0,
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_inputs_never_leave_the_vocabulary(kind: str) -> None:
    """Invalid probabilities (no strict mode) never crash nor emit ids outside the vocabulary."""
    target, bonus, draft, ids = _random_inputs(64, 4, 11, seed=5)
    value = GARBAGE[kind]
    generator = torch.Generator().manual_seed(6)
    for probs in (target, draft):
        mask = torch.rand(probs.shape, generator=generator) < 0.3
        probs.masked_fill_(mask, value)
    target[0] = value
    draft[1] = value
    target[2], draft[2] = value, value
    ids[3, 1] = -1
    out = RejectionSampler()(target, bonus, draft, ids)
    _check_layout(out, ids, 11)
    rows = torch.arange(64 * 4)
    for uniform in (0.0, 0.5, LARGEST_BELOW_ONE):
        uniforms = torch.full((rows.shape[0],), uniform, dtype=torch.float64)
        picked = _residual(target.view(-1, 11), rows, draft.view(-1, 11), rows, uniforms)
        assert bool(((picked >= 0) & (picked < 11)).all())


def test_nan_residual_row_in_a_large_vocabulary() -> None:
    vocab = 5000
    target = torch.full((2, vocab), float("nan"))
    target[1] = -1.0
    draft = torch.rand(2, vocab)
    rows = torch.tensor([0, 1, 0, 1])
    uniforms = torch.tensor([0.0, 0.0, LARGEST_BELOW_ONE, LARGEST_BELOW_ONE], dtype=torch.float64)
    tokens = _residual(target, rows, draft, rows, uniforms)
    assert bool(((tokens >= 0) & (tokens < vocab)).all())


# ----------------------------------------------------------------------------------------
# Dtypes, layouts, randomness, compilation
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_float32_on_representable_values(dtype: torch.dtype) -> None:
    """Probabilities on a 1/64 grid are exact in every dtype, so the results coincide."""
    generator = torch.Generator().manual_seed(8)
    target = torch.randint(0, 9, (200, 3, 6), generator=generator).float() / 64
    draft = torch.randint(0, 9, (200, 3, 6), generator=generator).float() / 64
    draft[..., 0] += 1 / 64
    ids = torch.multinomial(draft.view(-1, 6), 1, generator=generator).view(200, 3)
    bonus = torch.randint(6, (200,), generator=generator)
    uniforms = torch.rand(200, 4, dtype=torch.float64, generator=generator)
    expected = chain_verify(target, draft, ids, bonus, uniforms)
    result = chain_verify(target.to(dtype), draft.to(dtype), ids, bonus, uniforms)
    assert torch.equal(result.token_ids, expected.token_ids)
    out = RejectionSampler()(target.to(dtype), bonus.view(-1, 1), draft.to(dtype), ids)
    _check_layout(out, ids, 6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes_through_the_module(dtype: torch.dtype) -> None:
    target, bonus, draft, ids = draw_inputs(make_family("peaked", 3, vocab=9), rows=500, seed=2)
    seeds = torch.arange(500)
    sampler = RejectionSampler(strict_mode=True)
    out = sampler(target.to(dtype), bonus, draft.to(dtype), ids, seeds=seeds, positions=seeds)
    _check_layout(out, ids, 9)


def test_non_contiguous_inputs_give_identical_results() -> None:
    """Views (a target sliced from ``[batch, k + 1, vocab]``, a transposed draft, strided ids)
    give exactly the results of their contiguous copies."""
    generator = torch.Generator().manual_seed(4)
    batch, k, vocab = 300, 4, 1500
    full = _normalised(batch, k + 1, vocab, generator=generator)
    target = full[:, :k]
    draft = _normalised(batch, vocab, k, generator=generator).transpose(1, 2)
    draft = draft / draft.sum(dim=-1, keepdim=True)
    wide_ids = torch.randint(vocab, (batch, 2 * k), generator=generator)
    ids = wide_ids[:, ::2]
    wide_bonus = torch.randint(vocab, (batch, 3), generator=generator)
    bonus = wide_bonus[:, 1:2]
    assert not target.is_contiguous() and not draft.is_contiguous() and not ids.is_contiguous()
    ids[:, 0] = target[:, 0].argmax(dim=-1)
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64, generator=generator)
    strided = chain_verify(target, draft, ids, bonus, uniforms)
    dense = chain_verify(
        target.contiguous(), draft.contiguous(), ids.contiguous(), bonus.contiguous(), uniforms
    )
    assert torch.equal(strided.token_ids, dense.token_ids)
    one = chain_verify(target[7:8], draft[7:8], ids[7:8], bonus[7:8], uniforms[7:8])
    assert torch.equal(one.token_ids, dense.token_ids[7:8])
    seeds = torch.arange(batch)
    a = RejectionSampler()(target, bonus, draft, ids, seeds=seeds, positions=seeds)
    b = RejectionSampler()(
        target.contiguous(),
        bonus.contiguous(),
        draft.contiguous(),
        ids.contiguous(),
        seeds=seeds,
        positions=seeds,
    )
    assert torch.equal(a, b)


def test_generator_reproducibility() -> None:
    inputs = draw_inputs(make_family("random", 3), rows=2000, seed=3)

    def run(seed: int) -> torch.Tensor:
        return RejectionSampler()(*inputs, generator=torch.Generator().manual_seed(seed))

    first, again, other = run(123), run(123), run(124)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_seeded_rows_ignore_the_generator() -> None:
    inputs = draw_inputs(make_family("markov", 3), rows=500, seed=3)
    seeds = torch.arange(500) + 77
    at = torch.zeros_like(seeds)
    a = RejectionSampler()(
        *inputs, seeds=seeds, positions=at, generator=torch.Generator().manual_seed(1)
    )
    b = RejectionSampler()(
        *inputs, seeds=seeds, positions=at, generator=torch.Generator().manual_seed(2)
    )
    c = RejectionSampler()(*inputs, seeds=seeds + 1, positions=at)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_torch_compile_composes() -> None:
    target, bonus, draft, ids = _random_inputs(64, 4, 50, seed=9)
    uniforms = torch.rand(64, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(chain_verify, backend="eager", fullgraph=True)
    got = compiled(target, draft, ids, bonus, uniforms)
    expected = chain_verify(target, draft, ids, bonus, uniforms)
    assert torch.equal(got.token_ids, expected.token_ids)
    assert torch.equal(got.num_accepted, expected.num_accepted)
    sampler = RejectionSampler()
    module = torch.compile(sampler, backend="eager")
    seeds = torch.arange(64)
    out = module(target, bonus, draft, ids, seeds=seeds, positions=seeds)
    expected = RejectionSampler()(target, bonus, draft, ids, seeds=seeds, positions=seeds)
    assert torch.equal(out, expected)
    assert int(sampler.num_emitted_tokens) == int((out != -1).sum())


# ----------------------------------------------------------------------------------------
# The target argument under its two names
# ----------------------------------------------------------------------------------------


def test_target_argument_takes_either_name() -> None:
    target = torch.full((2, 3, 4), 0.25)
    name, got = target_argument(target, None, "target_with_bonus_probs")
    assert name == "target_with_bonus_probs" and got is target
    name, got = target_argument(None, target, "target_with_bonus_probs")
    assert name == "target_probs" and got is target


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ((None, None), r"missing the target probabilities: pass target_with_bonus_probs \(or"),
        ((torch.ones(1, 1, 2), torch.ones(1, 1, 2)), "got both target_with_bonus_probs and"),
        (([[[1.0]]], None), "first_name must be a torch.Tensor, got list"),
        ((None, [[[1.0]]]), "target_probs must be a torch.Tensor, got list"),
    ],
)
def test_target_argument_errors_name_the_arguments(
    given: tuple[object, object], match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        target_argument(*given, "first_name")


def test_draft_positions_drops_only_the_bonus_row() -> None:
    target = torch.rand(2, 4, 5)
    assert torch.equal(draft_positions(target, torch.zeros(2, 3, 5)), target[:, :3])
    assert draft_positions(target, torch.zeros(2, 4, 5)) is target
    assert draft_positions(target, torch.zeros(2, 3, 6)) is target


def test_constructors_document_themselves() -> None:
    """``help(RejectionSampler.__init__)`` shows the sampler's parameters, not ``nn.Module``'s."""
    import inspect

    for cls in (RejectionSampler, TypicalAcceptanceSampler):
        doc = inspect.getdoc(cls.__init__) or ""
        assert doc != inspect.getdoc(torch.nn.Module.__init__)
        assert "strict_mode" in doc and "Parameters" in doc
    assert "backend" in (inspect.getdoc(RejectionSampler.__init__) or "")
