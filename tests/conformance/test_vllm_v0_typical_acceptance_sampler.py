"""Conformance of :class:`specsample.TypicalAcceptanceSampler` with vLLM v0's tests.

Each test mirrors one test of vLLM's ``tests/samplers/test_typical_acceptance_sampler.py``
(named in its docstring), builds the sampler and calls ``forward`` with the arguments vLLM
uses (``draft_probs=None`` and ``draft_token_ids=`` as keywords, the target with its bonus
row, ``[B, k + 1, V]``) and checks the same contract on CPU with smaller grids.

The rule: draft ``x`` at a position with target row ``q`` is accepted iff
``q(x) > min(posterior_threshold, posterior_alpha * exp(-H(q)))``, drafts are kept up to the
first rejection, the next token is the argmax of ``q`` at the first rejected position, or
the given bonus token when every draft passed. The first draft is not special: it can be
rejected like any other.

Deliberate differences from vLLM, asserted as our behaviour:

* ``H`` is the exact entropy (``0 log 0 = 0``); vLLM computes ``-sum q log(q + 1e-5)``, which
  is smaller on flat rows: a normalised uniform row over 30,000 tokens is accepted by our
  rule with the test parameters (alpha 0.9) and rejected by vLLM's. vLLM's tests never see
  this because their "uniform" rows are unnormalised ``torch.rand`` rows.
* Strict mode also checks that the probabilities are finite, non-negative and normalised, so
  the tests pass normalised rows where vLLM passes raw ``torch.rand`` or one-hot rows with
  an added floor; errors are ``ValueError`` naming the argument (vLLM: ``AssertionError``).
* ``num_accepted_tokens`` counts only drafts accepted in order.
"""

from __future__ import annotations

import pytest
import torch

from specsample import TypicalAcceptanceSampler

VOCAB = 30_000


def _acceptance_sampler(
    posterior_threshold: float = 0.03,
    posterior_alpha: float = 0.9,
    strict_mode: bool = False,
) -> TypicalAcceptanceSampler:
    """The sampler with the (non-default) parameters vLLM's tests use, built positionally."""
    sampler = TypicalAcceptanceSampler(posterior_threshold, posterior_alpha, strict_mode)
    sampler.init_gpu_tensors(device="cpu")
    return sampler


def _one_hot_rows(
    batch: int, rows: int, vocab: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-temperature target rows ``[batch, rows, vocab]`` and their hot token ids."""
    hot = torch.randint(0, vocab, (batch, rows), generator=generator)
    return torch.nn.functional.one_hot(hot, vocab).to(torch.float32), hot


def _ids_avoiding(avoid: torch.Tensor, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Random int64 ids, each different from the id at the same place in ``avoid``."""
    offset = torch.randint(1, vocab, avoid.shape, generator=generator)
    return (avoid + offset) % vocab


def _uniform_rows(*shape: int) -> torch.Tensor:
    return torch.full(shape, 1.0 / shape[-1], dtype=torch.float32)


def _bonus(batch: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, 1), generator=generator, dtype=torch.int64)


@pytest.mark.parametrize("batch_size", [1, 7, 31])
@pytest.mark.parametrize("vocab_size", [30_000])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_no_crash_with_varying_dims(k: int, vocab_size: int, batch_size: int) -> None:
    """Mirrors vLLM
    tests/samplers/test_typical_acceptance_sampler.py::test_no_crash_with_varying_dims.

    Raw ``torch.rand`` target rows (as in vLLM), outside strict mode: no error, and on top of
    vLLM's check the output has the ``[B, k + 1]`` int64 layout.
    """
    sampler = _acceptance_sampler()
    target_with_bonus_probs = torch.rand(batch_size, k + 1, vocab_size, dtype=torch.float32)
    bonus_token_ids = torch.randint(0, vocab_size, (batch_size, 1), dtype=torch.int64)
    draft_token_ids = torch.randint(0, vocab_size, (batch_size, k), dtype=torch.int64)

    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )

    assert out.shape == (batch_size, k + 1)
    assert out.dtype == torch.int64
    emitted = (out != -1).sum(dim=1)
    assert bool((emitted >= 1).all())
    cols = torch.arange(k + 1)
    assert bool((out[cols >= emitted.unsqueeze(-1)] == -1).all())
    body = out[cols < emitted.unsqueeze(-1)]
    assert bool(((body >= 0) & (body < vocab_size)).all())


@pytest.mark.parametrize("above_or_below_vocab_range", ["above", "below"])
@pytest.mark.parametrize("which_token_ids", ["bonus_token_ids", "draft_token_ids"])
def test_raises_when_vocab_oob(above_or_below_vocab_range: str, which_token_ids: str) -> None:
    """Mirrors vLLM tests/samplers/test_typical_acceptance_sampler.py::test_raises_when_vocab_oob.

    Strict mode refuses an id outside ``[0, vocab)`` in the drafts or the bonus tokens: we
    raise ``ValueError`` naming the argument where vLLM raises ``AssertionError``. The target
    rows are normalised so that only the id check can fire.
    """
    k, batch_size = 3, 5
    generator = torch.Generator().manual_seed(0)
    sampler = _acceptance_sampler(strict_mode=True)
    target_with_bonus_probs = torch.softmax(
        torch.randn(batch_size, k + 1, VOCAB, generator=generator), dim=-1
    )
    bonus_token_ids = _bonus(batch_size, VOCAB, generator)
    draft_token_ids = torch.randint(0, VOCAB, (batch_size, k), generator=generator)
    oob = bonus_token_ids if which_token_ids == "bonus_token_ids" else draft_token_ids
    oob[0, 0] = VOCAB + 1 if above_or_below_vocab_range == "above" else -1

    with pytest.raises(ValueError, match=which_token_ids):
        sampler(
            target_with_bonus_probs,
            bonus_token_ids,
            draft_probs=None,
            draft_token_ids=draft_token_ids,
        )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uniform_target_distribution_accepts_all_tokens(seed: int) -> None:
    """Mirrors vLLM
    tests/samplers/test_typical_acceptance_sampler.py::test_uniform_target_distribution_accepts_all_tokens.

    On maximum-entropy rows every draft passes and the bonus token follows. The rows are
    truly uniform (``1 / V``; vLLM uses raw ``torch.rand`` rows, which our strict mode
    refuses): with the exact entropy the threshold is ``0.9 / V < 1 / V``. (vLLM's
    ``log(q + 1e-5)`` entropy would make it ``0.9 * (1 / V + 1e-5)``, above ``1 / V`` at
    ``V = 30,000``, and reject these rows.)
    """
    k, batch_size = 3, 5
    generator = torch.Generator().manual_seed(seed)
    sampler = _acceptance_sampler(strict_mode=True)
    target_with_bonus_probs = _uniform_rows(batch_size, k + 1, VOCAB)
    draft_token_ids = torch.randint(0, VOCAB, (batch_size, k), generator=generator)
    bonus_token_ids = _bonus(batch_size, VOCAB, generator)

    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )

    assert out.shape == (batch_size, k + 1)
    assert torch.equal(out[:, :k], draft_token_ids)
    assert torch.equal(out[:, k], bonus_token_ids.squeeze(-1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperature_zero_target_distribution(seed: int) -> None:
    """Mirrors vLLM
    tests/samplers/test_typical_acceptance_sampler.py::test_temperature_zero_target_distribution.

    One-hot target rows and drafts that all miss the hot token: even the first draft is
    rejected, the hot token of the first row is emitted instead, and nothing follows.
    """
    k, batch_size = 3, 5
    generator = torch.Generator().manual_seed(seed)
    sampler = _acceptance_sampler(strict_mode=True)
    target_with_bonus_probs, hot = _one_hot_rows(batch_size, k + 1, VOCAB, generator)
    draft_token_ids = _ids_avoiding(hot[:, :k], VOCAB, generator)
    bonus_token_ids = _bonus(batch_size, VOCAB, generator)

    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )

    assert out.shape == (batch_size, k + 1)
    assert torch.equal(out[:, 0], hot[:, 0])
    assert bool((out[:, 1:] == -1).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mixed_target_distribution(seed: int) -> None:
    """Mirrors vLLM
    tests/samplers/test_typical_acceptance_sampler.py::test_mixed_target_distribution.

    Sequences 0 and 2 have one-hot draft rows (drafts miss: only the hot token of row 0 is
    emitted), sequences 1 and 3 uniform ones (every draft passes, then the bonus token).
    vLLM only asserts that the bonus slot is not -1; we assert it is the given bonus token.
    """
    k, batch_size = 3, 4
    generator = torch.Generator().manual_seed(seed)
    sampler = _acceptance_sampler(strict_mode=True)
    target_with_bonus_probs, hot = _one_hot_rows(batch_size, k + 1, VOCAB, generator)
    draft_token_ids = _ids_avoiding(hot[:, :k], VOCAB, generator)
    target_with_bonus_probs[[1, 3], :k] = _uniform_rows(2, k, VOCAB)
    bonus_token_ids = _bonus(batch_size, VOCAB, generator)

    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )

    assert out.shape == (batch_size, k + 1)
    assert torch.equal(out[[0, 2], 0], hot[[0, 2], 0])
    assert bool((out[[0, 2], 1:] == -1).all())
    assert torch.equal(out[[1, 3], :k], draft_token_ids[[1, 3]])
    assert torch.equal(out[[1, 3], k], bonus_token_ids[[1, 3], 0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accept_tokens_partially(seed: int) -> None:
    """Mirrors vLLM tests/samplers/test_typical_acceptance_sampler.py::test_accept_tokens_partially.

    One-hot target rows. Drafts equal to the hot tokens are all accepted and followed by
    the bonus token; keeping only the first two and replacing the last three by misses
    emits the two, then the hot token (argmax) of row 2, then -1.
    """
    k, batch_size = 5, 1
    generator = torch.Generator().manual_seed(seed)
    sampler = _acceptance_sampler(strict_mode=True)
    target_with_bonus_probs, hot = _one_hot_rows(batch_size, k + 1, VOCAB, generator)
    bonus_token_ids = _bonus(batch_size, VOCAB, generator)

    draft_token_ids = hot[:, :k].clone()
    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )
    assert out.shape == (batch_size, k + 1)
    assert torch.equal(out[:, :k], draft_token_ids)
    assert torch.equal(out[:, k:], bonus_token_ids)

    misses = _ids_avoiding(hot[:, :k], VOCAB, generator)
    draft_token_ids = torch.cat([draft_token_ids[:, :2], misses[:, 2:]], dim=1)
    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )
    assert out.shape == (batch_size, k + 1)
    assert torch.equal(out[:, :2], draft_token_ids[:, :2])
    assert torch.equal(out[:, 2], target_with_bonus_probs.argmax(dim=-1)[:, 2])
    assert bool((out[:, 3:] == -1).all())


def test_accept_tokens_set_non_default_posteriors() -> None:
    """Mirrors vLLM
    tests/samplers/test_typical_acceptance_sampler.py::test_accept_tokens_set_non_default_posteriors.

    Near-one-hot rows (every other token at 1e-5 before normalising; vLLM leaves them
    unnormalised, which our strict mode refuses) and drafts that miss the peak: rejected
    from the first position with the test parameters, all accepted (then the bonus token)
    with ``posterior_threshold = posterior_alpha = 0``, since then any positive
    probability passes.
    """
    k, batch_size = 5, 1
    generator = torch.Generator().manual_seed(0)
    target_probs, hot = _one_hot_rows(batch_size, k + 1, VOCAB, generator)
    target_probs[target_probs == 0] = 1e-5
    target_probs /= target_probs.sum(dim=-1, keepdim=True)
    draft_token_ids = _ids_avoiding(hot[:, :k], VOCAB, generator)
    bonus_token_ids = _bonus(batch_size, VOCAB, generator)

    sampler = _acceptance_sampler(strict_mode=True)
    out = sampler(target_probs, bonus_token_ids, draft_probs=None, draft_token_ids=draft_token_ids)
    assert out.shape == (batch_size, k + 1)
    assert torch.equal(out[:, 0], hot[:, 0])
    assert bool((out[:, 1:] == -1).all())

    sampler = TypicalAcceptanceSampler(
        strict_mode=True, posterior_threshold=0.0, posterior_alpha=0.0
    )
    sampler.init_gpu_tensors(device="cpu")
    out = sampler(target_probs, bonus_token_ids, draft_probs=None, draft_token_ids=draft_token_ids)
    assert out.shape == (batch_size, k + 1)
    assert torch.equal(out[:, :k], draft_token_ids)
    assert torch.equal(out[:, k:], bonus_token_ids)


@pytest.mark.parametrize("seed", [0, 1])
def test_get_recovered_token_ids(seed: int) -> None:
    """Mirrors vLLM tests/samplers/test_typical_acceptance_sampler.py::test_get_recovered_token_ids.

    vLLM checks a private method (the argmax of every target row). We check the same
    through ``forward``: sequence ``j`` of a ``k``-sequence batch drafts the argmax at
    positions before ``j`` (always accepted with alpha < 1, since ``max q >= exp(-H(q))``)
    and a zero-probability token at ``j`` (always rejected), so the token emitted at ``j``
    must be the argmax of its target row, for every position ``j``.
    """
    k, vocab_size = 10, VOCAB
    batch_size = k
    generator = torch.Generator().manual_seed(seed)
    target_with_bonus_probs = torch.softmax(
        2.0 * torch.randn(batch_size, k + 1, vocab_size, generator=generator), dim=-1
    )
    best = target_with_bonus_probs.argmax(dim=-1)
    draft_token_ids = best[:, :k].clone()
    rows = torch.arange(batch_size)
    miss = _ids_avoiding(best[rows, rows], vocab_size, generator)
    target_with_bonus_probs[rows, rows, miss] = 0.0
    target_with_bonus_probs /= target_with_bonus_probs.sum(dim=-1, keepdim=True)
    draft_token_ids[rows, rows] = miss
    bonus_token_ids = _bonus(batch_size, vocab_size, generator)

    sampler = _acceptance_sampler(strict_mode=True)
    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )

    expected = torch.where(torch.arange(k + 1) < rows.unsqueeze(-1), best, -1)
    expected[rows, rows] = best[rows, rows]
    assert torch.equal(out, expected)


@pytest.mark.parametrize(("posterior_alpha", "accepted"), [(0.9, True), (1.5, False)])
def test_huge_posterior_threshold_leaves_the_entropy_term(
    posterior_alpha: float, accepted: bool
) -> None:
    """The ``min`` in the rule (no vLLM counterpart; vLLM's formula is the same).

    A huge ``posterior_threshold`` does not reject everything: the threshold becomes
    ``posterior_alpha * exp(-H(q))``. On (nearly) uniform rows over 8 tokens that is
    about ``posterior_alpha / 8``: below every ``q(x)`` (about ``1 / 8``) for alpha 0.9,
    above all of them for alpha 1.5, where the argmax of the first row is emitted.
    """
    k, batch_size, vocab_size = 3, 4, 8
    generator = torch.Generator().manual_seed(0)
    sampler = _acceptance_sampler(1e9, posterior_alpha, strict_mode=True)
    # Within 1% of uniform, so that the argmax is unique and the entropy close to log 8.
    weights = 1.0 + 0.01 * torch.rand(batch_size, k + 1, vocab_size, generator=generator)
    target_with_bonus_probs = weights / weights.sum(dim=-1, keepdim=True)
    draft_token_ids = torch.randint(0, vocab_size, (batch_size, k), generator=generator)
    bonus_token_ids = _bonus(batch_size, vocab_size, generator)

    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )

    if accepted:
        assert torch.equal(out, torch.cat([draft_token_ids, bonus_token_ids], dim=1))
    else:
        assert torch.equal(out[:, 0], target_with_bonus_probs[:, 0].argmax(dim=-1))
        assert bool((out[:, 1:] == -1).all())


def test_counters_count_drafts_accepted_in_order() -> None:
    """Our counter semantics (no vLLM counterpart test; vLLM's ``_create_output`` differs).

    Drafts ``[hit, miss, hit]`` on one-hot rows: the third draft passes its own test but
    comes after a rejection. vLLM adds every passing draft to ``num_accepted_tokens`` (2
    here); we count only the drafts accepted in order (1). Emitted tokens: the accepted
    draft plus the correction; drafts offered: 3.
    """
    k, vocab_size = 3, 16
    generator = torch.Generator().manual_seed(0)
    sampler = _acceptance_sampler(strict_mode=True)
    target_with_bonus_probs, hot = _one_hot_rows(1, k + 1, vocab_size, generator)
    draft_token_ids = hot[:, :k].clone()
    draft_token_ids[0, 1] = (hot[0, 1] + 1) % vocab_size
    bonus_token_ids = _bonus(1, vocab_size, generator)

    out = sampler(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs=None,
        draft_token_ids=draft_token_ids,
    )

    assert out.tolist() == [[int(hot[0, 0]), int(hot[0, 1]), -1, -1]]
    assert int(sampler.num_accepted_tokens) == 1
    assert int(sampler.num_emitted_tokens) == 2
    assert sampler.num_draft_tokens == k
