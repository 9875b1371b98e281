"""The fused CPU kernel of ``method="gumbel"`` (:mod:`specsample.kernels.cpu.gumbel`, through
:func:`specsample.backends.cpu.verify_gumbel`).

``verify(..., method="gumbel", backend="cpu")`` returns the PyTorch backend's tokens and
accepted counts, column for column, on random ragged batches: greedy, sampled and mixed
requests, temperatures, top-k, top-p and min-p, counter-seeded requests at positions and
requests on a generator, given bonus tokens, half-precision logits, rows with infinities and
NaN, vocabularies that are not multiples of a block, drafts rejected early, accepted
throughout or rejected midway; on one thread and on two. Drafts equal to the target's own
tokens are all accepted. The kernel's token bits are those of :mod:`specsample.noise`, and
the bounds it skips tokens by never lie below a token's noise. Every test is skipped without
numba.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from specsample import verify
from specsample.backends import cpu
from specsample.kernels.cpu import compiler, launch
from specsample.noise import gumbel_bits, gumbel_noise

pytestmark = pytest.mark.skipif(not compiler.available(), reason="the CPU backend needs numba")

Case = tuple[torch.Tensor, torch.Tensor, list[int], dict[str, Any]]


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    compiler.warm_up()
    assert compiler.ready()


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The threads of the CPU backend's calls: one (the serial kernel), or two sharing the
    requests (the parallel kernel, for every batch of more than one request)."""
    if request.param > 1:
        monkeypatch.setattr(launch, "_PARALLEL_ELEMENTS", 0)
    return int(request.param)


@contextlib.contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _pick(gen: torch.Generator, off: float, low: float, high: float, batch: int) -> list[float]:
    """Per request: ``off`` half of the time, else a value in ``[low, high)``."""
    values = torch.rand(2, batch, generator=gen, dtype=torch.float64)
    return [off if a < 0.5 else low + (high - low) * float(b) for a, b in values.T]


def _case(seed: int) -> Case:
    """A random ragged batch: target logits, drafts, counts and the other arguments."""
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 7, (1,), generator=gen))
    vocab = int(torch.randint(2, 3000, (1,), generator=gen))
    counts = torch.randint(0, 5, (batch,), generator=gen).tolist()
    drafts = sum(counts)
    given_bonus = seed % 4 == 0
    target = torch.randn(drafts + (0 if given_bonus else batch), vocab, generator=gen)
    target *= float(torch.rand(1, generator=gen)) * 8 + 0.5
    kwargs: dict[str, Any] = {
        "temperature": [0.0 if t < 0.3 else t for t in _pick(gen, 1.0, 0.0, 2.0, batch)],
        "top_k": [int(k) for k in _pick(gen, 0, 1, 40, batch)],
        "top_p": _pick(gen, 1.0, 0.3, 1.0, batch),
        "min_p": _pick(gen, 0.0, 0.01, 0.5, batch),
    }
    for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)):
        if seed % 3 == 0 or all(v == off for v in kwargs[name]):
            del kwargs[name]
    if seed % 2:
        seeds = torch.randint(0, 99, (batch,), generator=gen).tolist()
        kwargs["seeds"] = [None if s % 3 == 0 else s for s in seeds]
        kwargs["positions"] = torch.randint(0, 1000, (batch,), generator=gen).tolist()
    if given_bonus:
        kwargs["bonus_token_ids"] = torch.randint(0, vocab, (batch,), generator=gen)
    ids = torch.randint(0, vocab, (drafts,), generator=gen)
    return target, ids, counts, kwargs


def _run(target: torch.Tensor, ids: torch.Tensor, counts: list[int], backend: str,
         **kwargs: Any) -> Any:  # fmt: skip
    """``verify(..., method="gumbel")`` with a fresh generator of seed 7 (the same numbers
    for every call)."""
    generator = torch.Generator().manual_seed(7)
    return verify(
        target, ids, counts, method="gumbel", backend=backend, generator=generator, **kwargs
    )


def _assert_same(target: torch.Tensor, ids: torch.Tensor, counts: list[int], threads: int,
                 **kw: Any) -> None:  # fmt: skip
    """The CPU backend, on ``threads`` threads, gives the PyTorch backend's result."""
    expected = _run(target, ids, counts, "torch", **kw)
    with _torch_threads(threads):
        got = _run(target, ids, counts, "cpu", **kw)
    assert torch.equal(got.token_ids, expected.token_ids)
    assert torch.equal(got.num_accepted, expected.num_accepted)


def _followed(target: torch.Tensor, ids: torch.Tensor, counts: list[int], **kw: Any
              ) -> torch.Tensor:  # fmt: skip
    """The drafts replaced, one position per round, by the target's tokens (the PyTorch
    backend's): accepted throughout, but at rows without a distribution."""
    ids = ids.clone()
    starts = np.cumsum([0, *counts])
    for _ in range(max(counts, default=0)):
        out = _run(target, ids, counts, "torch", **kw)
        for b, n in enumerate(out.num_accepted.tolist()):
            if n < counts[b]:
                ids[starts[b] + n] = out.token_ids[b, n]
    return ids


def _variants(seed: int) -> Iterator[Case]:
    """The case of ``seed`` with random drafts, with the target's own tokens as drafts, and
    with those tokens altered at one position of some requests."""
    target, ids, counts, kwargs = _case(seed)
    yield target, ids, counts, kwargs
    followed = _followed(target, ids, counts, **kwargs)
    yield target, followed, counts, kwargs
    gen = torch.Generator().manual_seed(seed + 1000)
    altered = followed.clone()
    if altered.numel():
        where = torch.randint(0, altered.numel(), (len(counts),), generator=gen)
        altered[where] = torch.randint(0, target.shape[1], where.shape, generator=gen)
    yield target, altered, counts, kwargs


def test_same_tokens_as_the_pytorch_backend(threads: int) -> None:
    for seed in range(30):
        for target, ids, counts, kwargs in _variants(seed):
            _assert_same(target, ids, counts, threads, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_gives_the_same_tokens(dtype: torch.dtype, threads: int) -> None:
    """Half-precision rows, widened to float32 for the kernel: PyTorch's tokens (whose
    ``z`` are computed from the same float32 values)."""
    for seed in range(8):
        for target, ids, counts, kwargs in _variants(seed):
            _assert_same(target.to(dtype), ids, counts, threads, **kwargs)


def test_extreme_rows_give_the_same_tokens(threads: int) -> None:
    """``+inf`` logits (one, or several: uniform over them), NaN, all ``-inf``, ``-inf``
    entries, huge logits at a low temperature, ids outside the vocabulary."""
    for seed in range(12):
        target, ids, counts, kwargs = _case(seed)
        rows, vocab = target.shape
        target[0, 3 % vocab] = math.inf
        target[1 % rows, 5 % vocab] = math.nan
        target[2 % rows] = -math.inf
        target[3 % rows, :10] = 3e38
        target[4 % rows, 7 % vocab] = -math.inf
        target[5 % rows, 0] = math.inf
        target[5 % rows, 9 % vocab] = math.inf
        if seed % 2:
            kwargs["temperature"] = [0.05 if t else 0.0 for t in kwargs["temperature"]]
        for target_, drafts, counts_, kw in _variants_of(target, ids, counts, kwargs):
            if drafts.numel():
                drafts[0] = vocab
                drafts[-1] = -1
            _assert_same(target_, drafts, counts_, threads, **kw)


def _variants_of(target: torch.Tensor, ids: torch.Tensor, counts: list[int],
                 kwargs: dict[str, Any]) -> Iterator[Case]:  # fmt: skip
    """The given drafts, and the target's own tokens as drafts."""
    yield target, ids.clone(), counts, kwargs
    yield target, _followed(target, ids, counts, **kwargs), counts, kwargs


def test_peaked_and_filtered_large_rows_give_the_same_tokens(threads: int) -> None:
    """Rows of 50,000 tokens whose blocks mostly cannot win (a few large logits, a low
    temperature, a top-k), where the kernel skips whole blocks."""
    gen = torch.Generator().manual_seed(5)
    counts = [3, 0, 2, 4]
    target = torch.randn(sum(counts) + 4, 50_003, generator=gen) * 2
    target[:, ::997] += 30.0
    ids = torch.randint(0, 50_003, (sum(counts),), generator=gen)
    for extra in ({}, {"top_k": [0, 5, 50, 1]}, {"top_p": 0.9}, {"min_p": 0.2}):
        kwargs = {"temperature": [1.0, 0.0, 0.3, 1.7], "seeds": [1, 2, 3, 4],
                  "positions": [0, 5, 9, 100], **extra}  # fmt: skip
        for target_, drafts, counts_, kw in _variants_of(target, ids, counts, kwargs):
            _assert_same(target_, drafts, counts_, threads, **kw)


def test_drafts_of_the_targets_own_tokens_are_all_accepted(threads: int) -> None:
    """Each request's tokens computed one row at a time (steps without drafts, at the row's
    position), then given as drafts: every draft accepted, and the bonus row's token
    emitted, by both backends."""
    gen = torch.Generator().manual_seed(3)
    counts, vocab = [4, 1, 3, 0, 2], 1_500
    batch = len(counts)
    target = torch.randn(sum(counts) + batch, vocab, generator=gen) * 3
    positions = [10, 0, 7, 3, 250]
    params = {"temperature": [1.0, 0.7, 0.0, 1.3, 0.9], "top_k": [0, 0, 0, 20, 0],
              "top_p": [1.0, 0.9, 1.0, 1.0, 1.0]}  # fmt: skip
    tokens, start = [], 0
    for b, n in enumerate(counts):
        row_params = {name: [values[b]] for name, values in params.items()}
        own = [
            int(_run(target[start + j : start + j + 1], torch.empty(0, dtype=torch.int64), [0],
                     "torch", seeds=[b + 1], positions=[positions[b] + j],
                     **row_params).token_ids[0, 0])
            for j in range(n + 1)
        ]  # fmt: skip
        tokens.append(own)
        start += n + 1
    ids = torch.tensor([t for own in tokens for t in own[:-1]], dtype=torch.int64)
    kwargs = {"seeds": [b + 1 for b in range(batch)], "positions": positions, **params}
    for backend in ("torch", "cpu"):
        with _torch_threads(threads if backend == "cpu" else 1):
            out = _run(target, ids, counts, backend, **kwargs)
        assert out.num_accepted.tolist() == counts
        for b, own in enumerate(tokens):
            assert out.token_ids[b, : counts[b] + 1].tolist() == own


def test_the_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 step and a bfloat16 one go to the kernel, not to the PyTorch code."""
    from specsample.kernels.cpu import gumbel

    calls = []
    for name in ("gumbel_logits", "gumbel_logits_serial"):
        kernel = getattr(gumbel, name)
        monkeypatch.setattr(gumbel, name, lambda *a, kernel=kernel: calls.append(kernel(*a)))
    monkeypatch.setattr(cpu.eager, "verify_gumbel", None)
    target, ids, counts, kwargs = _case(1)
    _run(target, ids, counts, "cpu", **kwargs)
    _run(target.bfloat16(), ids, counts, "cpu", **kwargs)
    assert len(calls) == 2


def test_token_bits_and_noise_are_those_of_the_definition() -> None:
    """The kernel's bits equal :func:`specsample.noise.gumbel_bits` bit for bit; its noise
    :func:`specsample.noise.gumbel_noise` to a unit in the last place."""
    from specsample.kernels.cpu.gumbel import noise, token_bits

    @compiler.njit
    def bits_and_noise(keys: np.ndarray, vocab: int, bits: np.ndarray, g: np.ndarray) -> None:
        for r in range(keys.shape[0]):
            for v in range(vocab):
                bits[r, v] = token_bits(v, np.uint64(keys[r]))
                g[r, v] = noise(np.uint64(bits[r, v]))

    keys = torch.tensor([0, 1, 2**31, 2**32 - 1, 123456789], dtype=torch.int64)
    bits, g = np.empty((5, 4099), np.int64), np.empty((5, 4099))
    bits_and_noise(keys.numpy(), 4099, bits, g)
    np.testing.assert_array_equal(bits, gumbel_bits(keys, 0, 4099).numpy())
    np.testing.assert_allclose(g, gumbel_noise(keys, 0, 4099).numpy(), rtol=4e-16, atol=4e-16)


def test_the_noise_bounds_are_upper_bounds() -> None:
    """The bound the kernel skips tokens by is at least the noise, at every power of two of
    ``2**32 - 1 - bits`` (where it is tightest), next to them, and at random bits."""
    from specsample.kernels.cpu.gumbel import noise, noise_bound

    @compiler.njit
    def noise_of(bits: np.ndarray, out: np.ndarray, bounds: np.ndarray) -> None:
        for i in range(bits.shape[0]):
            out[i] = noise(np.uint32(bits[i]))
            bounds[i] = noise_bound(np.uint32(bits[i]))

    powers = 2**32 - 1 - (1 << np.arange(32, dtype=np.int64))
    rng = np.random.default_rng(0)
    bits = np.concatenate([[0, 2**32 - 1], powers, powers - 1, powers + 1,
                           rng.integers(0, 2**32, 1_000_000)])  # fmt: skip
    bits = bits[(bits >= 0) & (bits < 2**32)]
    g, bounds = np.empty(bits.shape[0]), np.empty(bits.shape[0], np.float32)
    noise_of(bits, g, bounds)
    assert (g < bounds).all()
    assert bounds.max() < 23.0
