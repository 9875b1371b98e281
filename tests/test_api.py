"""The functional API :func:`specsample.verify` on flattened, ragged logits.

Covers :mod:`specsample.api.chain` (the entry points) and the PyTorch backend's steps
(:mod:`specsample.backends.eager`).

Deterministic properties of the contract: greedy rows against an argmax oracle, no random
numbers for all-greedy batches, seeded batch invariance, log-probabilities, the padded
entry point, input validation, degenerate rows, ``k = 0``, half-precision logits and peak
memory. The distribution of sampled rows is tested statistically in
``tests/test_logits_exactness.py``.

Statistical test: one chi-square test (bonus-only sampled rows, ``k = 0``) at level 1e-6,
so a correct verifier fails it with probability 1e-6; with 20_000 rows and df <= 5 it
detects a deviation of total variation >= 0.028 from the processed law with probability
>= 99% (:func:`specsample.testing.detectable_tv`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from specsample import VerifyOutput, verify, verify_padded
from specsample.bench import extra_peak_bytes
from specsample.probs import processed_probs

# --------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------


@dataclass
class Batch:
    """A flattened ragged batch and its per-request parameters."""

    logits: torch.Tensor
    ids: torch.Tensor
    counts: list[int]
    draft_probs: torch.Tensor
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def target_start(self) -> list[int]:
        """First target row of each request."""
        starts: list[int] = []
        row = 0
        for n in self.counts:
            starts.append(row)
            row += n + 1
        return starts

    def draft_kwargs(self, mode: str) -> dict[str, Any]:
        if mode == "probs":
            return {"draft_probs": self.draft_probs}
        if mode == "logits":
            return {"draft_logits": self.draft_probs.log()}
        return {}

    def run(self, mode: str = "none", **kwargs: object) -> VerifyOutput:
        """``verify`` on the batch; seeded requests sit at position 0 unless given others."""
        args = {**self.params, **self.draft_kwargs(mode), **kwargs}
        if args.get("seeds") is not None:
            args.setdefault("positions", [0] * len(self.counts))
        return verify(self.logits, self.ids, self.counts, **args)


def _draft_target_rows(counts: list[int]) -> list[int]:
    """The target row of every flattened draft position."""
    rows: list[int] = []
    start = 0
    for n in counts:
        rows.extend(range(start, start + n))
        start += n + 1
    return rows


def make_batch(
    counts: list[int],
    vocab: int,
    seed: int,
    *,
    scale: float = 3.0,
    agree: float = 0.0,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    """Random logits; drafts sampled from correlated draft rows.

    ``agree`` is the chance that a draft is replaced by the argmax of its target row (so
    greedy requests accept long prefixes).
    """
    gen = torch.Generator().manual_seed(seed)
    total = sum(counts)
    logits = torch.randn(total + len(counts), vocab, generator=gen) * scale
    rows = torch.tensor(_draft_target_rows(counts), dtype=torch.int64)
    noise = torch.randn(total, vocab, generator=gen)
    draft_probs = torch.softmax(0.8 * logits[rows] + scale * 0.5 * noise, dim=-1)
    if total:
        ids = torch.multinomial(draft_probs, 1, generator=gen).squeeze(-1)
        argmax = logits[rows].argmax(dim=-1)
        ids = torch.where(torch.rand(total, generator=gen) < agree, argmax, ids)
    else:
        ids = torch.zeros(0, dtype=torch.int64)
    return Batch(logits.to(dtype), ids, list(counts), draft_probs)


def greedy_oracle(logits: torch.Tensor, ids: torch.Tensor, counts: list[int]) -> list[list[int]]:
    """Accept while the draft is the argmax of its row; argmax at the first mismatch; bonus."""
    out, draft, row = [], 0, 0
    for n in counts:
        tokens = []
        for j in range(n):
            best = int(logits[row + j].float().argmax())
            tokens.append(best)
            if int(ids[draft + j]) != best:
                break
        else:
            tokens.append(int(logits[row + n].float().argmax()))
        out.append(tokens)
        draft, row = draft + n, row + n + 1
    return out


def _rows(out: VerifyOutput) -> list[list[int]]:
    """Emitted tokens per request, checking the -1 padding and ``num_emitted``."""
    result = []
    for tokens, emitted in zip(out.token_ids.tolist(), out.num_emitted.tolist(), strict=True):
        assert all(t >= 0 for t in tokens[:emitted])
        assert all(t == -1 for t in tokens[emitted:])
        result.append(tokens[:emitted])
    return result


def _equal_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


# --------------------------------------------------------------------------------------
# Greedy
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
def test_greedy_rows_match_the_argmax_oracle(mode: str) -> None:
    rng = random.Random(0)
    counts = [rng.randint(0, 6) for _ in range(300)]
    batch = make_batch(counts, vocab=97, seed=1, agree=0.8)
    # Filters are switched off for greedy requests.
    out = batch.run(mode, temperature=0.0, top_k=3, top_p=0.5, min_p=0.2)
    assert out.token_ids.shape == (300, max(counts) + 1)
    assert _rows(out) == greedy_oracle(batch.logits, batch.ids, counts)
    accepted = (out.num_emitted - 1).tolist()
    assert max(accepted) == 6 and min(accepted) == 0


def test_greedy_rows_in_a_mixed_batch_match_the_oracle() -> None:
    rng = random.Random(1)
    counts = [rng.randint(0, 5) for _ in range(200)]
    batch = make_batch(counts, vocab=64, seed=2, agree=0.7)
    temperature = [0.0 if i % 2 else 0.8 for i in range(200)]
    out = batch.run("probs", temperature=temperature, top_p=0.9)
    oracle = greedy_oracle(batch.logits, batch.ids, counts)
    rows = _rows(out)
    assert [rows[i] for i in range(1, 200, 2)] == [oracle[i] for i in range(1, 200, 2)]


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
def test_all_greedy_batch_draws_no_random_numbers(mode: str) -> None:
    batch = make_batch([3, 0, 2, 4], vocab=50, seed=3)
    generator = torch.Generator().manual_seed(5)
    state, generator_state = torch.get_rng_state(), generator.get_state()
    batch.run(mode, temperature=0.0, return_logprobs=True, generator=generator)
    batch.run(mode, temperature=0.0, seeds=[1, None, 2, None])
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(generator.get_state(), generator_state)


# --------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------

SEEDED_PARAMS: dict[str, dict[str, Any]] = {
    "plain": {"temperature": 0.9},
    "top-k/top-p": {"temperature": 1.1, "top_k": 40, "top_p": 0.85},
    "min-p": {"temperature": 0.7, "min_p": 0.05},
}


def _concat(batches: list[Batch], params: list[dict[str, Any]]) -> Batch:
    keys = ("temperature", "top_k", "top_p", "min_p", "seeds", "positions")
    defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    merged = {key: [p.get(key, defaults.get(key)) for p in params] for key in keys}
    batch = Batch(
        torch.cat([b.logits for b in batches]),
        torch.cat([b.ids for b in batches]),
        [n for b in batches for n in b.counts],
        torch.cat([b.draft_probs for b in batches]),
        merged,
    )
    batch.params["positions"] = torch.tensor(merged["positions"])
    return batch


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
@pytest.mark.parametrize("name", list(SEEDED_PARAMS))
def test_seeded_request_is_batch_invariant(name: str, mode: str) -> None:
    """Alone, first or last among 31 other requests: the same tokens and log-probabilities.

    Vocabulary 3000 spans three residual blocks. The others have different lengths and
    parameters; some are greedy, some unseeded.
    """
    vocab, rng = 3000, random.Random(7)
    others: list[Batch] = []
    other_params: list[dict[str, Any]] = []
    for i in range(31):
        others.append(make_batch([rng.randint(0, 6)], vocab, seed=100 + i))
        seed = None if i % 3 == 0 else rng.randint(0, 10**6)
        other_params.append(
            {
                "temperature": rng.choice([0.0, 0.6, 1.0, 1.4]),
                "top_k": rng.choice([0, 5, 100]),
                "top_p": rng.choice([1.0, 0.8]),
                "min_p": rng.choice([0.0, 0.1]),
                "seeds": seed,
                "positions": rng.randint(0, 100),
            }
        )
    outcomes = set()
    for trial in range(6):
        mine = make_batch([4], vocab, seed=trial, scale=2.0)
        params = {**SEEDED_PARAMS[name], "seeds": 1234 + trial, "positions": 17}
        alone = _concat([mine], [params]).run(mode, return_logprobs=True)
        first = _concat([mine, *others], [params, *other_params]).run(mode, return_logprobs=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(trial)
            last = _concat([*others, mine], [*other_params, params]).run(mode, return_logprobs=True)
        width = alone.token_ids.shape[1]
        assert width == 5
        for out, row in ((first, 0), (last, -1)):
            assert torch.equal(out.token_ids[row, :width], alone.token_ids[0])
            assert bool((out.token_ids[row, width:] == -1).all())
            assert out.num_emitted[row] == alone.num_emitted[0]
            assert out.logprobs is not None and alone.logprobs is not None
            assert _equal_nan(out.logprobs[row, :width], alone.logprobs[0])
        outcomes.add(tuple(alone.token_ids[0].tolist()))
    assert len(outcomes) > 1


def test_seeded_output_repeats_and_moves_with_the_position() -> None:
    batch = make_batch([3] * 8, vocab=200, seed=4, scale=1.0)
    base = batch.run("probs", seeds=list(range(8)), positions=torch.zeros(8, dtype=torch.int64))
    again = batch.run("probs", seeds=list(range(8)), positions=torch.zeros(8, dtype=torch.int64))
    assert torch.equal(base.token_ids, again.token_ids)
    moved = [
        batch.run("probs", seeds=list(range(8)), positions=torch.full((8,), p)).token_ids
        for p in range(1, 6)
    ]
    assert any(not torch.equal(base.token_ids, m) for m in moved)


# --------------------------------------------------------------------------------------
# Log-probabilities
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
def test_logprobs_are_log_processed_probs_at_emitted_tokens(mode: str) -> None:
    rng = random.Random(3)
    counts = [rng.randint(0, 4) for _ in range(60)]
    batch = make_batch(counts, vocab=300, seed=5, scale=2.0, agree=0.3)
    temperature = [rng.choice([0.0, 0.5, 1.0, 1.5]) for _ in counts]
    top_k = [rng.choice([0, 10]) for _ in counts]
    top_p = [rng.choice([1.0, 0.9]) for _ in counts]
    min_p = [rng.choice([0.0, 0.05]) for _ in counts]
    out = batch.run(
        mode,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        return_logprobs=True,
    )
    assert out.logprobs is not None and out.logprobs.dtype == torch.float32
    per_row = [i for i, n in enumerate(counts) for _ in range(n + 1)]
    sampled = torch.tensor([temperature[i] for i in per_row])
    probs = processed_probs(
        batch.logits,
        sampled,
        top_k=torch.tensor([top_k[i] for i in per_row]),
        top_p=torch.tensor([top_p[i] for i in per_row]),
        min_p=torch.tensor([min_p[i] for i in per_row]),
    )
    # Greedy requests report log-probabilities under softmax(logits).
    reference = torch.where(
        (sampled == 0).unsqueeze(-1),
        torch.log_softmax(batch.logits.double(), dim=-1),
        probs.double().log(),
    )
    padding = out.token_ids < 0
    assert bool(out.logprobs[padding].isnan().all())
    assert not bool(out.logprobs[~padding].isnan().any())
    for i, start in enumerate(batch.target_start):
        for j in range(int(out.num_emitted[i])):
            want = reference[start + j, out.token_ids[i, j]]
            assert math.isfinite(float(want)), (i, j)
            torch.testing.assert_close(out.logprobs[i, j].double(), want, atol=2e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------
# verify_padded
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_verify_padded_equals_verify_on_the_flattened_form(mode: str, layout: str) -> None:
    batch_size, k, vocab = 12, 3, 150
    batch = make_batch([k] * batch_size, vocab, seed=6, scale=1.5)
    padded = batch.logits.view(batch_size, k + 1, vocab)
    if layout == "strided":
        wide = torch.zeros(batch_size, k + 2, vocab)
        wide[:, : k + 1] = padded
        padded = wide[:, : k + 1]
    draft = {
        name: rows.view(batch_size, k, vocab) for name, rows in batch.draft_kwargs(mode).items()
    }
    params: dict[str, Any] = {
        "temperature": [0.0, 0.8, 1.2] * 4,
        "top_k": [0, 20, 0] * 4,
        "top_p": 0.95,
        "return_logprobs": True,
    }
    seeded = verify_padded(
        padded,
        batch.ids.view(batch_size, k),
        seeds=list(range(batch_size)),
        positions=[0] * batch_size,
        **draft,
        **params,
    )
    flat = batch.run(mode, seeds=list(range(batch_size)), **params)
    assert torch.equal(seeded.token_ids, flat.token_ids)
    assert torch.equal(seeded.num_emitted, flat.num_emitted)
    assert seeded.logprobs is not None and flat.logprobs is not None
    assert _equal_nan(seeded.logprobs, flat.logprobs)
    a = verify_padded(
        padded,
        batch.ids.view(batch_size, k),
        generator=torch.Generator().manual_seed(3),
        **draft,
        **params,
    )
    b = batch.run(mode, generator=torch.Generator().manual_seed(3), **params)
    assert torch.equal(a.token_ids, b.token_ids)


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------

V = 10


def _valid() -> dict[str, Any]:
    batch = make_batch([2, 0, 3], V, seed=8)
    return {
        "target_logits": batch.logits,
        "draft_token_ids": batch.ids,
        "num_draft_tokens": [2, 0, 3],
        "draft_probs": batch.draft_probs,
    }


def _nan_logits(inputs: dict[str, Any]) -> None:
    logits = inputs["target_logits"]
    assert isinstance(logits, torch.Tensor)
    logits[2, 4] = math.nan


BAD_INPUTS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("counts too many", {"num_draft_tokens": [2, 1, 3]}, ValueError, "num_draft_tokens"),
    ("counts too few", {"num_draft_tokens": [2, 0, 2]}, ValueError, "num_draft_tokens"),
    (
        "rows",
        {"target_logits": torch.zeros(7, V), "draft_probs": None},
        ValueError,
        "target_logits",
    ),
    ("draft_probs rows", {"draft_probs": torch.full((4, V), 0.1)}, ValueError, "draft_probs"),
    ("negative count", {"num_draft_tokens": [3, -1, 3]}, ValueError, "num_draft_tokens"),
    (
        "float counts",
        {"num_draft_tokens": torch.tensor([2.0, 0, 3])},
        TypeError,
        "num_draft_tokens",
    ),
    ("temperature < 0", {"temperature": [1.0, -0.5, 1.0]}, ValueError, "temperature"),
    ("temperature inf", {"temperature": math.inf}, ValueError, "temperature"),
    ("temperature nan", {"temperature": math.nan}, ValueError, "temperature"),
    ("temperature length", {"temperature": [1.0, 1.0]}, ValueError, "temperature"),
    ("top_p 0", {"top_p": 0.0}, ValueError, "top_p"),
    ("top_p > 1", {"top_p": [0.5, 1.5, 0.5]}, ValueError, "top_p"),
    ("top_p < 0", {"top_p": -0.1}, ValueError, "top_p"),
    ("top_k < 0", {"top_k": [0, -1, 0]}, ValueError, "top_k"),
    ("top_k fraction", {"top_k": 2.5}, ValueError, "top_k"),
    ("min_p < 0", {"min_p": -0.01}, ValueError, "min_p"),
    ("min_p > 1", {"min_p": [0.0, 1.5, 0.0]}, ValueError, "min_p"),
    ("seeds length", {"seeds": [1, 2]}, ValueError, "seeds"),
    ("seeds negative", {"seeds": [1, -5, 2]}, ValueError, "seeds"),
    ("both drafts", {"draft_logits": torch.zeros(5, V)}, ValueError, "draft_logits"),
    ("method", {"method": "no-such-rule"}, ValueError, "method"),
    ("logits type", {"target_logits": [[0.0] * V] * 8}, TypeError, "target_logits"),
    (
        "logits dtype",
        {"target_logits": torch.zeros(8, V, dtype=torch.int64)},
        TypeError,
        "target_logits",
    ),
    ("logits dim", {"target_logits": torch.zeros(8 * V)}, ValueError, "target_logits"),
    ("ids type", {"draft_token_ids": [1, 2, 3, 4, 5]}, TypeError, "draft_token_ids"),
    ("ids dtype", {"draft_token_ids": torch.zeros(5)}, TypeError, "draft_token_ids"),
    (
        "draft_probs dtype",
        {"draft_probs": torch.zeros(5, V, dtype=torch.int64)},
        TypeError,
        "draft_probs",
    ),
    (
        "id < 0, strict",
        {"draft_token_ids": torch.tensor([1, 2, -1, 4, 5]), "strict": True},
        ValueError,
        "draft_token_ids",
    ),
    (
        "id >= vocab, strict",
        {"draft_token_ids": torch.tensor([1, V, 3, 4, 5]), "strict": True},
        ValueError,
        "draft_token_ids",
    ),
    ("nan logits, strict", {"strict": True, "_nan": True}, ValueError, "target_logits"),
    (
        "nan draft_probs, strict",
        {"draft_probs": torch.full((5, V), math.nan), "strict": True},
        ValueError,
        "draft_probs",
    ),
    (
        "nan draft_logits, strict",
        {"draft_probs": None, "draft_logits": torch.full((5, V), math.nan), "strict": True},
        ValueError,
        "draft_logits",
    ),
    ("draft_probs 3-D", {"draft_probs": torch.full((1, 5, V), 0.1)}, ValueError, "draft_probs"),
    ("counts 2-D", {"num_draft_tokens": torch.tensor([[2, 0, 3]])}, ValueError, "num_draft_tokens"),
    ("seeds float", {"seeds": torch.tensor([1.0, 2.0, 3.0])}, TypeError, "seeds"),
    (
        "ids on meta",
        {"draft_token_ids": torch.zeros(5, dtype=torch.int64, device="meta")},
        ValueError,
        "draft_token_ids",
    ),
    (
        "draft_probs on meta",
        {"draft_probs": torch.zeros(5, V, device="meta")},
        ValueError,
        "draft_probs",
    ),
    (
        "logits on meta",
        {"target_logits": torch.zeros(8, V, device="meta")},
        ValueError,
        "draft_token_ids",
    ),
]


@pytest.mark.parametrize(
    ("changes", "error", "name"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_names_the_argument(
    changes: dict[str, Any], error: type[Exception], name: str
) -> None:
    inputs = {**_valid(), **changes}
    if inputs.pop("_nan", False):
        _nan_logits(inputs)
    with pytest.raises(error, match=name):
        verify(**inputs)


@pytest.mark.parametrize(
    "positions",
    [torch.tensor([1, 2]), [1, 2], torch.tensor([1.0, 2.0, 3.0])],
    ids=["shape", "list", "float"],
)
def test_bad_positions_name_the_argument(positions: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="positions"):
        verify(**_valid(), seeds=[1, 2, 3], positions=positions)


def test_the_same_inputs_run_without_strict() -> None:
    """Out-of-range ids are rejected where they stand; NaN logits are survived."""
    inputs = _valid()
    inputs["draft_token_ids"] = torch.tensor([1, 2, V, -1, 5])
    _nan_logits(inputs)
    out = verify(**inputs, temperature=[0.0, 1.0, 1.0], seeds=[1, 2, 3], positions=[0, 0, 0])
    assert out.num_emitted[2] == 1
    assert 0 <= int(out.token_ids[2, 0]) < V
    assert bool((out.token_ids[2, 1:] == -1).all())


@pytest.mark.parametrize("mode", ["probs", "logits"])
def test_verify_padded_validates_shapes(mode: str) -> None:
    logits = torch.zeros(2, 4, V)
    with pytest.raises(ValueError, match="target_logits"):
        verify_padded(torch.zeros(8, V), torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="draft_token_ids"):
        verify_padded(logits, torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=f"draft_{mode}"):
        verify_padded(
            logits, torch.zeros(2, 3, dtype=torch.int64), **{f"draft_{mode}": torch.zeros(2, 2, V)}
        )


# --------------------------------------------------------------------------------------
# Degenerate rows
# --------------------------------------------------------------------------------------


def _degenerate(kind: str, row: torch.Tensor) -> None:
    if kind == "-inf":
        row.fill_(-math.inf)
    else:
        row[3] = math.nan


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["-inf", "nan"])
def test_degenerate_rows_never_give_nan_or_out_of_vocab_ids(
    kind: str, temperature: float, mode: str
) -> None:
    """Without strict, all -inf or NaN rows anywhere leave every output well defined."""
    rng = random.Random(11)
    counts = [rng.randint(0, 4) for _ in range(40)]
    batch = make_batch(counts, vocab=V, seed=12, agree=0.5)
    for r in rng.sample(range(batch.logits.shape[0]), 25):
        _degenerate(kind, batch.logits[r])
    for seeds in (None, list(range(40))):
        out = batch.run(mode, temperature=temperature, seeds=seeds, return_logprobs=True)
        emitted = out.token_ids >= 0
        assert bool((out.token_ids[emitted] < V).all())
        assert torch.equal(out.num_emitted, emitted.sum(dim=1))
        assert out.logprobs is not None
        assert not bool(out.logprobs[emitted].isnan().any())


def test_degenerate_rows_do_not_affect_other_requests() -> None:
    batch = make_batch([3, 2, 4], vocab=V, seed=13)
    params: dict[str, Any] = {"temperature": [1.0, 0.0, 0.8], "seeds": [1, 2, 3]}
    clean = batch.run("probs", **params)
    batch.logits[4].fill_(-math.inf)
    batch.logits[6, 2] = math.nan
    dirty = batch.run("probs", **params)
    assert torch.equal(clean.token_ids[[0, 2]], dirty.token_ids[[0, 2]])


DOCUMENTED_CASES = [
    pytest.param("-inf", 0.0, 0),
    pytest.param("-inf", 0.0, 5),
    pytest.param("-inf", 1.0, 0),
    pytest.param("-inf", 1.0, 5),
    pytest.param("nan", 0.0, 3),
    pytest.param("nan", 0.0, 5),
    pytest.param("nan", 1.0, 3),
    pytest.param("nan", 1.0, 5),
]


@pytest.mark.parametrize(("kind", "temperature", "draft"), DOCUMENTED_CASES)
def test_degenerate_row_rejects_and_emits_token_0(
    kind: str, temperature: float, draft: int
) -> None:
    """The documented outcome (:mod:`specsample.probs`): reject every draft, emit token 0.

    One request with two drafts whose first row is degenerate (all -inf, or NaN at token
    3); the draft there is ``draft``.
    """
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    _degenerate(kind, logits[0])
    ids = torch.tensor([draft, 1])
    for seed in range(5):
        out = verify(logits, ids, [2], temperature=temperature, seeds=[seed], positions=[0])
        assert out.token_ids.tolist() == [[0, -1, -1]], out.token_ids


@pytest.mark.parametrize(
    "temperature",
    [
        pytest.param(0.0),
        pytest.param(1.0),
    ],
)
def test_nan_bonus_row_emits_token_0(temperature: float) -> None:
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
    logits[0, 4] = math.nan
    empty = torch.zeros(0, dtype=torch.int64)
    out = verify(logits, empty, [0], temperature=temperature, seeds=[0], positions=[0])
    assert out.token_ids.tolist() == [[0]]


# --------------------------------------------------------------------------------------
# k = 0
# --------------------------------------------------------------------------------------


def test_k0_greedy_is_the_argmax_of_the_bonus_row() -> None:
    batch = make_batch([0] * 50, vocab=300, seed=14)
    out = batch.run(temperature=0.0, return_logprobs=True)
    assert out.token_ids.shape == (50, 1)
    assert torch.equal(out.token_ids[:, 0], batch.logits.argmax(dim=-1))
    assert torch.equal(out.num_emitted, torch.ones(50, dtype=torch.int64))
    assert out.logprobs is not None
    want = torch.log_softmax(batch.logits, dim=-1).gather(1, out.token_ids)
    torch.testing.assert_close(out.logprobs, want)


def test_k0_sampled_follows_the_processed_distribution() -> None:
    """20_000 bonus-only requests on the same row (T = 0.8, top-k 6, top-p 0.95).

    Chi-square against ``processed_probs`` at level 1e-6 (false-failure rate 1e-6); a token
    outside the kept set fails deterministically.
    """
    from scipy.stats import chisquare

    gen = torch.Generator().manual_seed(15)
    row = torch.randn(1, 40, generator=gen) * 2
    n = 20_000
    params: dict[str, Any] = {"temperature": 0.8, "top_k": 6, "top_p": 0.95}
    out = verify(
        row.expand(n, 40), torch.zeros(0, dtype=torch.int64), [0] * n, generator=gen, **params
    )
    probs = processed_probs(
        row, torch.tensor([0.8]), top_k=torch.tensor([6]), top_p=torch.tensor([0.95])
    )[0].double()
    counts = torch.bincount(out.token_ids[:, 0], minlength=40).double()
    kept = probs > 0
    assert counts[~kept].sum() == 0
    assert 2 <= int(kept.sum()) <= 6
    result = chisquare(counts[kept].numpy(), (probs[kept] / probs.sum() * n).numpy())
    assert result.pvalue > 1e-6


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("probs"),
        pytest.param("logits"),
    ],
)
def test_k0_with_empty_draft_rows(mode: str) -> None:
    batch = make_batch([0] * 4, vocab=V, seed=16)
    out = batch.run(mode, temperature=1.0, seeds=[1, 2, 3, 4])
    assert torch.equal(out.token_ids, batch.run("none", seeds=[1, 2, 3, 4]).token_ids)


# --------------------------------------------------------------------------------------
# Half precision
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits(dtype: torch.dtype, mode: str) -> None:
    """Half logits give exactly what their float32 values give; greedy rows match the oracle."""
    rng = random.Random(17)
    counts = [rng.randint(0, 4) for _ in range(40)]
    batch = make_batch(counts, vocab=2500, seed=18, dtype=dtype, agree=0.5)
    params: dict[str, Any] = {
        "temperature": [0.0 if i % 3 == 0 else 0.9 for i in range(40)],
        "top_k": 50,
        "top_p": 0.9,
        "seeds": list(range(40)),
        "positions": [0] * 40,
        "return_logprobs": True,
    }
    half = batch.run(mode, **params)
    single = verify(batch.logits.float(), batch.ids, counts, **batch.draft_kwargs(mode), **params)
    assert torch.equal(half.token_ids, single.token_ids)
    assert half.logprobs is not None and single.logprobs is not None
    assert _equal_nan(half.logprobs, single.logprobs)
    oracle = greedy_oracle(batch.logits, batch.ids, counts)
    rows = _rows(half)
    assert all(rows[i] == oracle[i] for i in range(0, 40, 3))


@pytest.mark.parametrize(
    "dtype",
    [pytest.param(d) for d in (torch.float16, torch.bfloat16, torch.float64)],
)
def test_draft_probs_in_other_dtypes(dtype: torch.dtype) -> None:
    batch = make_batch([3, 1, 2], vocab=V, seed=19)
    out = batch.run(temperature=1.0, seeds=[1, 2, 3], draft_probs=batch.draft_probs.to(dtype))
    assert out.token_ids.shape == (3, 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_draft_logits_in_other_dtypes(dtype: torch.dtype) -> None:
    batch = make_batch([3, 1, 2], vocab=V, seed=19)
    logits = batch.draft_probs.log()
    a = batch.run(temperature=1.0, seeds=[1, 2, 3], draft_logits=logits.to(dtype))
    b = batch.run(temperature=1.0, seeds=[1, 2, 3], draft_logits=logits.to(dtype).float())
    assert torch.equal(a.token_ids, b.token_ids)


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "probs", "logits"])
def test_peak_memory_is_at_most_one_rows_by_vocab_buffer(mode: str) -> None:
    """An all-sampled (batch 16, k 4, vocab 32000) step allocates at most one float32
    ``[rows, vocab]`` buffer beyond its inputs (rows = 16 * 4 + 16 = 80, 10.24 MB).

    Method (:func:`specsample.bench.extra_peak_bytes`): the call runs under
    ``torch.profiler.profile(profile_memory=True)``, which records one event per CPU
    allocation (its size, positive) and per free (minus the size freed), with timestamps.
    Sorted by time, the running sum of these sizes is the memory held by allocations made
    during the call; its maximum is the peak extra memory, the output included. The inputs
    were allocated before the profiler started and do not count. A full softmax of the
    logits is measured the same way as a control: it must register at least one buffer, so
    the method does see allocations of that size.
    """
    batch_size, k, vocab = 16, 4, 32000
    batch = make_batch([k] * batch_size, vocab, seed=20, scale=1.0)
    unit = batch.logits.numel() * 4
    draft = batch.draft_kwargs(mode)

    def step() -> VerifyOutput:
        return verify(batch.logits, batch.ids, batch.counts, temperature=1.0, **draft)

    step()
    peak = extra_peak_bytes(step)
    control = extra_peak_bytes(lambda: torch.softmax(batch.logits, dim=-1))
    assert control >= unit
    assert peak <= unit, f"peak {peak / unit:.3f} buffers"


# --------------------------------------------------------------------------------------
# Annotations resolve at run time
# --------------------------------------------------------------------------------------


def _public_callables() -> list[Any]:
    """Every public function and class of ``specsample.__all__``, with the public methods
    (and ``__init__``) each class defines; a callable instance by its ``__call__``."""
    import inspect

    import specsample

    found: list[Any] = []
    for name in specsample.__all__:
        obj = getattr(specsample, name)
        if inspect.isclass(obj):
            found.append(obj)
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                member = getattr(member, "__func__", member)
                member = member.fget if isinstance(member, property) else member
                if inspect.isfunction(member):
                    found.append(member)
        elif inspect.isfunction(obj):
            found.append(obj)
        elif callable(obj):
            found.append(type(obj).__call__)
    return found


def test_every_public_annotation_resolves() -> None:
    """``typing.get_type_hints`` (and ``inspect.signature(eval_str=True)``) resolve every
    annotation of the public API: the aliases (``Ints``, ``Scalars``, ``Seeds``) and
    ``Unpack`` are importable where they are used."""
    import inspect
    import typing

    callables = _public_callables()
    assert verify in callables and verify_padded in callables
    for obj in callables:
        typing.get_type_hints(obj)
        if inspect.isfunction(obj):
            inspect.signature(obj, eval_str=True)
    hints = typing.get_type_hints(verify)
    assert "Unpack" in str(hints["options"]) and "Sequence" in str(hints["num_draft_tokens"])
