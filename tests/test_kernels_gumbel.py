"""The keyed Gumbel-max kernel (:mod:`specsample.kernels.triton.gumbel`) against the PyTorch
backend.

Through :func:`specsample.verify` with ``method="gumbel"``, ``backend="triton"`` must emit the
tokens and counts of ``backend="torch"`` bit for bit: ragged batches (counts of 0 included),
greedy, sampled and mixed requests, temperature, top-k, top-p and min-p, counter-seeded
requests at their positions beside unseeded ones (the same ``generator=`` seed for both
calls), given bonus tokens, float32, float16, bfloat16 and float64 logits, rows with
``-inf``, NaN and ``+inf`` logits, and vocabularies of one block or of several with a partial
last one. Drafts are favoured in their rows, so that requests accept some and reject others.

The kernel runs under Triton's interpreter on CPU tensors, which must be switched on before
triton is first imported (see ``tests/test_kernels.py``): in a plain ``pytest`` run this
module's kernel tests run in a fresh process started by
``test_kernels.py::test_kernels_under_the_interpreter``, with ``TRITON_INTERPRET=1`` from the start,
and in-process when ``pytest`` itself was started with it. Without triton they are skipped.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pytest
import torch

from specsample import backends, verify
from specsample.backends import triton as triton_backend
from specsample.kernels.triton import gumbel
from tests.test_kernels import requires_interpreter


def test_triton_backend_runs_the_gumbel_kernel() -> None:
    """The Triton backend's Gumbel slot is the kernel's, the others keep theirs."""
    assert backends.get("triton").gumbel is triton_backend.verify_gumbel
    assert backends.get("torch").gumbel is not triton_backend.verify_gumbel


class Case(NamedTuple):
    """A random batch: its counts, vocabulary, dtype, options and special rows."""

    counts: list[int]
    vocab: int
    dtype: torch.dtype = torch.float32
    options: dict[str, Any] | None = None
    bonus: bool = False
    special: bool = False


MIXED = {
    "temperature": [0.0, 0.7, 1.0, 1.3, 0.0, 0.9],
    "top_k": [0, 5, 0, 3, 0, 0],
    "top_p": [1.0, 1.0, 0.8, 1.0, 1.0, 0.9],
    "min_p": [0.0, 0.0, 0.0, 0.05, 0.0, 0.1],
}
SEEDED = {"seeds": [11, None, 12, 13, None, 14], "positions": [0, 4, 9, 2**33, 7, 1]}

CASES = {
    "sampled": Case([3, 0, 2, 4, 1, 5], 37, options={"temperature": 0.8}),
    "greedy": Case([3, 0, 2, 4, 1, 5], 37, options={"temperature": 0.0}),
    "mixed": Case([3, 0, 2, 4, 1, 5], 50, options=MIXED),
    "seeded": Case([3, 0, 2, 4, 1, 5], 50, options={**MIXED, **SEEDED}),
    "bonus": Case([3, 0, 2, 4, 1, 5], 50, options={**MIXED, **SEEDED}, bonus=True),
    "float16": Case([2, 4, 0, 3, 1, 2], 40, torch.float16, {**MIXED, **SEEDED}),
    "bfloat16": Case([2, 4, 0, 3, 1, 2], 40, torch.bfloat16, MIXED, bonus=True),
    "float64": Case([2, 4, 0, 3, 1, 2], 40, torch.float64, {"temperature": 1.1}),
    "special": Case([3, 2, 0, 4, 1, 5], 30, options=MIXED, special=True),
    "special_bonus": Case([3, 2, 0, 4, 1, 5], 30, options=SEEDED, bonus=True, special=True),
    "wide": Case([1, 0, 2], 20, options={"temperature": 1.0, "max_draft_tokens": 5}),
    "no_drafts": Case([0, 0, 0], 20, options={"temperature": [0.5, 0.0, 1.0]}),
    "two_blocks": Case([2, 3, 0], 1100, options={"temperature": [1.0, 0.6, 1.0]}),
}


def _special_rows(logits: torch.Tensor) -> None:
    """Rows without a distribution (all ``-inf``, a NaN), with ``+inf`` logits, half ``-inf``."""
    logits[0] = -math.inf
    logits[2, 3] = math.nan
    logits[4, 1] = math.inf
    logits[5, 0::2] = -math.inf
    logits[7, 5] = math.inf
    logits[7, 9] = math.inf
    logits[9] = -math.inf
    logits[9, 4] = 0.0


def _batch(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target logits (draft rows, then bonus rows unless ``case.bonus``) and the drafts.

    Three drafts in four are favoured in their own rows, so that requests accept some and
    reject others.
    """
    gen = torch.Generator().manual_seed(seed)
    total = sum(case.counts)
    ids = torch.randint(0, case.vocab, (total,), generator=gen)
    rows: list[torch.Tensor] = []
    start = 0
    for count in case.counts:
        row = torch.randn(count + (0 if case.bonus else 1), case.vocab, generator=gen) * 2.0
        top = row[:count].amax(dim=-1) + 1.5
        favoured = torch.rand(count, generator=gen) < 0.75
        row[torch.arange(count)[favoured], ids[start : start + count][favoured]] = top[favoured]
        rows.append(row)
        start += count
    logits = torch.cat(rows)
    if case.special:
        _special_rows(logits)
    return logits.to(case.dtype), ids


def _both(
    logits: torch.Tensor, ids: torch.Tensor, case: Case, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both backends on one batch; asserts bit-equal outputs, returns the kernel's."""
    extra: dict[str, Any] = dict(case.options or {})
    if case.bonus:
        extra["bonus_token_ids"] = torch.arange(len(case.counts)) + case.vocab // 2
    outputs = [
        verify(
            logits,
            ids,
            case.counts,
            method="gumbel",
            backend=backend,
            generator=torch.Generator().manual_seed(seed),
            **extra,
        )
        for backend in ("torch", "triton")
    ]
    reference, kernel = outputs
    assert kernel.token_ids.dtype == torch.int64 and kernel.num_accepted.dtype == torch.int64
    assert torch.equal(kernel.token_ids, reference.token_ids), (kernel, reference)
    assert torch.equal(kernel.num_accepted, reference.num_accepted), (kernel, reference)
    return kernel.token_ids, kernel.num_accepted


@requires_interpreter
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_gumbel_kernel_matches_torch(name: str) -> None:
    """Bit-equal tokens and counts to the PyTorch backend over a few random batches."""
    case = CASES[name]
    accepted = rejected = 0
    for seed in range(3):
        logits, ids = _batch(case, seed)
        _, num_accepted = _both(logits, ids, case, seed)
        counts = torch.tensor(case.counts)
        accepted += int(num_accepted.sum())
        rejected += int((num_accepted < counts).sum())
    if sum(case.counts):
        assert accepted > 0 and rejected > 0, (accepted, rejected)


@requires_interpreter
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_gumbel_kernel_over_many_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 64 columns over a vocabulary of 200 (the last block partial)."""
    monkeypatch.setattr(gumbel, "COLUMNS", 64)
    for name in ("seeded", "bonus", "special"):
        case = CASES[name]._replace(vocab=200)
        for seed in range(2):
            logits, ids = _batch(case, seed)
            _both(logits, ids, case, seed)


@requires_interpreter
def test_gumbel_kernel_follows_the_noise_not_the_drafts() -> None:
    """A seeded request emits the same tokens whatever its drafts: all accepted when they
    are the target's own tokens, the first one at the first mismatch otherwise."""
    case = Case([4], 64, options={"temperature": 1.0, "seeds": [5], "positions": [3]})
    logits, ids = _batch(case, 0)
    first, _ = _both(logits, ids, case, 0)
    tokens = [int(first[0, 0])]
    while len(tokens) <= 4:
        drafts = torch.tensor(tokens + [0] * (4 - len(tokens)))[:4]
        out, num_accepted = _both(logits, drafts, case, 0)
        accepted = int(num_accepted[0])
        assert accepted >= len(tokens) and out[0, : len(tokens)].tolist() == tokens
        tokens = out[0, : accepted + 1].tolist()
    out, num_accepted = _both(logits, torch.tensor(tokens[:4]), case, 0)
    assert num_accepted.tolist() == [4] and out[0].tolist() == tokens


@requires_interpreter
def test_gumbel_kernel_on_an_empty_batch() -> None:
    """No request: empty outputs of the reference's shapes."""
    logits, ids = torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64)
    out = verify(logits, ids, [], method="gumbel", backend="triton", temperature=1.0)
    assert out.token_ids.shape == (0, 1) and out.num_accepted.shape == (0,)
