"""The processed target distribution: :func:`processed_probs` and :func:`row_norms`.

Every filter is checked against a float64 reference written from the definition in
:mod:`specsample.probs` (temperature, then top-k, then top-p, then min-p; ties at each
threshold kept), on hand-built rows where the answer is known and on random rows.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import specsample.probs as probs_module
from specsample.probs import processed_probs, row_norms


def _reference(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """The processed distribution of one ``[vocab]`` row, straight from the definition."""
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[0]).to(torch.float64)
    z = logits.to(torch.float64) / temperature
    keep = torch.ones_like(z, dtype=torch.bool)
    if top_k > 0:
        kth = z.sort(descending=True).values[min(top_k, z.shape[0]) - 1]
        keep &= z >= kth
    if top_p < 1.0:
        masked = z.masked_fill(~keep, -math.inf)
        ordered = masked.sort(descending=True).values
        cum = torch.softmax(ordered, dim=0).cumsum(dim=0)
        last = min(int((cum < top_p).sum()), z.shape[0] - 1)
        keep &= z >= ordered[last]
    if min_p > 0.0:
        keep &= z >= z.max() + math.log(min_p)
    return torch.softmax(z.masked_fill(~keep, -math.inf), dim=0)


def _one(logits: list[float], **params: float) -> torch.Tensor:
    """:func:`processed_probs` of a single row, with scalar parameters."""
    row = torch.tensor([logits], dtype=torch.float32)
    temperature = torch.tensor([params.pop("temperature", 1.0)])
    tensors: dict[str, Any] = {}
    if "top_k" in params:
        tensors["top_k"] = torch.tensor([int(params["top_k"])])
    for name in ("top_p", "min_p"):
        if name in params:
            tensors[name] = torch.tensor([params[name]], dtype=torch.float32)
    return processed_probs(row, temperature, **tensors)[0]


def _support(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs > 0).flatten().tolist()


def test_temperature_scales_logits() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    temperature = torch.tensor([0.25, 0.5, 0.7, 1.0, 1.3, 4.0])
    got = processed_probs(logits, temperature)
    want = torch.softmax(logits.double() / temperature.double().unsqueeze(-1), dim=-1)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


def test_top_k_keeps_ties_at_the_threshold() -> None:
    logits = [3.0, 2.0, 0.0, 2.0, 1.0, 2.0]
    assert _support(_one(logits, top_k=2)) == [0, 1, 3, 5]
    assert _support(_one(logits, top_k=1)) == [0]
    assert _support(_one(logits, top_k=5)) == [0, 1, 3, 4, 5]
    assert _support(_one(logits, top_k=6)) == list(range(6))
    assert _support(_one(logits, top_k=100)) == list(range(6))
    kept = _one(logits, top_k=2)
    z = torch.tensor([3.0, 2.0, 2.0, 2.0]).exp()
    torch.testing.assert_close(kept[[0, 1, 3, 5]], z / z.sum())


def test_top_p_keeps_the_smallest_prefix_reaching_top_p() -> None:
    probs = torch.tensor([0.1, 0.4, 0.05, 0.25, 0.2])
    logits = probs.log().tolist()
    # Sorted: 0.4, 0.25, 0.2, 0.1, 0.05; cumulative 0.4, 0.65, 0.85, 0.95, 1.0.
    assert _support(_one(logits, top_p=0.3)) == [1]
    assert _support(_one(logits, top_p=0.5)) == [1, 3]
    assert _support(_one(logits, top_p=0.7)) == [1, 3, 4]
    assert _support(_one(logits, top_p=0.9)) == [0, 1, 3, 4]
    assert _support(_one(logits, top_p=1.0)) == [0, 1, 2, 3, 4]
    assert _support(_one(logits, top_p=1e-6)) == [1]
    kept = _one(logits, top_p=0.5)
    torch.testing.assert_close(kept[[1, 3]], torch.tensor([0.4, 0.25]) / 0.65)


def test_top_p_keeps_ties_with_the_last_token_of_the_prefix() -> None:
    # Probabilities 0.498, 0.183, 0.183, 0.067, 0.067: the prefix reaching 0.6 ends at the
    # first 1.0, and its tie is kept too (the kept mass 0.865 exceeds the smallest prefix).
    logits = [2.0, 1.0, 0.0, 1.0, 0.0]
    assert _support(_one(logits, top_p=0.6)) == [0, 1, 3]
    assert _support(_one(logits, top_p=0.45)) == [0]
    assert _support(_one(logits, top_p=0.9)) == [0, 1, 2, 3, 4]


def test_min_p_is_relative_to_the_largest_probability() -> None:
    half = float(torch.log(torch.tensor(0.5)))
    quarter = float(torch.log(torch.tensor(0.25)))
    logits = [quarter, 0.0, half, -5.0]
    assert _support(_one(logits, min_p=0.4)) == [1, 2]
    assert _support(_one(logits, min_p=0.2)) == [0, 1, 2]
    assert _support(_one(logits, min_p=1.0)) == [1]
    # Ties at the threshold are kept: p = 0.5 * p_max exactly.
    assert _support(_one(logits, min_p=0.5)) == [1, 2]
    # The threshold applies to the tempered distribution: at T = 2 the ratios are square
    # roots (0.5, 0.707, 0.082), so min_p = 0.4 also keeps token 0.
    assert _support(_one(logits, temperature=2.0, min_p=0.4)) == [0, 1, 2]


def test_filter_order_top_k_then_top_p() -> None:
    """top-p acts on the distribution renormalised after top-k.

    Probabilities 0.3, 0.25, 0.2, 0.15, 0.1 with top-k 2 and top-p 0.5: after top-k the
    renormalised 0.545 alone reaches 0.5, so only token 0 is kept; top-p first would keep
    {0, 1} (cumulative 0.3, 0.55) and top-k would leave both.
    """
    logits = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1]).log().tolist()
    assert _support(_one(logits, top_k=2, top_p=0.5)) == [0]
    assert _support(_one(logits, top_p=0.5)) == [0, 1]


def test_filter_order_top_p_then_min_p() -> None:
    """min-p acts after top-p, which reads the distribution min-p has not yet cut.

    Probabilities 0.4, 0.3, 0.2, 0.1, top-p 0.75, min-p 0.3 (threshold 0.12): top-p on the
    full distribution keeps {0, 1, 2} (cumulative 0.4, 0.7, 0.9), and min-p cuts nothing
    more. Min-p first would drop token 3 and top-p on the renormalised 0.444, 0.333, 0.222
    would then stop at {0, 1}.
    """
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    assert _support(_one(logits, top_p=0.75, min_p=0.3)) == [0, 1, 2]
    assert _support(_one(logits, min_p=0.3)) == [0, 1, 2]


def test_filter_order_temperature_first() -> None:
    """Temperature applies before top-p: at T = 0.5 the same top-p keeps fewer tokens."""
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    assert _support(_one(logits, top_p=0.65)) == [0, 1]
    # At T = 0.5: probabilities proportional to 0.16, 0.09, 0.04, 0.01 -> 0.533 first.
    assert _support(_one(logits, temperature=0.5, top_p=0.5)) == [0]


def test_random_rows_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    rows, vocab = 64, 40
    logits = torch.randn(rows, vocab, generator=gen) * 2
    temperature = torch.rand(rows, generator=gen) * 1.5 + 0.3
    temperature[::7] = 0.0
    top_k = torch.randint(0, 12, (rows,), generator=gen)
    top_p = torch.where(torch.rand(rows, generator=gen) < 0.5, 1.0, torch.rand(rows, generator=gen))
    top_p = top_p.clamp(min=0.05)
    min_p = torch.where(torch.rand(rows, generator=gen) < 0.5, 0.0, 0.2 * torch.rand(rows))
    got = processed_probs(logits, temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    for r in range(rows):
        want = _reference(
            logits[r], float(temperature[r]), int(top_k[r]), float(top_p[r]), float(min_p[r])
        )
        torch.testing.assert_close(got[r].double(), want, atol=1e-6, rtol=1e-5, msg=f"row {r}")


def test_greedy_rows_are_one_hot_whatever_the_filters() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [5.0, -1.0, 3.0, 0.0]])
    got = processed_probs(
        logits,
        torch.zeros(2),
        top_k=torch.tensor([1, 2]),
        top_p=torch.tensor([0.1, 0.5]),
        min_p=torch.tensor([0.9, 0.5]),
    )
    # Ties: the first largest logit.
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def _norms_inputs(rows: int, vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    top_k = torch.randint(0, 9, (rows,), generator=gen)
    return {
        "logits": torch.randn(rows, vocab, generator=gen) * 2,
        "inv_temperature": torch.rand(rows, generator=gen) + 0.5,
        "top_k": top_k,
        "top_p": torch.rand(rows, generator=gen).clamp(min=0.1),
        "min_p": torch.rand(rows, generator=gen) * 0.3,
    }


@pytest.mark.parametrize("chunk_elements", [1, 37, 100])
def test_chunking_gives_identical_results(
    monkeypatch: pytest.MonkeyPatch, chunk_elements: int
) -> None:
    """Row chunks of 1, 1 and 3 rows (vocab 33) give bit-identical statistics and probs."""
    inputs = _norms_inputs(rows=50, vocab=33)
    logits, inv_t = inputs["logits"], inputs["inv_temperature"]
    filters: dict[str, Any] = {
        "top_k": inputs["top_k"],
        "top_p": inputs["top_p"],
        "min_p": inputs["min_p"],
    }
    max_top_k = int(inputs["top_k"].max())
    whole = row_norms(logits, inv_t, max_top_k=max_top_k, **filters)
    whole_probs = processed_probs(logits, 1.0 / inv_t, **filters)
    monkeypatch.setattr(probs_module, "_CPU_CHUNK_ELEMENTS", chunk_elements)
    assert probs_module._chunk_rows(33, torch.device("cpu")) == max(1, chunk_elements // 33)
    chunked = row_norms(logits, inv_t, max_top_k=max_top_k, **filters)
    for name, a, b in zip(whole._fields, whole, chunked, strict=True):
        assert (a is None and b is None) or torch.equal(a, b), name
    assert torch.equal(whole_probs, processed_probs(logits, 1.0 / inv_t, **filters))


def test_need_norm_false_keeps_the_argmax() -> None:
    inputs = _norms_inputs(rows=20, vocab=30)
    full = row_norms(inputs["logits"], inputs["inv_temperature"])
    lean = row_norms(inputs["logits"], inputs["inv_temperature"], need_norm=False)
    assert torch.equal(full.argmax, lean.argmax)
    assert torch.equal(full.argmax, inputs["logits"].argmax(dim=-1))
    assert bool(lean.log_norm.isnan().all())


def test_log_norm_and_cutoff_describe_the_distribution() -> None:
    inputs = _norms_inputs(rows=30, vocab=25)
    logits, inv_t = inputs["logits"], inputs["inv_temperature"]
    filters: dict[str, Any] = {
        "top_k": inputs["top_k"],
        "top_p": inputs["top_p"],
        "min_p": inputs["min_p"],
    }
    norms = row_norms(logits, inv_t, max_top_k=int(inputs["top_k"].max()), **filters)
    assert torch.equal(norms.shift, logits.max(dim=-1).values)
    z = (logits - norms.shift.unsqueeze(-1)) * inv_t.unsqueeze(-1)
    kept = z >= norms.cutoff.unsqueeze(-1)
    log_norm = torch.logsumexp(z.masked_fill(~kept, -math.inf), dim=-1)
    torch.testing.assert_close(norms.log_norm, log_norm, atol=1e-5, rtol=1e-6)
    probs = processed_probs(logits, 1.0 / inv_t, **filters)
    assert torch.equal(probs > 0, kept)
    torch.testing.assert_close(probs.sum(dim=-1), torch.ones(30), atol=1e-5, rtol=0)


def test_all_minus_inf_row_has_no_distribution() -> None:
    logits = torch.tensor([[-math.inf] * 4, [0.0, -math.inf, 1.0, -math.inf]])
    norms = row_norms(
        logits,
        torch.ones(2),
        top_k=torch.tensor([2, 2]),
        max_top_k=2,
        top_p=torch.tensor([0.9, 0.9]),
        min_p=torch.tensor([0.1, 0.1]),
    )
    assert norms.log_norm[0] == math.inf
    assert math.isfinite(float(norms.log_norm[1]))
    options: list[dict[str, Any]] = [
        {},
        {"top_k": torch.tensor([2, 2]), "top_p": torch.tensor([0.5, 0.5])},
    ]
    for kwargs in options:
        probs = processed_probs(logits, torch.tensor([1.0, 0.7]), **kwargs)
        assert not bool(probs.isnan().any())
        assert probs[0].tolist() == [0.0] * 4
        # A row with some -inf logits is an ordinary row over its finite tokens.
        assert probs[1, 1] == 0 and probs[1, 3] == 0
        torch.testing.assert_close(float(probs[1].sum()), 1.0)


def test_nan_row_has_infinite_log_norm() -> None:
    logits = torch.tensor([[0.0, math.nan, 1.0]])
    assert row_norms(logits, torch.ones(1)).log_norm[0] == math.inf


def test_nan_row_has_probability_zero_everywhere() -> None:
    probs = processed_probs(torch.tensor([[0.0, math.nan, 1.0]]), torch.ones(1))
    assert probs.tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_match_float32(dtype: torch.dtype) -> None:
    inputs = _norms_inputs(rows=12, vocab=40)
    logits = inputs["logits"].to(dtype)
    filters: dict[str, Any] = {
        "top_k": inputs["top_k"],
        "top_p": inputs["top_p"],
        "min_p": inputs["min_p"],
    }
    temperature = 1.0 / inputs["inv_temperature"]
    assert torch.equal(
        processed_probs(logits, temperature, **filters),
        processed_probs(logits.float(), temperature, **filters),
    )
