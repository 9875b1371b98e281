"""The fused CPU backend on logits (:mod:`specsample.kernels.cpu.logits`, through
:mod:`specsample.backends.cpu`).

:func:`~specsample.kernels.cpu.floats.exp32` is within one unit in the last place of the exact
exponential. Given the same uniforms, ``verify(..., backend="cpu")`` returns the PyTorch
backend's tokens and accepted counts, column for column: on random ragged batches (every kind
of draft rows: none, float32 and float64 probabilities, logits; given bonus tokens; greedy,
sampled and mixed requests), on extreme logits (infinities, NaN, all ``-inf`` rows, ``3e38``
at a low temperature, ids outside the vocabulary), on non-contiguous rows, on steps without
drafts, where the backend runs PyTorch's code (the block rule, half precision, a call recorded
by ``make_fx``), and with filters; the parallel kernel, whose threads share the walks, gives
them too. The row statistics the kernel computes agree with PyTorch's. The exactness harness
runs on the backend, on logits. Every test waits for the background compilation first, and is
skipped without numba.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from specsample import verify
from specsample.backends import cpu, eager
from specsample.kernels.cpu import compiler, launch
from specsample.params.metadata import SamplingMetadata
from specsample.testing import exactness_report
from tests.test_logits_exactness import (
    _assert_positions,
    _family,
    _one_hot_acceptance,
    _tables,
    logits_verifier,
)

pytestmark = pytest.mark.skipif(not compiler.available(), reason="the CPU backend needs numba")


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    compiler.warm_up()
    assert compiler.ready()


def test_exp32_is_within_one_ulp_of_the_exact_exponential() -> None:
    from specsample.kernels.cpu.floats import exp32

    @compiler.njit
    def exp_all(x: np.ndarray, out: np.ndarray) -> None:
        for i in range(x.shape[0]):
            out[i] = exp32(x[i])

    rng = np.random.default_rng(0)
    x = -np.abs(rng.standard_normal(200_000).astype(np.float32) * 30)
    x = np.concatenate([x, np.float32([0.0, -0.0, -1e-30, -87.4, -103.2, -104.0, -200.0])])
    out = np.empty_like(x)
    exp_all(x, out)
    exact = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(out.view(np.int32).astype(np.int64) - exact.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1
    x = np.float32([-np.inf])
    exp_all(x, out[:1])
    assert out[0] == 0.0


Case = tuple[torch.Tensor, torch.Tensor, list[int], dict[str, Any]]


def _case(seed: int, draft_kind: str, *, vocab: int | None = None) -> Case:
    """A random ragged batch: target logits, drafts, counts and the other arguments."""
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 7, (1,), generator=gen))
    vocab = vocab or int(torch.randint(2, 3000, (1,), generator=gen))
    counts = torch.randint(0, 5, (batch,), generator=gen).tolist()
    drafts = sum(counts)
    given_bonus = seed % 3 == 0
    target = torch.randn(drafts + (0 if given_bonus else batch), vocab, generator=gen) * 3
    ids = torch.randint(0, vocab, (drafts,), generator=gen)
    rows = torch.randn(drafts, vocab, generator=gen) * 2
    kwargs: dict[str, Any] = {
        "none": {},
        "probs32": {"draft_probs": torch.softmax(rows, -1)},
        "probs64": {"draft_probs": torch.softmax(rows.double(), -1)},
        "logits": {"draft_logits": rows},
    }[draft_kind]
    kwargs["temperature"] = [
        0.0 if float(torch.rand(1, generator=gen)) < 0.3 else 0.7 for _ in range(batch)
    ]
    kwargs["uniforms"] = torch.rand(batch, max(counts) + 1, generator=gen, dtype=torch.float64)
    if given_bonus:
        kwargs["bonus_token_ids"] = torch.randint(0, vocab, (batch,), generator=gen)
    return target, ids, counts, kwargs


def _assert_same(target: torch.Tensor, ids: torch.Tensor, counts: list[int], **kw: Any) -> None:
    expected = verify(target, ids, counts, backend="torch", **kw)
    got = verify(target, ids, counts, backend="cpu", **kw)
    assert torch.equal(got.token_ids, expected.token_ids)
    assert torch.equal(got.num_accepted, expected.num_accepted)


@pytest.mark.parametrize("draft_kind", ["none", "probs32", "probs64", "logits"])
def test_same_tokens_as_the_pytorch_backend(draft_kind: str) -> None:
    for seed in range(40):
        target, ids, counts, kwargs = _case(seed, draft_kind)
        _assert_same(target, ids, counts, **kwargs)


@pytest.mark.parametrize("draft_kind", ["none", "probs32", "logits"])
def test_uniforms_drawn_by_the_step_are_the_numbers_drawn_final_draw_last(draft_kind: str) -> None:
    """A step draws its generator's numbers final draw first and reads them with the final
    draw last: the same tokens, on the kernel and in PyTorch, as those numbers given so."""
    for seed in range(12):
        target, ids, counts, kwargs = _case(seed, draft_kind)
        del kwargs["uniforms"]
        drawn = torch.rand(
            len(counts), max(counts) + 1, dtype=torch.float64,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        expected = verify(
            target, ids, counts, backend="cpu", uniforms=drawn.roll(-1, dims=1), **kwargs
        )
        for backend in ("cpu", "torch"):
            got = verify(
                target, ids, counts, backend=backend,
                generator=torch.Generator().manual_seed(seed), **kwargs,
            )  # fmt: skip
            assert torch.equal(got.token_ids, expected.token_ids)
            assert torch.equal(got.num_accepted, expected.num_accepted)


@pytest.mark.parametrize("draft_kind", ["none", "probs32", "logits"])
def test_extreme_logits_give_the_same_tokens(draft_kind: str) -> None:
    """Infinities, NaN, rows without a distribution, huge logits at a low temperature, ids
    outside the vocabulary, uniforms at the edges."""
    target, ids, counts, kwargs = _case(4, draft_kind, vocab=1500)
    rows = target.shape[0]
    target[0, 3] = math.inf
    target[1 % rows, 5] = math.nan
    target[2 % rows] = -math.inf
    target[3 % rows, :10] = 3e38
    target[4 % rows, 7] = -math.inf
    target[5 % rows, 0] = math.inf
    target[5 % rows, 9] = math.inf
    if ids.numel():
        ids[0] = 1500
        ids[-1] = -1
    kwargs["temperature"] = [0.05 if t else 0.0 for t in kwargs["temperature"]]
    kwargs["uniforms"][:, 0] = 0.0
    kwargs["uniforms"][:, -1] = 1.0 - 2.0**-53
    _assert_same(target, ids, counts, **kwargs)


@pytest.mark.parametrize("draft_kind", ["none", "probs32", "logits"])
def test_threads_sharing_the_walks_give_the_same_tokens(
    draft_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every sampled step on the parallel kernel, where threads take sequences as they free
    up and compute rows ahead of the threads walking them (one sequence included): PyTorch's
    tokens, whichever thread computed a row, in repeated calls."""
    monkeypatch.setattr(launch, "_PARALLEL_ELEMENTS", 0)
    for seed in range(30):
        target, ids, counts, kwargs = _case(seed, draft_kind)
        for _ in range(3):
            _assert_same(target, ids, counts, **kwargs)
    target, ids, counts, kwargs = _case(4, draft_kind, vocab=1500)
    target[1 % target.shape[0], 5] = math.nan
    target[2 % target.shape[0]] = -math.inf
    _assert_same(target, ids, counts, **kwargs)


def test_a_row_another_thread_is_late_computing_is_computed_privately() -> None:
    """A walking thread that finds its next row still taken by a thread that does not finish
    it (here: taken, never published) computes the row's statistics itself, into its own
    copy, without writing the shared ones: the values a thread that claimed it would compute,
    for a row with a distribution and for one with a NaN."""
    from specsample.kernels.cpu import logits as kernels
    from specsample.kernels.cpu.compiler import njit

    @njit
    def settle(
        target: np.ndarray, norms: np.ndarray, states: np.ndarray, row: int, out: np.ndarray
    ) -> tuple[np.float32, np.ndarray]:
        own = np.empty((4, 1), np.float32)
        argmax = np.zeros(target.shape[0], np.int64)
        return kernels._settle(target, norms, argmax, states, row, out, own), own

    target = (torch.randn(2, 3000, generator=torch.Generator().manual_seed(2)) * 3).numpy()
    target[1, 17] = math.nan
    lazy = np.array([[math.nan] * 2, [1 / 0.7] * 2, [-math.inf] * 2, [math.nan] * 2], np.float32)
    for row in range(2):
        claimed, shared = lazy.copy(), np.empty(3000, np.float32)
        total, own = settle(target, claimed, np.zeros(2, np.int64), row, shared)
        late, private = lazy.copy(), np.empty(3000, np.float32)
        late_total, late_own = settle(target, late, np.ones(2, np.int64), row, private)
        np.testing.assert_array_equal(late, lazy)
        np.testing.assert_array_equal(late_own, own)
        np.testing.assert_array_equal(late_own[:, 0], claimed[:, row])
        np.testing.assert_array_equal([late_total], [total])
        if row == 0:
            np.testing.assert_array_equal(private, shared)
        else:
            assert math.isnan(total) and math.isnan(own[2, 0])


def test_a_large_batch_of_short_rows_shares_its_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty thousand sampled sequences on the parallel kernel: the threads share them (each
    looks for rows to compute ahead only once it has none left), with PyTorch's tokens."""
    monkeypatch.setattr(launch, "_PARALLEL_ELEMENTS", 0)
    gen = torch.Generator().manual_seed(11)
    batch, k, vocab = 50_000, 2, 6
    target = torch.randn(batch * (k + 1), vocab, generator=gen)
    ids = torch.randint(0, vocab, (batch * k,), generator=gen)
    uniforms = torch.rand(batch, k + 1, generator=gen, dtype=torch.float64)
    _assert_same(target, ids, [k] * batch, temperature=1.0, uniforms=uniforms)


def test_non_contiguous_rows_give_the_same_tokens() -> None:
    target, ids, counts, kwargs = _case(5, "logits", vocab=700)
    wide = torch.cat([target, target], dim=-1)[:, :700]
    draft = kwargs.pop("draft_logits")
    strided = torch.cat([draft, draft], dim=-1)[:, :700]
    _assert_same(target, ids, counts, **kwargs, draft_logits=draft)
    _assert_same(wide, ids, counts, **kwargs, draft_logits=strided)


@pytest.mark.parametrize(
    "extra",
    [
        {"top_k": 5},
        {"top_p": 0.8},
        {"min_p": 0.1},
        {"method": "block"},
        {"return_logprobs": True},
    ],
    ids=str,
)
def test_filters_and_what_the_kernel_does_not_take_give_the_same_result(
    extra: dict[str, Any],
) -> None:
    """Filters (thresholds by selection), the block rule (PyTorch's code), log-probabilities
    (full statistics)."""
    for seed in (1, 2, 4, 5):
        target, ids, counts, kwargs = _case(seed, "probs32")
        if "bonus_token_ids" in kwargs and "return_logprobs" in extra:
            continue
        expected = verify(target, ids, counts, backend="torch", **kwargs, **extra)
        got = verify(target, ids, counts, backend="cpu", **kwargs, **extra)
        assert torch.equal(got.token_ids, expected.token_ids)
        if expected.logprobs is not None:
            torch.testing.assert_close(got.logprobs, expected.logprobs, equal_nan=True)


def test_half_precision_gives_the_same_tokens() -> None:
    target, ids, counts, kwargs = _case(7, "probs32")
    _assert_same(target.bfloat16(), ids, counts, **kwargs)


def test_steps_without_drafts_run_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Target-only steps (every count 0: the draw from each request's own row), greedy,
    sampled and mixed, extreme rows included: the kernel runs, with PyTorch's tokens."""
    from specsample.kernels.cpu import logits

    calls = []
    for name in ("chain_logits", "chain_logits_serial"):
        kernel = getattr(logits, name)
        monkeypatch.setattr(logits, name, lambda *a, kernel=kernel: calls.append(kernel(*a)))
    for seed in range(12):
        target, ids, counts, kwargs = _case(seed, "none")
        batch = len(counts)
        rows = torch.randn(batch, target.shape[1], generator=torch.Generator().manual_seed(seed))
        rows[0, 1] = math.inf if seed % 4 == 1 else rows[0, 1]
        rows[-1] = -math.inf if seed % 4 == 2 else rows[-1]
        kwargs["uniforms"] = kwargs["uniforms"][:, :1]
        kwargs.pop("bonus_token_ids", None)
        _assert_same(rows, ids[:0], [0] * batch, **kwargs)
    assert len(calls) == 12


def test_row_statistics_agree_with_pytorch() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 5000, generator=gen) * 4
    logits[1, 4] = math.inf
    logits[2] = -math.inf
    logits[3, 8] = math.nan
    sampling = SamplingMetadata.build(6, logits.device, temperature=[0.5, 1.0, 1.0, 2.0, 0.0, 1.5])
    expected = eager.row_norms(logits, sampling, need_norm=True)
    full = cpu.row_norms(logits, sampling, need_norm=True)
    assert torch.equal(full.argmax, expected.argmax)
    assert torch.equal(full.shift, expected.shift)
    assert torch.equal(full.cutoff.isnan(), expected.cutoff.isnan())
    torch.testing.assert_close(full.log_norm, expected.log_norm, rtol=1e-6, atol=1e-6)
    lazy = cpu.row_norms(logits, sampling, need_norm=False)
    greedy = sampling.greedy
    assert torch.equal(lazy.argmax[greedy], expected.argmax[greedy])
    assert torch.equal(lazy.shift[greedy], expected.shift[greedy])
    assert lazy.lazy is not None and torch.equal(lazy.lazy, ~greedy)  # left to the walk
    usable = ~expected.cutoff.isnan()
    assert bool(lazy.log_norm[usable & greedy].isnan().all())  # not computed
    from specsample.kernels.cpu.logits import fill_norms

    stacked = torch.stack([lazy.shift, lazy.inv_temperature, lazy.cutoff, lazy.log_norm])
    fill_norms(logits.numpy(), stacked.numpy(), lazy.argmax.numpy(), lazy.lazy.numpy())
    assert torch.equal(lazy.argmax, expected.argmax)
    assert torch.equal(stacked[0], expected.shift)
    assert torch.equal(stacked[2].isnan(), expected.cutoff.isnan())
    torch.testing.assert_close(stacked[3], expected.log_norm, rtol=1e-6, atol=1e-6)


def test_calls_before_compilation_run_the_pytorch_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from specsample.kernels.cpu import logits

    def kernel(*args: object) -> None:
        raise AssertionError("the kernel ran before it was ready")

    monkeypatch.setattr(compiler, "ready", lambda: False)
    for name in ("chain_logits", "chain_logits_serial", "row_norms", "row_norms_serial"):
        monkeypatch.setattr(logits, name, kernel)
    target, ids, counts, kwargs = _case(8, "logits")
    _assert_same(target, ids, counts, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("draft_mode", ["probs", "logits", "none"])
def test_exact_on_the_cpu_backend_on_logits(draft_mode: str) -> None:
    """The harness on ``verify(..., backend="cpu")`` at temperature 0.8: 100,000 rows, k = 3,
    8 tokens (as ``tests/test_logits_exactness.py``; one-hot drafts are accepted with
    probability ``q(x)``, so their acceptance is compared with its own expectation).

    False-failure rate <= 1e-4 (Bonferroni over the k + 3 tests); TV >= 0.0123 at position 0
    detected with probability >= 99%.
    """
    logits, draft = _tables(21)
    params = {"temperature": 0.8}
    family = _family("cpu-logits", logits, draft, params)
    verifier = logits_verifier(logits, {**params, "backend": "cpu"}, draft_mode)
    rows = 100_000
    report = exactness_report(verifier, family, rows=rows, seed=4)
    assert report.detectable_tv(0, 1e-4) <= 0.0123
    if draft_mode != "none":
        assert report.passed(1e-4), str(report)
        return
    _assert_positions(report)
    rate, mean, variance = _one_hot_acceptance(family)
    z_max = report.z_threshold(1e-4)
    z_rate = (report.acceptance_rate - rate) / math.sqrt(rate * (1 - rate) / rows)
    z_mean = (report.mean_accepted - mean) / math.sqrt(variance / rows)
    assert abs(z_rate) < z_max and abs(z_mean) < z_max, (z_rate, z_mean, str(report))


def test_a_recorded_call_records_pytorch_operations_not_the_kernels_result() -> None:
    """Under ``make_fx``, ``verify(..., backend="cpu")`` runs PyTorch's code: the graph gives
    the tokens of other inputs (a kernel run there would bake the recorded tokens in)."""

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        target, ids, draft, uniforms = inputs
        return verify(
            target, ids, [2, 3], draft_probs=draft, temperature=0.7, uniforms=uniforms,
            backend="cpu",
        ).token_ids  # fmt: skip

    def inputs(seed: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        draft = torch.softmax(torch.randn(5, 60, generator=gen), -1)
        return (
            torch.randn(7, 60, generator=gen) * 3,
            torch.randint(0, 60, (5,), generator=gen),
            draft,
            torch.rand(2, 4, generator=gen, dtype=torch.float64),
        )

    recorded, other = inputs(0), inputs(1)
    assert not torch.equal(step(*recorded), step(*other))
    graph = make_fx(step)(*recorded)
    assert torch.equal(graph(*other), step(*other))
