"""Keyed Gumbel-max verification (``method="gumbel"``): exact, and the same tokens whatever
the drafts.

* The sampler: over many seeds (and positions), the token a request emits at a row follows
  the row's processed distribution (temperature, top-k, top-p, min-p): one chi-square test
  per processing, each failing a correct sampler with probability ``ALPHA`` = 1e-4 and
  detecting a total-variation deviation of at most ``MAX_DETECTABLE_TV`` with probability
  0.99 (the value is asserted).
* Invariance: whatever the drafts, the emitted tokens are a prefix of the tokens the request
  emits at each position with no draft at all, on every backend.
* Acceptance: with drafts drawn by the same noise, a draft is accepted with probability
  ``sum_x 1 / sum_y max(p(y) / p(x), q(y) / q(x))``, at least ``(1 - TV) / (1 + TV)``; the
  simulated tokens per step of ``specsample compare`` match it.
"""

from __future__ import annotations

import pytest
import torch

from specsample import RejectionSampler, backends, verify
from specsample.probs import processed_probs
from specsample.testing import FAMILIES, make_family
from specsample.testing.chisquare import chi2_sf, detectable_tv, pooled_cells
from specsample.testing.compare import compare_rules
from specsample.testing.exact_values import gumbel_agreement

ALPHA = 1e-4
MAX_DETECTABLE_TV = 0.04
SAMPLES = 40_000
VOCAB = 24


def _backends() -> list[str]:
    names = ["torch"]
    for name in ("cpu", "triton"):
        try:
            backends.resolve(name, torch.zeros(1))
        except ValueError:
            continue
        names.append(name)
    return names


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    observed = torch.bincount(tokens, minlength=probs.shape[0])
    assert int(observed[probs == 0].sum()) == 0, "a token of probability 0 was emitted"
    cells, expected = pooled_cells(observed, probs.double() * tokens.shape[0])
    statistic = sum((o - e) ** 2 / e for o, e in zip(cells, expected, strict=True))
    return chi2_sf(statistic, len(cells) - 1), len(cells) - 1


PROCESSINGS = {
    "temperature 1": {"temperature": 1.0},
    "T 0.8, top-k 10": {"temperature": 0.8, "top_k": 10},
    "T 0.8, top-p 0.9, top-k 50": {"temperature": 0.8, "top_p": 0.9, "top_k": 50},
    "T 1.3, min-p 0.05": {"temperature": 1.3, "min_p": 0.05},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", PROCESSINGS)
def test_the_keyed_token_follows_the_processed_distribution(name: str) -> None:
    options = PROCESSINGS[name]
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) * 1.5
    rows = logits.expand(SAMPLES, VOCAB)
    seeds = torch.arange(SAMPLES) * 7919 % 1_000_003
    positions = torch.arange(SAMPLES) % 97
    empty = torch.zeros(0, dtype=torch.int64)
    out = verify(
        rows, empty, [0] * SAMPLES, method="gumbel", seeds=seeds, positions=positions, **options
    )
    temperature = torch.tensor([options["temperature"]])
    filters = {key: torch.tensor([value]) for key, value in options.items() if key != "temperature"}
    probs = processed_probs(logits[None], temperature, **filters)[0]
    p_value, df = _chi_square(out.token_ids[:, 0], probs)
    assert detectable_tv(SAMPLES, df, ALPHA) < MAX_DETECTABLE_TV
    assert p_value > ALPHA, f"{name}: p = {p_value:.2e}"


@pytest.mark.slow
def test_verified_drafts_keep_the_first_token_exact() -> None:
    """Whatever the drafts (here always the most likely token, then a fixed one), the first
    emitted token follows the target row."""
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(3, VOCAB, generator=generator)
    drafts = torch.tensor([int(logits[0].argmax()), 4]).repeat(SAMPLES)
    rows = logits.repeat(SAMPLES, 1)
    out = verify(
        rows,
        drafts,
        [2] * SAMPLES,
        method="gumbel",
        seeds=torch.arange(SAMPLES),
        positions=[0] * SAMPLES,
        temperature=1.0,
    )
    p_value, _ = _chi_square(out.token_ids[:, 0], torch.softmax(logits[0].double(), -1))
    assert p_value > ALPHA


@pytest.mark.parametrize("backend", _backends())
def test_the_emitted_tokens_do_not_depend_on_the_drafts(backend: str) -> None:
    generator = torch.Generator().manual_seed(2)
    batch, k, vocab = 6, 5, 300
    logits = torch.randn(batch, k + 1, vocab, generator=generator) * 2
    options = {
        "temperature": [1.0, 0.7, 0.0, 1.0, 1.2, 0.9],
        "top_k": [0, 0, 0, 20, 0, 0],
        "top_p": [1.0, 0.9, 1.0, 1.0, 1.0, 0.8],
        "seeds": [1, 2, 3, 4, 5, 6],
    }
    starts = torch.tensor([0, 5, 9, 100, 3, 40])
    alone = torch.empty(batch, k + 1, dtype=torch.int64)
    empty = torch.zeros(0, dtype=torch.int64)
    for j in range(k + 1):
        out = verify(
            logits[:, j],
            empty,
            [0] * batch,
            method="gumbel",
            backend=backend,
            positions=starts + j,
            **options,
        )
        alone[:, j] = out.token_ids[:, 0]
    for trial in range(20):
        counts = torch.randint(0, k + 1, (batch,), generator=generator)
        drafts = torch.where(
            torch.rand(batch, k, generator=generator) < 0.8,
            alone[:, :k],
            torch.randint(0, vocab, (batch, k), generator=generator),
        )
        cols = torch.arange(k)
        flat_drafts = drafts[cols < counts[:, None]]
        rows = torch.cat([logits[b, : int(counts[b]) + 1] for b in range(batch)])
        out = verify(
            rows,
            flat_drafts,
            counts.tolist(),
            method="gumbel",
            backend=backend,
            positions=starts,
            **options,
        )
        for b in range(batch):
            emitted = int(out.num_emitted[b])
            assert out.token_ids[b, :emitted].tolist() == alone[b, :emitted].tolist(), trial
            if emitted <= int(counts[b]):
                assert int(drafts[b, emitted - 1]) != int(alone[b, emitted - 1])


def test_every_backend_gives_the_same_tokens() -> None:
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(9, 1000, generator=generator)
    drafts = logits[:6].argmax(dim=-1)
    options = {"temperature": 1.0, "seeds": [8, 9, 10], "positions": [3, 4, 5]}
    outs = [
        verify(logits, drafts, [3, 2, 1], method="gumbel", backend=name, **options).token_ids
        for name in _backends()
    ]
    assert all(torch.equal(out, outs[0]) for out in outs)


def test_unseeded_requests_draw_their_keys_from_the_generator() -> None:
    logits = torch.zeros(4, 5000)
    empty = torch.zeros(0, dtype=torch.int64)

    def draw(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return (
            verify(logits, empty, [0] * 4, method="gumbel", generator=generator)
            .token_ids[:, 0]
            .tolist()
        )

    assert draw(1) == draw(1) and draw(1) != draw(2)


def test_the_rule_on_probabilities_keeps_the_keyed_tokens() -> None:
    generator = torch.Generator().manual_seed(6)
    batch, k, vocab = 5, 3, 50
    logits = torch.randn(batch, k, vocab, generator=generator)
    probs = torch.softmax(logits, dim=-1)
    sampler = RejectionSampler(method="gumbel")
    seeds = list(range(batch))
    alone = verify(
        logits.reshape(-1, vocab),
        torch.zeros(0, dtype=torch.int64),
        [0] * batch * k,
        method="gumbel",
        seeds=[s for s in seeds for _ in range(k)],
        positions=[j for _ in seeds for j in range(k)],
        temperature=1.0,
    )
    targets = alone.token_ids[:, 0].view(batch, k)
    assert sampler.method == "gumbel"
    drafts = targets.clone()
    drafts[:, 1] = (drafts[:, 1] + 1) % vocab
    bonus = torch.full((batch, 1), 7)
    out = sampler(probs, bonus, probs, drafts, seeds=seeds, positions=[0] * batch)
    expected = torch.cat([targets[:, :2], torch.full((batch, 2), -1)], dim=1)
    same = out[:, :2] == expected[:, :2]
    assert bool(same.float().mean() > 0.95), "log-probabilities and logits disagree too often"


def test_gumbel_takes_no_uniforms() -> None:
    with pytest.raises(ValueError, match="uniforms"):
        verify(
            torch.zeros(2, 3),
            torch.tensor([1]),
            [1],
            method="gumbel",
            temperature=1.0,
            uniforms=torch.zeros(1, 2, dtype=torch.float64),
        )


@pytest.mark.parametrize("name", FAMILIES)
def test_the_agreement_of_shared_noise_meets_the_coupling_bound(name: str) -> None:
    family = make_family(name, k=3, vocab=8)
    target = family.reference()[:-1]
    draft = family.draft.double() / family.draft.double().sum(dim=-1, keepdim=True)
    agreement = gumbel_agreement(target, draft).sum(dim=-1)
    tv = 0.5 * (target - draft).abs().sum(dim=-1)
    assert bool((agreement >= (1 - tv) / (1 + tv) - 1e-12).all())
    onehot = torch.nn.functional.one_hot(torch.tensor(2), 8).double()
    assert torch.allclose(
        gumbel_agreement(target, onehot.expand_as(target))[..., 2], target[..., 2]
    )


@pytest.mark.slow
def test_the_simulated_acceptance_matches_its_exact_value() -> None:
    """Tokens per step of ``compare`` against the exact value; the 95% interval widened to
    4.4 standard errors: a correct simulation fails with probability about 1e-5 per row."""
    results = compare_rules(("markov", "peaked"), (1, 3), rows=20_000)
    rows = [r for r in results if r.rule == "gumbel"]
    assert len(rows) == 4
    for r in rows:
        assert 1.0 < r.theory < r.k + 1
        assert abs(r.mean - r.theory) <= r.half_width / 1.96 * 4.4, r
