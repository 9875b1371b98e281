"""Property tests of the chain verifier on random shapes and values."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from specsample.rules.chain import chain_verify
from specsample.sampler import RejectionSampler

SETTINGS = settings(max_examples=60, deadline=None)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _rows(shape: tuple[int, ...], generator: torch.Generator, zeros: float) -> torch.Tensor:
    """Normalised rows with about ``zeros`` of their entries zero (never a whole row)."""
    rows = torch.rand(*shape, generator=generator, dtype=torch.float64)
    drop = torch.rand(*shape, generator=generator) < zeros
    keep = torch.nn.functional.one_hot(rows.argmax(dim=-1), shape[-1]).bool()
    rows = rows.masked_fill(drop & ~keep, 0.0)
    return rows / rows.sum(dim=-1, keepdim=True)


@st.composite
def chain_inputs(draw: st.DrawFn) -> dict:
    batch = draw(st.integers(1, 6))
    k = draw(st.integers(0, 5))
    vocab = draw(st.integers(1, 40))
    zeros = draw(st.sampled_from([0.0, 0.3, 0.8]))
    dtype = draw(st.sampled_from(DTYPES))
    ids_from_draft = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    target = _rows((batch, k, vocab), generator, zeros)
    draft = _rows((batch, k, vocab), generator, zeros)
    if rows := draw(st.integers(0, batch * k)):
        shared = _rows((rows, vocab), generator, zeros)
        target.view(-1, vocab)[:rows] = shared
        draft.view(-1, vocab)[:rows] = shared
    target, draft = target.to(dtype), draft.to(dtype)
    if ids_from_draft and k:
        flat = draft.view(-1, vocab).to(torch.float64)
        ids = torch.multinomial(flat, 1, generator=generator).view(batch, k)
    else:
        ids = torch.randint(-1, vocab + 2, (batch, k), generator=generator)
    bonus = torch.randint(vocab, (batch, 1), generator=generator)
    return {
        "target": target,
        "draft": draft,
        "ids": ids,
        "bonus": bonus,
        "seed": seed,
    }


def _check_output(out: torch.Tensor, inputs: dict) -> torch.Tensor:
    """Check layout and token validity; returns the number of accepted drafts per row."""
    target, draft, ids, bonus = inputs["target"], inputs["draft"], inputs["ids"], inputs["bonus"]
    batch, k, vocab = target.shape
    assert out.shape == (batch, k + 1) and out.dtype == torch.int64
    length = (out != -1).sum(dim=1)
    cols = torch.arange(k + 1)
    assert bool((length >= 1).all())
    assert bool(torch.where(cols < length.unsqueeze(-1), out >= 0, out == -1).all())
    accepted = length - 1
    q32, p32 = target.to(torch.float32), draft.to(torch.float32)
    for b in range(batch):
        n = int(accepted[b])
        assert torch.equal(out[b, :n], ids[b, :n])
        for j in range(n):
            assert 0 <= int(ids[b, j]) < vocab and float(q32[b, j, ids[b, j]]) > 0
        token = int(out[b, n])
        assert 0 <= token < vocab
        if n == k:
            assert token == int(bonus[b, 0])
            continue
        residual = (q32[b, n] - p32[b, n]).clamp(min=0)
        if float(residual.sum()) > 1e-6:
            assert float(residual[token]) > 0, (b, n, token)
        else:
            assert float(residual[token]) > 0 or float(q32[b, n, token]) > 0
    return accepted


@SETTINGS
@given(chain_inputs())
def test_sampler_output_and_counters(inputs: dict) -> None:
    sampler = RejectionSampler()
    generator = torch.Generator().manual_seed(inputs["seed"])
    args = (inputs["target"], inputs["bonus"], inputs["draft"], inputs["ids"])
    out = sampler(*args, generator=generator)
    accepted = _check_output(out, inputs)
    batch, k = inputs["ids"].shape
    assert int(sampler.num_accepted_tokens) == int(accepted.sum())
    assert int(sampler.num_emitted_tokens) == int((out != -1).sum())
    assert sampler.num_draft_tokens == batch * k
    per_position = (torch.arange(k) < accepted.unsqueeze(-1)).sum(dim=0)
    assert sampler.stats.accepted_per_position[:k].tolist() == per_position.tolist()


UNIFORM = st.one_of(
    st.sampled_from([0.0, 2.0**-53, 0.5, 1.0 - 2.0**-24, 1.0 - 2.0**-53]),
    st.floats(0.0, 1.0, exclude_max=True),
)


@SETTINGS
@given(chain_inputs(), st.data())
def test_acceptance_rule_with_injected_uniforms(inputs: dict, data: st.DataObject) -> None:
    """Drafts are accepted, in order, exactly while ``u * p(x) < q(x)`` with ``x`` in range."""
    target, draft, ids, bonus = inputs["target"], inputs["draft"], inputs["ids"], inputs["bonus"]
    batch, k, vocab = target.shape
    values = data.draw(st.lists(UNIFORM, min_size=batch * (k + 1), max_size=batch * (k + 1)))
    uniforms = torch.tensor(values, dtype=torch.float64).view(batch, k + 1)
    result = chain_verify(target, draft, ids, bonus, uniforms)
    accepted = _check_output(result.token_ids, inputs)
    assert torch.equal(result.num_accepted, accepted)
    for b in range(batch):
        expected = 0
        for j in range(k):
            x = int(ids[b, j])
            if not 0 <= x < vocab:
                break
            q, p = float(target[b, j, x]), float(draft[b, j, x])
            if not float(uniforms[b, j]) * p < q:
                break
            expected += 1
        assert int(accepted[b]) == expected


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 12),
    st.data(),
)
def test_arbitrary_values_never_escape_the_vocabulary(
    batch: int, k: int, vocab: int, data: st.DataObject
) -> None:
    """Any float32 values (NaN, infinities, negatives, huge, zeros) give a valid layout."""
    elements = st.floats(width=32, allow_nan=True, allow_infinity=True)
    shape = (batch, k, vocab)
    target = torch.from_numpy(data.draw(hnp.arrays(np.float32, shape, elements=elements)))
    draft = torch.from_numpy(data.draw(hnp.arrays(np.float32, shape, elements=elements)))
    ids = torch.tensor(
        data.draw(st.lists(st.integers(-2, vocab + 1), min_size=batch * k, max_size=batch * k))
    ).view(batch, k)
    bonus = torch.zeros(batch, 1, dtype=torch.int64)
    out = RejectionSampler()(target, bonus, draft, ids)
    length = (out != -1).sum(dim=1)
    cols = torch.arange(k + 1)
    body = cols < length.unsqueeze(-1)
    assert bool((length >= 1).all())
    assert bool(torch.where(body, (out >= 0) & (out < vocab), out == -1).all())
    for b in range(batch):
        n = int(length[b]) - 1
        assert torch.equal(out[b, :n], ids[b, :n])
