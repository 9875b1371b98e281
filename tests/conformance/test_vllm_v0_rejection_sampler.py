"""Conformance of :class:`specsample.RejectionSampler` with vLLM v0's rejection sampler tests.

Each test mirrors one test of vLLM's ``tests/samplers/test_rejection_sampler.py`` (named in
its docstring), calls the sampler with the arguments vLLM passes to its own, and checks the
same contract on CPU with smaller grids. Deliberate differences are asserted as our
behaviour and explained where they occur: errors are ``ValueError``/``TypeError`` naming the
argument (vLLM: ``AssertionError``), ``num_accepted_tokens`` counts only the drafts accepted
in order (vLLM also counts drafts that passed their test after an earlier rejection), and
strict mode also checks the probabilities (finite, non-negative, normalised).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specsample import RejectionSampler

VOCAB_OOB = 30_000


def _normalised(*shape: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random float32 rows with every entry positive, each summing to 1."""
    rows = torch.rand(*shape, generator=generator, dtype=torch.float64) + 1e-3
    return (rows / rows.sum(dim=-1, keepdim=True)).to(torch.float32)


def _random_ids(batch: int, width: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, width), generator=generator, dtype=torch.int64)


def _emitted_lengths(out: torch.Tensor, draft_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Check the ``[batch, k + 1]`` layout and return the tokens emitted per row.

    Each row holds a prefix of its drafts, one more token in ``[0, vocab)``, then ``-1``.
    """
    batch, k = draft_ids.shape
    assert out.shape == (batch, k + 1)
    assert out.dtype == torch.int64
    emitted = (out != -1).sum(dim=1)
    assert bool((emitted >= 1).all())
    cols = torch.arange(k + 1)
    body = cols < emitted.unsqueeze(-1)
    assert bool(torch.where(body, (out >= 0) & (out < vocab), out == -1).all())
    accepted = cols[:k] < (emitted - 1).unsqueeze(-1)
    assert bool(torch.where(accepted, out[:, :k] == draft_ids, True).all())
    return emitted


def _forced_case(
    last_accepted: torch.Tensor, k: int, vocab: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs whose acceptance pattern does not depend on the random numbers.

    Row ``i`` accepts its drafts ``0..last_accepted[i]`` (target row equal to the draft row,
    so ``q(x) = p(x) > 0``) and rejects draft ``last_accepted[i] + 1`` (target row one-hot
    at a "recovered" token ``r != x``, so ``q(x) = 0`` and the residual ``max(0, q - p)`` is
    concentrated on ``r``). Later positions are left at random, accepting or rejecting, like
    the sprinkled acceptances of vLLM's mock: they must not show in the output.

    Returns ``(target [batch, k + 1, vocab], bonus [batch, 1], draft_probs, draft_ids,
    recovered [batch, k])``.
    """
    batch = last_accepted.shape[0]
    draft_probs = _normalised(batch, k, vocab, generator=generator)
    draft_ids = _random_ids(batch, k, vocab, generator)
    offset = torch.randint(1, vocab, (batch, k), generator=generator)
    recovered = (draft_ids + offset) % vocab
    cols = torch.arange(k)
    first_rejected = cols == (last_accepted + 1).unsqueeze(-1)
    later = cols > (last_accepted + 1).unsqueeze(-1)
    sprinkled = later & (torch.rand(batch, k, generator=generator) < 0.5)
    reject = first_rejected | sprinkled
    one_hot = torch.nn.functional.one_hot(recovered, vocab).to(torch.float32)
    target = torch.empty(batch, k + 1, vocab)
    target[:, :k] = torch.where(reject.unsqueeze(-1), one_hot, draft_probs)
    target[:, k] = _normalised(batch, vocab, generator=generator)
    bonus = _random_ids(batch, 1, vocab, generator)
    return target, bonus, draft_probs, draft_ids, recovered


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("which_tokens_accepted", ["all", "none", "some"])
def test_correct_output_format(which_tokens_accepted: str, seed: int) -> None:
    """Mirrors vLLM tests/samplers/test_rejection_sampler.py::test_correct_output_format.

    vLLM feeds a mocked acceptance matrix to a private method; we reach the same states
    through the public ``forward`` with inputs whose acceptance is forced (see
    ``_forced_case``): accepted drafts are copied, the first rejected position holds the
    recovered token (or the bonus token when every draft passed), everything after is -1.
    The counters are checked as well; ``num_accepted_tokens`` counts only the drafts
    accepted in order, so the drafts that would pass after the first rejection (which vLLM's
    counter includes) are not counted.
    """
    batch, k, vocab = 10, 5, 3000
    generator = torch.Generator().manual_seed(seed)
    if which_tokens_accepted == "all":
        last_accepted = torch.full((batch,), k - 1)
    elif which_tokens_accepted == "none":
        last_accepted = torch.full((batch,), -1)
    else:
        last_accepted = torch.randint(-1, k, (batch,), generator=generator)
    target, bonus, draft_probs, draft_ids, recovered = _forced_case(
        last_accepted, k, vocab, generator
    )

    sampler = RejectionSampler()
    sampler.init_gpu_tensors(device="cpu")
    out = sampler(target, bonus, draft_probs, draft_ids)

    assert out.dtype == sampler.token_id_dtype
    emitted = _emitted_lengths(out, draft_ids, vocab)
    assert torch.equal(emitted, last_accepted + 2)
    rows = torch.arange(batch)
    recovered_or_bonus = torch.cat([recovered, bonus], dim=1)
    assert torch.equal(out[rows, last_accepted + 1], recovered_or_bonus[rows, last_accepted + 1])
    if which_tokens_accepted == "all":
        assert torch.equal(out[:, :k], draft_ids)
        assert torch.equal(out[:, k:], bonus)
    if which_tokens_accepted == "none":
        assert torch.equal(out[:, 0], recovered[:, 0])
        assert bool((out[:, 1:] == -1).all())

    assert int(sampler.num_accepted_tokens) == int((last_accepted + 1).sum())
    assert int(sampler.num_emitted_tokens) == int((last_accepted + 2).sum())
    assert sampler.num_draft_tokens == batch * k


@pytest.mark.parametrize("bonus_row", [True, False], ids=["k+1_rows", "k_rows"])
@pytest.mark.parametrize("batch_size", [1, 7, 31])
@pytest.mark.parametrize("vocab_size", [30_000])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_no_crash_with_varying_dims(
    k: int, vocab_size: int, batch_size: int, bonus_row: bool
) -> None:
    """Mirrors vLLM tests/samplers/test_rejection_sampler.py::test_no_crash_with_varying_dims.

    Like vLLM, the probabilities are unnormalised ``torch.rand`` rows; outside strict mode
    they must not crash. The target is passed with its bonus row (``[B, k + 1, V]``, vLLM's
    later layout) and without it (``[B, k, V]``, its earlier one); both are accepted. On top
    of vLLM's check, the output layout is asserted.
    """
    sampler = RejectionSampler()
    sampler.init_gpu_tensors(device="cpu")
    draft_probs = torch.rand(batch_size, k, vocab_size, dtype=torch.float32)
    target_probs = torch.rand(batch_size, k + int(bonus_row), vocab_size, dtype=torch.float32)
    bonus_token_ids = torch.randint(0, vocab_size, (batch_size, 1), dtype=torch.int64)
    draft_token_ids = torch.randint(0, vocab_size, (batch_size, k), dtype=torch.int64)

    out = sampler(target_probs, bonus_token_ids, draft_probs, draft_token_ids)

    _emitted_lengths(out, draft_token_ids, vocab_size)


def _seeded_inputs(
    batch: int, k: int, vocab: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Valid random inputs ``(target [B, k + 1, V], bonus, draft_probs, draft_ids)``."""
    generator = torch.Generator().manual_seed(seed)
    draft_probs = _normalised(batch, k, vocab, generator=generator)
    target = _normalised(batch, k + 1, vocab, generator=generator)
    # Drafts sampled from the draft rows, so that acceptance is neither certain nor rare.
    draft_ids = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=generator)
    bonus = _random_ids(batch, 1, vocab, generator)
    return target, bonus, draft_probs, draft_ids.view(batch, k)


@pytest.mark.parametrize("frac_seeded", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("k", [1, 3])
def test_deterministic_when_seeded(k: int, batch_size: int, frac_seeded: float) -> None:
    """Mirrors vLLM tests/samplers/test_rejection_sampler.py::test_deterministic_when_seeded.

    Rows listed in ``seeded_seqs`` (fifth positional argument) with freshly seeded
    generators give the same output on every repetition; the unseeded rows advance the
    global stream in between. vLLM repeats 100 times at vocab 30k/50k; 5 repetitions at
    vocab 1000 check the same contract.
    """
    vocab_size, n_rep = 1000, 5
    target, bonus, draft_probs, draft_ids = _seeded_inputs(batch_size, k, vocab_size, seed=k)
    seeded_mask = torch.rand(batch_size, generator=torch.Generator().manual_seed(1)) < frac_seeded
    sampler = RejectionSampler()
    sampler.init_gpu_tensors(device="cpu")

    results = []
    for _ in range(n_rep):
        seeded_seqs = {
            i: torch.Generator().manual_seed(i) for i in range(batch_size) if seeded_mask[i]
        }
        results.append(sampler(target, bonus, draft_probs, draft_ids, seeded_seqs))

    for i in range(batch_size):
        if seeded_mask[i]:
            for rep in results[1:]:
                assert torch.equal(rep[i], results[0][i])


@pytest.mark.parametrize("batch_size", [3, 8])
@pytest.mark.parametrize("k", [1, 3])
def test_mixed_seeded_batch(k: int, batch_size: int) -> None:
    """Mirrors vLLM tests/samplers/test_rejection_sampler.py::test_mixed_seeded_batch.

    Row 0 is unseeded, rows ``1..B-1`` have generators seeded with their index. Verifying
    the whole batch, or each row alone (a seeded row under index 0 of its own one-row
    ``seeded_seqs``), from the same global seed gives the same rows: a seeded row depends
    only on its generator and inputs, and the unseeded row reads the global stream the same
    way with or without seeded rows beside it.
    """
    vocab_size = 1000
    target, bonus, draft_probs, draft_ids = _seeded_inputs(batch_size, k, vocab_size, seed=7)

    torch.manual_seed(0)
    sampler = RejectionSampler()
    sampler.init_gpu_tensors(device="cpu")
    seeded_seqs = {i: torch.Generator().manual_seed(i) for i in range(1, batch_size)}
    batch_result = sampler(
        target.clone(), bonus.clone(), draft_probs.clone(), draft_ids.clone(), seeded_seqs
    )

    torch.manual_seed(0)
    sampler = RejectionSampler()
    sampler.init_gpu_tensors(device="cpu")
    for i in range(batch_size):
        own = {0: torch.Generator().manual_seed(i)} if i in seeded_seqs else None
        single = sampler(
            target[i : i + 1].clone(),
            bonus[i : i + 1].clone(),
            draft_probs[i : i + 1].clone(),
            draft_ids[i : i + 1].clone(),
            own,
        )
        assert torch.equal(batch_result[i], single.squeeze(0))


@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("k", [1, 3])
def test_compare_nonflashinfer_backend(k: int, batch_size: int) -> None:
    """Mirrors vLLM
    tests/samplers/test_rejection_sampler.py::test_compare_nonflashinfer_backend.

    vLLM compares the counters of two backends on fully seeded batches (and currently skips
    the test). We have one CPU backend, so we compare the counters of the two target
    layouts the sampler accepts, ``[B, k, V]`` and ``[B, k + 1, V]`` (bonus row ignored),
    under identically seeded ``seeded_seqs``: outputs and all three counters must agree,
    and the counters must match the outputs.
    """
    vocab_size = 1000
    target, bonus, draft_probs, draft_ids = _seeded_inputs(batch_size, k, vocab_size, seed=3)
    outputs, counters = [], []
    for rows in (target, target[:, :k].contiguous()):
        sampler = RejectionSampler()
        sampler.init_gpu_tensors(device="cpu")
        seeded_seqs = {i: torch.Generator().manual_seed(i) for i in range(batch_size)}
        outputs.append(sampler(rows, bonus, draft_probs, draft_ids, seeded_seqs))
        counters.append(
            (
                int(sampler.num_accepted_tokens),
                int(sampler.num_emitted_tokens),
                sampler.num_draft_tokens,
            )
        )

    assert torch.equal(outputs[0], outputs[1])
    assert counters[0] == counters[1]
    emitted = _emitted_lengths(outputs[0], draft_ids, vocab_size)
    assert counters[0] == (int((emitted - 1).sum()), int(emitted.sum()), batch_size * k)


@pytest.mark.parametrize("above_or_below_vocab_range", ["above", "below"])
@pytest.mark.parametrize("which_token_ids", ["bonus_token_ids", "draft_token_ids"])
def test_raises_when_vocab_oob(above_or_below_vocab_range: str, which_token_ids: str) -> None:
    """Mirrors vLLM tests/samplers/test_rejection_sampler.py::test_raises_when_vocab_oob.

    In strict mode a token id outside ``[0, vocab)`` raises. vLLM raises ``AssertionError``;
    we raise ``ValueError`` naming the offending argument. The probabilities are normalised
    here (vLLM passes raw ``torch.rand`` rows), because our strict mode would otherwise
    refuse them first (see ``test_strict_mode_checks_probabilities``).
    """
    k, batch_size, vocab_size = 3, 5, VOCAB_OOB
    generator = torch.Generator().manual_seed(0)
    sampler = RejectionSampler(strict_mode=True)
    sampler.init_gpu_tensors(device="cpu")
    draft_probs = _normalised(batch_size, k, vocab_size, generator=generator)
    target_probs = _normalised(batch_size, k + 1, vocab_size, generator=generator)
    bonus_token_ids = _random_ids(batch_size, 1, vocab_size, generator)
    draft_token_ids = _random_ids(batch_size, k, vocab_size, generator)
    oob = bonus_token_ids if which_token_ids == "bonus_token_ids" else draft_token_ids
    oob[0, 0] = vocab_size + 1 if above_or_below_vocab_range == "above" else -1

    with pytest.raises(ValueError, match=which_token_ids):
        sampler(target_probs, bonus_token_ids, draft_probs, draft_token_ids)


@pytest.mark.parametrize(
    ("which", "corruption"),
    [
        ("target", "unnormalised"),
        ("target", "nan"),
        ("draft", "negative"),
        ("draft", "unnormalised"),
    ],
)
def test_strict_mode_checks_probabilities(which: str, corruption: str) -> None:
    """Our strict-mode checks beyond vLLM's (no vLLM counterpart; see test_raises_when_vocab_oob).

    vLLM's strict mode checks shapes, dtypes, devices and id ranges only, so its tests pass
    raw ``torch.rand`` probabilities with ``strict_mode=True``. Ours also checks that the
    probabilities are finite, non-negative and normalised, and raises ``ValueError`` naming
    the argument; outside strict mode the same inputs are verified without error.
    """
    k, batch_size, vocab_size = 3, 4, 50
    generator = torch.Generator().manual_seed(0)
    draft_probs = _normalised(batch_size, k, vocab_size, generator=generator)
    target_probs = _normalised(batch_size, k + 1, vocab_size, generator=generator)
    bonus_token_ids = _random_ids(batch_size, 1, vocab_size, generator)
    draft_token_ids = _random_ids(batch_size, k, vocab_size, generator)
    probs = target_probs if which == "target" else draft_probs
    if corruption == "unnormalised":
        probs.copy_(torch.rand(probs.shape, generator=generator))
    elif corruption == "nan":
        probs[1, 0, 3] = float("nan")
    else:
        probs[1, 0, 3] = -0.1

    with pytest.raises(ValueError, match=f"{which}.*probs"):
        RejectionSampler(strict_mode=True)(
            target_probs, bonus_token_ids, draft_probs, draft_token_ids
        )
    out = RejectionSampler()(target_probs, bonus_token_ids, draft_probs, draft_token_ids)
    _emitted_lengths(out, draft_token_ids, vocab_size)


def test_wrong_id_dtype_raises_type_error() -> None:
    """Our dtype check (no vLLM counterpart; vLLM asserts ``token_id_dtype`` in strict mode).

    Draft ids that are not integers raise ``TypeError`` naming ``draft_token_ids``, strict
    mode or not; ``probs_dtype`` and ``token_id_dtype`` report float32 and int64 as in vLLM.
    """
    sampler = RejectionSampler()
    assert sampler.probs_dtype == torch.float32
    assert sampler.token_id_dtype == torch.int64
    probs = torch.full((2, 2, 4), 0.25)
    with pytest.raises(TypeError, match="draft_token_ids"):
        sampler(probs, torch.zeros(2, 1, dtype=torch.int64), probs, torch.zeros(2, 2))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("draft_and_target_probs_equal", [True, False])
def test_rejection_sampling_approximates_target_distribution(
    draft_and_target_probs_equal: bool,
    seed: int,
    chi_square_p_value: Callable[[torch.Tensor, torch.Tensor], float],
) -> None:
    """Mirrors vLLM
    tests/samplers/test_rejection_sampler.py::test_rejection_sampling_approximates_target_distribution.

    Same set-up as vLLM (vocab 10, ``k = 1``, random softmax draft and target rows, drafts
    sampled from the draft rows, equal rows as a NaN-free edge case), but instead of vLLM's
    distance-ratio heuristic over growing sample sizes, one Pearson chi-square test of
    20,000 emitted first tokens against the target row.

    False-failure rate: 1e-3 per parameter case (asymptotic chi-square, 9 degrees of freedom,
    expected counts above 1000; the inputs are seeded, so a given implementation either
    passes or fails every run). Power: any output law at total variation >= 0.025 from the
    target is detected with probability >= 0.99 (chi-square divergence >= 4 TV^2, so the
    noncentrality is at least 20,000 * 4 * 0.025^2 = 50 > 48.2, the value needed at this
    level and power).
    """
    vocab_size, k, num_samples = 10, 1, 20_000
    generator = torch.Generator().manual_seed(100 + seed)
    draft_row = torch.softmax(torch.rand(vocab_size, generator=generator), dim=-1)
    target_row = torch.softmax(torch.rand(vocab_size, generator=generator), dim=-1)
    if draft_and_target_probs_equal:
        target_row = draft_row.clone()
    draft_probs = draft_row.view(1, 1, vocab_size).repeat(num_samples, k, 1)
    target_probs = target_row.view(1, 1, vocab_size).repeat(num_samples, k + 1, 1)
    draft_token_ids = torch.multinomial(
        draft_probs[:, 0], num_samples=1, replacement=True, generator=generator
    ).view(num_samples, k)
    bonus_token_ids = torch.zeros(num_samples, 1, dtype=torch.int64)

    torch.manual_seed(seed)
    sampler = RejectionSampler()
    sampler.init_gpu_tensors(device="cpu")
    out = sampler(target_probs, bonus_token_ids, draft_probs, draft_token_ids)

    first = out[:, 0]
    assert bool(((first >= 0) & (first < vocab_size)).all())
    assert chi_square_p_value(first, target_row) > 1e-3
