"""Statistical exactness of :func:`specsample.verify` on raw logits, through the harness.

Each case builds raw target logits ``L [k + 1, vocab, vocab]`` (``L[j, prev]`` is the logits
row of position ``j`` after token ``prev``) and draft tables ``p [k, vocab, vocab]``, and hands
the harness (:mod:`specsample.testing`) the family whose target is
``processed_probs(L, params)``: the distribution the contract of :func:`verify` preserves.
The verifier under test is an adapter with the harness's signature that ignores the target
probabilities and the bonus token it is given: it rebuilds each sequence's raw logits rows
from the contexts (row ``j`` conditions on the start token for ``j = 0`` and on draft
``j - 1`` otherwise; the bonus row is ``L[k, x_{k-1}]``), lays them out as :func:`verify`'s
flattened ragged batch and returns its ``token_ids``.

Every case simulates ``ROWS = 100_000`` sequences with ``k = 3`` drafts over a vocabulary of
8. The harness runs ``k + 1 = 4`` chi-square tests (one per output position, conditioned on
the previous emitted token) and two z-tests (acceptance of position 0, mean accepted count),
each at level ``ALPHA / (k + 3) = 1.67e-5`` (Bonferroni): whatever subset of them a case
asserts, a correct verifier fails it with probability at most ``ALPHA = 1e-4``. The power is
stated per case as the smallest total variation at output position 0 detected with
probability 99% (:meth:`ExactnessReport.detectable_tv`; filters that leave fewer tokens mean
fewer degrees of freedom and a smaller detectable TV); later positions see fewer rows and
pool up to 8 contexts, so their bound on the count-weighted mean TV is larger (see
``tests/test_exactness.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from specsample import verify
from specsample.probs import processed_probs
from specsample.testing import ExactnessReport, Family, exactness_report

K = 3
VOCAB = 8
ROWS = 100_000
ALPHA = 1e-4
START = 0

Params = dict[str, Any]


def _tables(seed: int, *, sparse_draft: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw target logits ``[k + 1, V, V]`` and draft probabilities ``[k, V, V]``.

    Both depend strongly on the position and the previous token; the draft logits are
    correlated with the target's. ``sparse_draft`` zeroes about a quarter of the draft
    entries (never a row's most likely token).
    """
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(K + 1, VOCAB, VOCAB, generator=gen, dtype=torch.float64) * 1.5
    noise = torch.randn(K, VOCAB, VOCAB, generator=gen, dtype=torch.float64)
    draft = torch.softmax(0.7 * logits[:K] + 0.8 * noise, dim=-1)
    if sparse_draft:
        drop = torch.rand(draft.shape, generator=gen, dtype=torch.float64) < 0.25
        top = torch.nn.functional.one_hot(draft.argmax(dim=-1), VOCAB).bool()
        draft = draft.masked_fill(drop & ~top, 0.0)
    draft = draft / draft.sum(dim=-1, keepdim=True)
    return logits.to(torch.float32), draft.to(torch.float32)


def _filters(params: Params, rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "top_k" in params:
        out["top_k"] = torch.full((rows,), int(params["top_k"]), dtype=torch.int64)
    for name in ("top_p", "min_p"):
        if name in params:
            out[name] = torch.full((rows,), params[name], dtype=torch.float32)
    return out


def _family(name: str, logits: torch.Tensor, draft: torch.Tensor, params: Params) -> Family:
    """The family whose target is the processed distribution of every logits row."""
    flat = logits.reshape(-1, VOCAB)
    rows = flat.shape[0]
    target = processed_probs(
        flat, torch.full((rows,), params["temperature"]), **_filters(params, rows)
    )
    return Family(name, target.view(K + 1, VOCAB, VOCAB), draft, start=START)


def _raw_rows(logits: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    """``[rows, k + 1, V]``: row ``j`` is ``L[j, context_j]`` with context the previous draft."""
    rows, k = draft_token_ids.shape
    start = torch.full((rows, 1), START, dtype=torch.int64, device=draft_token_ids.device)
    context = torch.cat([start, draft_token_ids], dim=1)
    return logits[torch.arange(k + 1).expand(rows, k + 1), context]


def _draft_kwargs(mode: str, draft_probs: torch.Tensor) -> dict[str, Any]:
    if mode == "probs":
        return {"draft_probs": draft_probs}
    if mode == "logits":
        return {"draft_logits": draft_probs.log()}
    return {}


def _pad(token_ids: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(token_ids, (0, width - token_ids.shape[1]), value=-1)


Adapter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def logits_verifier(
    logits: torch.Tensor, params: Params, draft_mode: str = "probs", *, seeded: bool = False
) -> Adapter:
    """``verify`` behind the harness's signature, on raw logits rebuilt from the contexts.

    ``draft_mode``: ``"probs"`` passes the draft rows as ``draft_probs``, ``"logits"`` passes
    their log as ``draft_logits``, ``"none"`` passes neither (one-hot drafts). ``seeded``
    gives every request its own seed (never reused across calls) and a position, so the
    counter-based random stream decides instead of the generator.
    """
    used = [0]

    def verifier(
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        del target_probs, bonus_token_ids
        rows, k = draft_token_ids.shape
        seeding: dict[str, Any] = {}
        if seeded:
            seeds = torch.arange(used[0], used[0] + rows, dtype=torch.int64) * 7919 + 3
            seeding = {"seeds": seeds, "positions": seeds % 97}
            used[0] += rows
        out = verify(
            _raw_rows(logits, draft_token_ids).reshape(-1, VOCAB),
            draft_token_ids.reshape(-1),
            [k] * rows,
            **_draft_kwargs(draft_mode, draft_probs.reshape(-1, VOCAB)),
            **params,
            **seeding,
        )
        return out.token_ids

    return verifier


def ragged_verifier(logits: torch.Tensor, params: Params, seed: int) -> Adapter:
    """Each request keeps a uniformly random prefix of ``n_i`` in ``0..k`` of its drafts.

    A request cut to ``n_i`` drafts has the target rows of positions ``0..n_i - 1`` and, as
    its bonus row, the row of position ``n_i`` after draft ``n_i - 1``: exactly the first
    ``n_i + 1`` rows of the full request. The output is padded back to ``k + 1`` columns.
    """
    gen = torch.Generator().manual_seed(seed)

    def verifier(
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        del target_probs, bonus_token_ids
        rows, k = draft_token_ids.shape
        counts = torch.randint(0, k + 1, (rows,), generator=gen)
        cols = torch.arange(k + 1)
        in_target = cols <= counts.unsqueeze(-1)
        in_draft = cols[:k] < counts.unsqueeze(-1)
        out = verify(
            _raw_rows(logits, draft_token_ids)[in_target],
            draft_token_ids[in_draft],
            counts.tolist(),
            draft_probs=draft_probs[in_draft],
            **params,
        )
        assert torch.equal(out.num_emitted, (out.token_ids >= 0).sum(dim=1))
        assert bool((out.num_emitted <= counts + 1).all())
        return _pad(out.token_ids, k + 1)

    return verifier


def mixed_verifier(logits: torch.Tensor, params: Params, checked: list[int]) -> Adapter:
    """Doubles the batch with a greedy copy after every request; returns the sampled rows.

    The greedy copies are checked token for token against the argmax oracle (accept while
    the draft is the argmax of its raw logits row, emit the argmax at the first mismatch,
    the bonus is the argmax of the bonus row); ``checked`` collects how many were checked.
    """

    def verifier(
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        del target_probs, bonus_token_ids
        rows, k = draft_token_ids.shape
        raw = _raw_rows(logits, draft_token_ids)
        temperature = [params["temperature"], 0.0] * rows
        out = verify(
            torch.stack([raw, raw], dim=1).reshape(-1, VOCAB),
            torch.stack([draft_token_ids, draft_token_ids], dim=1).reshape(-1),
            [k] * (2 * rows),
            draft_probs=torch.stack([draft_probs, draft_probs], dim=1).reshape(-1, VOCAB),
            **dict(params, temperature=temperature),
        )
        argmax = raw.argmax(dim=-1)
        matches = draft_token_ids == argmax[:, :k]
        accepted = matches.to(torch.int64).cumprod(dim=1).sum(dim=1)
        expected = torch.where(torch.arange(k + 1) <= accepted.unsqueeze(-1), argmax, -1)
        assert torch.equal(out.token_ids[1::2], expected)
        assert torch.equal(out.num_emitted[1::2], accepted + 1)
        checked.append(rows)
        return out.token_ids[0::2]

    return verifier


def _assert_positions(report: ExactnessReport) -> None:
    """Every per-position chi-square test passes at its Bonferroni level; no zero-q token."""
    level = report.p_value_threshold(ALPHA)
    assert report.malformed_rows == 0, str(report)
    for result in report.positions:
        assert result.impossible == 0, str(report)
        assert result.p_value >= level, str(report)


def _case(seed: int, params: Params, draft_mode: str = "probs") -> ExactnessReport:
    logits, draft = _tables(seed, sparse_draft=draft_mode == "logits")
    family = _family(f"logits-{draft_mode}", logits, draft, params)
    return exactness_report(
        logits_verifier(logits, params, draft_mode), family, rows=ROWS, seed=seed
    )


def test_temperature_0_7() -> None:
    """False-failure rate <= 1e-4; TV >= 0.0123 at position 0 detected with prob. >= 99%."""
    report = _case(1, {"temperature": 0.7})
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0123


def test_temperature_1_3() -> None:
    """False-failure rate <= 1e-4; TV >= 0.0123 at position 0 detected with prob. >= 99%."""
    report = _case(2, {"temperature": 1.3})
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0123


def test_top_k() -> None:
    """top-k 3 at T = 0.9: every emitted token must lie in the top 3 of its row.

    False-failure rate <= 1e-4; TV >= 0.0111 at position 0 detected with prob. >= 99% (df 2);
    a single token outside the top-k fails deterministically (zero target probability).
    """
    report = _case(3, {"temperature": 0.9, "top_k": 3})
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0111


def test_top_p() -> None:
    """top-p 0.7 at T = 1.0. False-failure rate <= 1e-4; TV >= 0.0106 at position 0
    detected with prob. >= 99% (the nucleus after the start token has 2 tokens: df 1); a
    token outside the nucleus fails deterministically."""
    report = _case(4, {"temperature": 1.0, "top_p": 0.7})
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0106


def test_min_p() -> None:
    """min-p 0.15 at T = 1.1. False-failure rate <= 1e-4; TV >= 0.0115 at position 0
    detected with prob. >= 99%; a token below the min-p threshold fails deterministically."""
    report = _case(5, {"temperature": 1.1, "min_p": 0.15})
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0115


def _one_hot_acceptance(family: Family) -> tuple[float, float, float]:
    """Exact acceptance of position 0, mean and variance of the accepted count, one-hot drafts.

    Without draft probabilities, draft ``x ~ p`` is accepted with probability ``q(x)``, so the
    accepted prefix follows the Markov chain with kernel ``p * q`` (elementwise) instead of
    the harness's ``min(p, q)``.
    """
    q = family.reference()
    p = family.draft.to(torch.float64)
    p = p / p.sum(dim=-1, keepdim=True)
    mass = torch.zeros(VOCAB, dtype=torch.float64)
    mass[family.start] = 1.0
    prefix = []
    for j in range(family.k):
        mass = mass @ (p[j] * q[j])
        prefix.append(float(mass.sum()))
    mean = sum(prefix)
    second = sum((2 * j + 1) * pj for j, pj in enumerate(prefix))
    return prefix[0], mean, second - mean * mean


def test_one_hot_drafts() -> None:
    """No draft probabilities: drafts are still sampled from ``p``, but ``verify`` sees none.

    The chi-square tests are those of the harness; its acceptance z-scores assume
    ``min(p, q)`` acceptance, so they are recomputed here for the one-hot rule (accept ``x``
    with probability ``q(x)``), at the same Bonferroni level. False-failure rate <= 1e-4;
    TV >= 0.0117 at position 0 detected with prob. >= 99%.
    """
    params = {"temperature": 1.0, "top_p": 0.9}
    logits, draft = _tables(6)
    family = _family("logits-one-hot", logits, draft, params)
    report = exactness_report(logits_verifier(logits, params, "none"), family, rows=ROWS, seed=6)
    _assert_positions(report)
    rate, mean, variance = _one_hot_acceptance(family)
    z_max = report.z_threshold(ALPHA)
    z_rate = (report.acceptance_rate - rate) / math.sqrt(rate * (1 - rate) / ROWS)
    z_mean = (report.mean_accepted - mean) / math.sqrt(variance / ROWS)
    assert abs(z_rate) < z_max and abs(z_mean) < z_max, (z_rate, z_mean, str(report))
    assert report.detectable_tv(0, ALPHA) <= 0.0117


def test_draft_logits() -> None:
    """Draft logits (log of the draft tables, ``-inf`` where a quarter of them are zero).

    T = 0.8 and min-p 0.05. False-failure rate <= 1e-4; TV >= 0.0119 at position 0 detected
    with prob. >= 99%.
    """
    report = _case(7, {"temperature": 0.8, "min_p": 0.05}, draft_mode="logits")
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0119


def test_ragged_counts_with_zeros() -> None:
    """Each request verifies a random prefix of 0..k of its drafts (top-k 6, T = 1.0).

    Only the per-position chi-square tests are asserted: the law of the token at output
    position ``n`` given the previous emitted token is still ``q_n(. | t)`` whatever the
    number of drafts kept (it is chosen independently of the tokens), but the harness's
    acceptance z-scores compare with the exact values for ``k`` drafts per request, and a
    request cut to ``n_i`` drafts can accept at most ``n_i`` (none at all when ``n_i = 0``),
    so the realised acceptance rate and mean are lower by design. False-failure rate
    <= 4 * 1e-4 / 6 < 1e-4; TV >= 0.0119 at position 0 (all rows emit it) detected with
    prob. >= 99%.
    """
    params = {"temperature": 1.0, "top_k": 6}
    logits, draft = _tables(8)
    family = _family("logits-ragged", logits, draft, params)
    report = exactness_report(ragged_verifier(logits, params, seed=8), family, rows=ROWS, seed=8)
    _assert_positions(report)
    assert report.positions[0].emitted == ROWS
    assert report.mean_accepted < family.expected_accepted()[0]
    assert report.detectable_tv(0, ALPHA) <= 0.0119


def test_mixed_greedy_and_sampled_rows() -> None:
    """Every request has a greedy twin in the same batch (T = 0.9, top-k 5 for all).

    The sampled rows go through the full report (false-failure rate <= 1e-4; TV >= 0.0117 at
    position 0 detected with prob. >= 99%); the greedy rows match the argmax oracle token for
    token in every call.
    """
    params = {"temperature": 0.9, "top_k": 5}
    logits, draft = _tables(9)
    family = _family("logits-mixed", logits, draft, params)
    checked: list[int] = []
    report = exactness_report(mixed_verifier(logits, params, checked), family, rows=ROWS, seed=9)
    assert report.passed(ALPHA), str(report)
    assert sum(checked) == ROWS
    assert report.detectable_tv(0, ALPHA) <= 0.0117


def test_all_filters_seeded() -> None:
    """T = 0.9 with top-k 5, top-p 0.9 and min-p 0.1 together; every request seeded.

    The counter-based per-request stream replaces the generator: a defect in it (numbers
    reused across the accept tests and the final draw, or correlated between positions)
    would bias the emitted law. False-failure rate <= 1e-4; TV >= 0.0115 at position 0
    detected with prob. >= 99%.
    """
    params = {"temperature": 0.9, "top_k": 5, "top_p": 0.9, "min_p": 0.1}
    logits, draft = _tables(10)
    family = _family("logits-seeded", logits, draft, params)
    verifier = logits_verifier(logits, params, seeded=True)
    report = exactness_report(verifier, family, rows=ROWS, seed=10)
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0115


def test_half_precision_logits() -> None:
    """float16 logits; the family's target is processed from the same float16 values.

    T = 1.2 and top-p 0.95. False-failure rate <= 1e-4; TV >= 0.0123 at position 0 detected
    with prob. >= 99%.
    """
    params = {"temperature": 1.2, "top_p": 0.95}
    logits, draft = _tables(11)
    half = logits.to(torch.float16)
    family = _family("logits-float16", half, draft, params)
    report = exactness_report(logits_verifier(half, params), family, rows=ROWS, seed=11)
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0123
