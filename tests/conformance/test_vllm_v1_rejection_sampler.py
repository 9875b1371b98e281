"""Conformance of :func:`specsample.verify` with vLLM v1's rejection sampler tests.

Each test mirrors one test of vLLM's ``tests/v1/sample/test_rejection_sampler.py`` (named in
its docstring) and checks the same contract on CPU, calling :func:`specsample.verify` the way
vLLM v1 calls its sampler: a flattened ragged batch whose target logits hold the draft
positions only, the bonus tokens given (``bonus_token_ids``), per-request temperatures
(0 = greedy) and per-request ``generators``. Deliberate differences, asserted as our
behaviour where they occur:

* vLLM applies penalties, bad words and allowed-token masks inside its sampler; we take the
  logits as the caller processed them, so those tests apply the processing to the logits.
* vLLM's tests of its internal recovered-token sampler (``sample_recovered_tokens``) map to
  the public contract of the token emitted at the first rejection, with caller-given
  ``uniforms``: the first token whose residual prefix sum exceeds ``u * total``.
* vLLM's lossy ``fly`` and ``synthetic`` methods do not exist here (``method`` raises
  ``ValueError``); those tests assert what the exact rule emits on the same inputs, and
  force acceptance patterns through ``uniforms`` instead of acceptance rates.
* Output ids are int64 (vLLM: int32); padding is -1, like vLLM's ``PLACEHOLDER_TOKEN_ID``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specsample import VerifyOutput, verify
from specsample.rules.residual import BLOCK

PLACEHOLDER = -1
NEAR_ONE = 1.0 - 2.0**-53


def _flat_drafts(spec: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """``(draft_token_ids [total_drafts] int64, num_draft_tokens)`` of per-request drafts."""
    ids = [t for tokens in spec for t in tokens]
    return torch.tensor(ids, dtype=torch.int64), [len(tokens) for tokens in spec]


def _argmax_logits(
    targets: list[list[int]], vocab: int = 100, runner_up: int | None = None
) -> torch.Tensor:
    """``[total_drafts, vocab]`` float32 logits whose argmax at each draft position is given.

    ``targets[i]`` lists request ``i``'s target token at each draft position, then its bonus
    token (which has no row). Every logit is -100, the target's is 100 and, when given,
    ``runner_up``'s is 99 (the token a masked or penalised target falls back to).
    """
    tokens = [t for per_request in targets for t in per_request[:-1]]
    logits = torch.full((len(tokens), vocab), -100.0)
    if runner_up is not None:
        logits[:, runner_up] = 99.0
    logits[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.int64)] = 100.0
    return logits


def _bonus(targets: list[list[int]]) -> torch.Tensor:
    return torch.tensor([[per_request[-1]] for per_request in targets], dtype=torch.int64)


def _check_layout(
    out: VerifyOutput, draft_ids: torch.Tensor, counts: list[int], vocab: int
) -> None:
    """Each row: an accepted prefix of its drafts, one token in ``[0, vocab)``, then -1."""
    width = max(counts, default=0) + 1
    assert out.token_ids.shape == (len(counts), width)
    assert out.token_ids.dtype == torch.int64
    for row, (drafts, n) in enumerate(zip(draft_ids.split(counts), counts, strict=True)):
        accepted = int(out.num_accepted[row])
        tokens = out.token_ids[row]
        assert 0 <= accepted <= n
        assert torch.equal(tokens[:accepted], drafts[:accepted])
        assert 0 <= int(tokens[accepted]) < vocab
        assert bool((tokens[accepted + 1 :] == PLACEHOLDER).all())


def _greedy(
    spec: list[list[int]], targets: list[list[int]], logits: torch.Tensor | None = None
) -> list[list[int]]:
    """Verify greedily (temperature 0) and return the output rows."""
    draft_ids, counts = _flat_drafts(spec)
    logits = _argmax_logits(targets) if logits is None else logits
    out = verify(logits, draft_ids, counts, bonus_token_ids=_bonus(targets), temperature=0.0)
    _check_layout(out, draft_ids, counts, logits.shape[-1])
    return out.token_ids.tolist()


def _assert_no_lossy_method(name: str, logits: torch.Tensor, spec: list[list[int]]) -> None:
    draft_ids, counts = _flat_drafts(spec)
    bonus = torch.zeros(len(counts), dtype=torch.int64)
    with pytest.raises(ValueError, match="method"):
        verify(logits, draft_ids, counts, bonus_token_ids=bonus, method=name)


def _uniforms(value: float, batch: int, width: int) -> torch.Tensor:
    return torch.full((batch, width), value, dtype=torch.float64)


# ------------------------------------------------------------------ greedy verification


def test_perfect_match() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_perfect_match."""
    assert _greedy([[1, 2, 3]], [[1, 2, 3, 4]]) == [[1, 2, 3, 4]]


def test_early_mismatch() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_early_mismatch."""
    assert _greedy([[1, 2, 3]], [[1, 5, 3, 4]]) == [[1, 5, PLACEHOLDER, PLACEHOLDER]]


def test_multiple_sequences() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_multiple_sequences."""
    assert _greedy([[1, 2], [3]], [[1, 2, 5], [3, 4]]) == [[1, 2, 5], [3, 4, PLACEHOLDER]]


def test_single_token_sequence() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_single_token_sequence."""
    assert _greedy([[1]], [[1, 2]]) == [[1, 2]]


def test_empty_sequence() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_empty_sequence.

    No drafts at all: the target has zero rows and the given bonus token is emitted.
    """
    assert _greedy([[]], [[5]]) == [[5]]


def test_multiple_mismatches() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_multiple_mismatches."""
    out = _greedy([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]])
    assert out == [[1, 2, 7, PLACEHOLDER], [4, 8, PLACEHOLDER, PLACEHOLDER]]


@pytest.mark.parametrize(
    ("spec", "targets", "expected"),
    [
        ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
        ([[1]], [[2, 3]], [[2, PLACEHOLDER]]),
        ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, PLACEHOLDER], [3, 4, 7]]),
    ],
    ids=["perfect_match", "first_mismatch", "mixed"],
)
def test_parametrized_cases(
    spec: list[list[int]], targets: list[list[int]], expected: list[list[int]]
) -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_parametrized_cases."""
    assert _greedy(spec, targets) == expected


# ------------------------------------------------------------------ sampled verification


@pytest.mark.parametrize("frac_seeded", [0.0, 0.5])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_deterministic_when_seeded(k: int, batch_size: int, frac_seeded: float) -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_deterministic_when_seeded.

    One-hot drafts (``draft_probs=None``), temperature 1: rows with a freshly seeded
    generator in ``generators`` give the same output on every repetition while the other
    rows advance the global stream. vLLM repeats 20 times; 10 repetitions here.
    """
    vocab, n_rep = 1000, 10
    target_logits = torch.rand(batch_size * k, vocab)
    bonus = torch.randint(0, vocab, (batch_size, 1))
    draft_ids = torch.randint(0, vocab, (batch_size * k,))
    seeded = torch.rand(batch_size) < frac_seeded
    counts = [k] * batch_size

    results = []
    for _ in range(n_rep):
        generators = {i: torch.Generator().manual_seed(i) for i in range(batch_size) if seeded[i]}
        out = verify(
            target_logits,
            draft_ids,
            counts,
            bonus_token_ids=bonus,
            temperature=torch.ones(batch_size),
            generators=generators,
        )
        _check_layout(out, draft_ids, counts, vocab)
        results.append(out.token_ids)

    for i in range(batch_size):
        if seeded[i]:
            for rep in results[1:]:
                assert torch.equal(rep[i], results[0][i])


@pytest.mark.parametrize("drafts", ["draft_probs", "one_hot"])
def test_rejection_sampling_approximates_target_distribution(
    drafts: str, chi_square_p_value: Callable[[torch.Tensor, torch.Tensor], float]
) -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_rejection_sampling_approximates_target_distribution.

    Same set-up as vLLM (vocab 10, ``k = 2``, softmax-of-uniform draft row, target logits
    uniform in [0, 1) at temperature 1, drafts sampled from the draft row, bonus tokens
    given), with the drafts passed with their probabilities (as vLLM) or one-hot (an n-gram
    drafter). Instead of vLLM's distance-ratio heuristic over growing sample sizes, one
    Pearson chi-square test per draft position: position 0 over every request, position 1
    over the requests that accepted draft 0 (given that, its token is again drawn from the
    target). 40,000 requests with draft probabilities, 400,000 one-hot (which accept only
    about 10% of first drafts): at least 32,000 reach position 1 either way (asserted).

    False-failure rate: 1e-3 per parameter case (5e-4 per position, Bonferroni; asymptotic
    chi-square with 9 degrees of freedom, expected counts above 1000; the inputs and the
    global stream are seeded, so a given implementation passes or fails every run). Power:
    an output law at total variation >= 0.02 from the target, at either position, is
    detected with probability >= 0.99 (chi-square divergence >= 4 TV^2, so the
    noncentrality is at least 32,000 * 4 * 0.02^2 = 51.2 > 50.8, the value needed).
    """
    vocab, k = 10, 2
    num_requests = 40_000 if drafts == "draft_probs" else 400_000
    generator = torch.Generator().manual_seed(5)
    draft_row = torch.softmax(torch.rand(vocab, generator=generator), dim=-1)
    target_row_logits = torch.rand(vocab, generator=generator)
    target_row = torch.softmax(target_row_logits.double(), dim=-1)
    draft_ids = torch.multinomial(
        draft_row, num_requests * k, replacement=True, generator=generator
    )
    draft_probs = draft_row.expand(num_requests * k, vocab) if drafts == "draft_probs" else None

    out = verify(
        target_row_logits.expand(num_requests * k, vocab),
        draft_ids,
        [k] * num_requests,
        draft_probs=draft_probs,
        bonus_token_ids=torch.zeros(num_requests, 1, dtype=torch.int64),
        temperature=1.0,
    )

    first, second = out.token_ids[:, 0], out.token_ids[:, 1]
    assert bool(((first >= 0) & (first < vocab)).all())
    reached = out.num_accepted >= 1
    assert int(reached.sum()) >= 32_000
    assert chi_square_p_value(first, target_row) > 5e-4
    assert chi_square_p_value(second[reached], target_row) > 5e-4


def _sample_masked(
    target_logits: torch.Tensor, batch: int, k: int, **params: object
) -> VerifyOutput:
    """Verify drafts sampled from random draft rows against ``target_logits``, bonus 0."""
    vocab = target_logits.shape[-1]
    draft_probs = torch.softmax(torch.rand(batch * k, vocab), dim=-1)
    draft_ids = torch.multinomial(draft_probs, 1).squeeze(-1)
    out = verify(
        target_logits,
        draft_ids,
        [k] * batch,
        draft_probs=draft_probs,
        bonus_token_ids=torch.zeros(batch, 1, dtype=torch.int64),
        temperature=torch.ones(batch),
        **params,  # type: ignore[arg-type]
    )
    _check_layout(out, draft_ids, [k] * batch, vocab)
    return out


def _assert_within(out: VerifyOutput, allowed: torch.Tensor, k: int) -> None:
    """Every token emitted at a draft position is allowed at that position's target row."""
    tokens = out.token_ids[:, :k].reshape(-1)
    emitted = tokens != PLACEHOLDER
    rows = torch.arange(tokens.numel())[emitted]
    assert bool(allowed[rows, tokens[emitted]].all())


@pytest.mark.parametrize("top_k", [1, 5, 99])
def test_top_k(top_k: int) -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_top_k.

    Target logits 0.1 on ``top_k`` random tokens per row and 0 elsewhere: whatever the
    drafts, every token emitted at a draft position is one of its row's top ``top_k``.
    """
    vocab, batch, k = 100, 100, 3
    order = torch.rand(batch * k, vocab).argsort(dim=-1)
    allowed = torch.zeros(batch * k, vocab, dtype=torch.bool).scatter_(1, order[:, :top_k], True)
    target_logits = allowed.to(torch.float32) * 0.1

    out = _sample_masked(target_logits, batch, k, top_k=[top_k] * batch)
    _assert_within(out, allowed, k)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p(top_p: float) -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_top_p.

    Standard-normal target logits: every token emitted at a draft position belongs to the
    smallest set of most likely tokens whose probability reaches ``top_p``, i.e. the tokens
    more likely than it weigh less than ``top_p`` (with a 1e-5 margin for rounding at the
    threshold; vLLM's definition, keeping the tokens whose ascending cumulative probability
    exceeds ``1 - top_p``, is the same set).
    """
    vocab, batch, k = 100, 100, 3
    target_logits = torch.randn(batch * k, vocab)
    probs = torch.softmax(target_logits.double(), dim=-1)
    ordered, index = probs.sort(dim=-1, descending=True)
    above = ordered.cumsum(dim=-1) - ordered
    allowed = torch.empty_like(probs, dtype=torch.bool).scatter_(1, index, above < top_p + 1e-5)

    out = _sample_masked(target_logits, batch, k, top_p=[top_p] * batch)
    _assert_within(out, allowed, k)


# ------------------------------------------------------------------ logits processing


def test_frequency_penalties() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_frequency_penalties.

    vLLM applies the penalties inside the sampler; we take processed logits, so the test
    subtracts ``penalty * count`` at each draft position, counting the earlier output and
    the earlier drafts of the same request. The greedy outcome is vLLM's: token 1 falls
    below the runner-up 15 after one repetition at penalty 1.5, after two at 0.7, and the
    request without drafts in the middle emits its bonus token.
    """
    spec = [[1, 1, 1], [], [1, 1, 1]]
    targets = [[1, 1, 1, 1], [7], [1, 1, 1, 1]]
    earlier_output, penalties = [[2], [3], [4]], [1.5, 1.5, 0.7]
    logits = _argmax_logits(targets, runner_up=15)
    row = 0
    for tokens, output, penalty in zip(spec, earlier_output, penalties, strict=True):
        for j in range(len(tokens)):
            seen = torch.tensor(output + tokens[:j], dtype=torch.int64)
            logits[row] -= penalty * torch.bincount(seen, minlength=logits.shape[-1])
            row += 1

    assert _greedy(spec, targets, logits) == [[1, 15, -1, -1], [7, -1, -1, -1], [1, 1, 15, -1]]


def test_bad_words() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_bad_words.

    The single-token bad word 2 of requests 0 and 2 (not 1, so the requests with it are not
    consecutive) is masked to ``-inf`` in their rows by the caller: draft 2 is rejected there
    and the runner-up 15 emitted, while request 1 accepts every draft.
    """
    spec = [[1, 2, 3], [1, 15, 3], [1, 2, 3]]
    targets = [[1, 2, 3, 4], [1, 15, 3, 4], [1, 2, 3, 4]]
    logits = _argmax_logits(targets, runner_up=15)
    for request in (0, 2):
        logits[3 * request : 3 * request + 3, 2] = -torch.inf

    assert _greedy(spec, targets, logits) == [[1, 15, -1, -1], [1, 15, 3, 4], [1, 15, -1, -1]]


def test_allowed_token_ids() -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_allowed_token_ids.

    As in vLLM's mask, tokens ``[i, i + 5)`` are disallowed for the even requests ``i``
    (0 and 2) and nothing for request 1; the caller sets them to ``-inf``. Request 0's first
    draft (1) is disallowed, so the runner-up 15 is emitted; request 2's drafts are all
    allowed.
    """
    spec = [[1, 2, 10], [10, 5, 3], [7, 10, 12]]
    targets = [[1, 2, 10, 5], [10, 5, 10, 5], [7, 10, 12, 5]]
    logits = _argmax_logits(targets, runner_up=15)
    for request in (0, 2):
        logits[3 * request : 3 * request + 3, request : request + 5] = -torch.inf

    out = _greedy(spec, targets, logits)
    assert out == [[15, -1, -1, -1], [10, 5, 10, -1], [7, 10, 12, 5]]


# ------------------------------------------------------------------ recovered tokens


def _safe_uniforms(
    q: torch.Tensor, p: torch.Tensor | None, draft_ids: torch.Tensor, batch: int, k: int
) -> torch.Tensor:
    """``[batch, k + 1]`` random uniforms, none of whose accept tests is within 1e-5 of a tie.

    Half the accept uniforms are 0 (a sure pass, every ``q(x) > 0`` here), so that even
    one-hot drafts reach every position.
    """
    u = torch.rand(batch, k + 1, dtype=torch.float64)
    u[:, :k].masked_fill_(torch.rand(batch, k) < 0.5, 0.0)
    rows = torch.arange(batch * k)
    q_at = q[rows, draft_ids].view(batch, k)
    p_at = torch.ones_like(q_at) if p is None else p[rows, draft_ids].view(batch, k)
    tie = (u[:, :k] * p_at - q_at).abs() < 1e-5
    u[:, :k] = torch.where(tie, (u[:, :k] + 0.5) % 1.0, u[:, :k])
    return u


def _reference_emission(
    q: torch.Tensor, p: torch.Tensor | None, drafts: list[int], u: torch.Tensor
) -> tuple[int, list[int]]:
    """One request's ``(num_accepted, tokens the emitted one may be)`` under the chain rule.

    ``q``, ``p``: ``[n, vocab]`` float64 rows of its draft positions; ``u``: ``[n + 1]``.
    Draft ``x`` passes when ``u * p(x) < q(x)``. At the first rejection the token is the
    first whose residual prefix sum exceeds ``u[-1] * total``; cells within ``1e-6 * total``
    of that point are accepted too, for float32 rounding. All accepted: no token (bonus).
    """
    for j, x in enumerate(drafts):
        p_x = 1.0 if p is None else float(p[j, x])
        if float(u[j]) * p_x < float(q[j, x]):
            continue
        weights = q[j].clone().index_fill_(0, torch.tensor([x]), 0.0)
        if p is not None:
            weights = (q[j] - p[j]).clamp(min=0.0)
        cum = weights.cumsum(dim=0)
        point, band = float(u[-1]) * float(cum[-1]), 1e-6 * float(cum[-1])
        near = (weights > 0) & (cum > point - band) & (cum - weights <= point + band)
        return j, near.nonzero().flatten().tolist()
    return len(drafts), []


@pytest.mark.parametrize("no_draft_probs", [True, False])
@pytest.mark.parametrize("max_spec_len", [1, 3])
@pytest.mark.parametrize("vocab_size", [100, 8192, 10000])
@pytest.mark.parametrize("batch_size", [1, 100])
def test_sample_recovered_tokens(
    batch_size: int, vocab_size: int, max_spec_len: int, no_draft_probs: bool
) -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_sample_recovered_tokens.

    vLLM compares its internal recovered-token sampler with a native reference of it. Our
    public counterpart: with given ``uniforms``, ``verify`` rejects exactly where the
    float64 reference above does and emits the residual token it picks (``max(0, q - p)``,
    or ``q`` without the draft for one-hot drafts), at every draft position reached.
    """
    k = max_spec_len
    draft_probs = torch.softmax(torch.rand(batch_size * k, vocab_size), dim=-1)
    target_logits = torch.rand(batch_size * k, vocab_size)
    draft_ids = torch.multinomial(draft_probs, 1).squeeze(-1)
    q = torch.softmax(target_logits.double(), dim=-1)
    p = None if no_draft_probs else draft_probs.double()
    u = _safe_uniforms(q, p, draft_ids, batch_size, k)

    out = verify(
        target_logits,
        draft_ids,
        [k] * batch_size,
        draft_probs=None if no_draft_probs else draft_probs,
        bonus_token_ids=torch.full((batch_size,), 7),
        temperature=1.0,
        uniforms=u,
    )

    for i in range(batch_size):
        rows = slice(i * k, (i + 1) * k)
        accepted, tokens = _reference_emission(
            q[rows], None if p is None else p[rows], draft_ids[rows].tolist(), u[i]
        )
        assert int(out.num_accepted[i]) == accepted
        assert int(out.token_ids[i, accepted]) in (tokens or [7])


@pytest.mark.parametrize("drafts", ["draft_probs", "one_hot"])
def test_sample_recovered_tokens_uses_fp64_exponential_race_when_requested(drafts: str) -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_sample_recovered_tokens_uses_fp64_exponential_race_when_requested.

    vLLM optionally draws its recovered tokens from float64 random numbers; ours are always
    float64 (float32 ``uniforms`` raise ``TypeError``) and resolved in float64. The residual
    holds a token of mass ``2**-40`` after one of mass 1/2 (or 1, one-hot drafts): a final
    uniform ``1 - 2**-43`` must reach the tiny token, ``1 - 2**-38`` must not; in float32
    both uniforms round to 1.
    """
    vocab, tiny, draft = 64, 63, 5
    logits = torch.full((1, vocab), -torch.inf)
    logits[0, 0], logits[0, tiny] = 0.0, -40.0 * torch.log(torch.tensor(2.0))
    draft_probs = None
    if drafts == "draft_probs":
        draft_probs = torch.zeros(1, vocab)
        draft_probs[0, 0] = draft_probs[0, draft] = 0.5

    def emitted(final: float, dtype: torch.dtype = torch.float64) -> int:
        out = verify(
            logits,
            torch.tensor([draft]),
            [1],
            draft_probs=draft_probs,
            bonus_token_ids=torch.tensor([1]),
            uniforms=torch.tensor([[0.0, final]], dtype=dtype),
        )
        return int(out.token_ids[0, 0])

    assert emitted(1.0 - 2.0**-43) == tiny
    assert emitted(1.0 - 2.0**-38) == 0
    with pytest.raises(TypeError, match="uniforms"):
        emitted(0.5, torch.float32)


@pytest.mark.parametrize("no_draft_probs", [True, False])
@pytest.mark.parametrize("vocab_size", [100, 8193, 10000, 151936])
def test_sample_recovered_tokens_vocab_boundary(vocab_size: int, no_draft_probs: bool) -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_sample_recovered_tokens_vocab_boundary.

    vLLM's regression: a recovered id at or beyond the vocabulary when the last, partial
    tile has no target mass. Our residual sampler works in vocabulary blocks of ``BLOCK``
    tokens; these sizes leave a partial last block (one token at 8193). The target has no
    mass from the start of the last block on (below ``BLOCK``: all its mass on token 0), the
    drafts lie there (always rejected), and the final uniforms are the extremes 0 and
    ``1 - 2**-53``: the emitted token must be the first, resp. the last, token of positive
    residual, never one of zero residual nor an id outside the vocabulary.
    """
    batch, k = 2, 3
    start = vocab_size // BLOCK * BLOCK if vocab_size > BLOCK else 1
    q = torch.rand(batch * k, vocab_size, dtype=torch.float64)
    q[:, start:] = 0.0
    q /= q.sum(dim=-1, keepdim=True)
    draft_probs = torch.softmax(torch.rand(batch * k, vocab_size), dim=-1)
    draft_ids = torch.randint(start, vocab_size, (batch * k,))
    u = torch.tensor([[0.0] * (k + 1), [NEAR_ONE] * (k + 1)], dtype=torch.float64)

    out = verify(
        q.log().float(),
        draft_ids,
        [k] * batch,
        draft_probs=None if no_draft_probs else draft_probs,
        bonus_token_ids=torch.zeros(batch, dtype=torch.int64),
        uniforms=u,
    )

    assert out.num_accepted.tolist() == [0, 0]
    residual = q[::k] if no_draft_probs else (q[::k] - draft_probs[::k].double()).clamp(min=0)
    for i, token in enumerate(out.token_ids[:, 0].tolist()):
        assert 0 <= token < start
        assert float(residual[i, token]) > 0.0
        others = residual[i, :token] if i == 0 else residual[i, token + 1 :]
        assert bool((others <= 1e-6).all())


# ------------------------------------------------------------------ lossy methods (none here)


def test_fly_greedy_rescues_mismatch_after_native_acceptance_window() -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_fly_greedy_rescues_mismatch_after_native_acceptance_window.

    vLLM's lossy FLy rule accepts a mismatch followed by matches; we have no such method
    (``method="fly"`` raises ``ValueError``) and give vLLM's standard output: the mismatch
    at position 0 ends the step.
    """
    spec, targets = [[1, 2, 3, 4]], [[9, 2, 3, 4, 5]]
    assert _greedy(spec, targets) == [[9, -1, -1, -1, -1]]
    _assert_no_lossy_method("fly", _argmax_logits(targets), spec)


def test_fly_requires_full_lookahead_and_passes_entropy_gate() -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_fly_requires_full_lookahead_and_passes_entropy_gate.

    FLy's entropy gate does not exist here: with a confident or a flat first row, greedy
    verification emits the argmax 9 at the first mismatch, and ``method="fly"`` raises.
    """
    spec, targets = [[1, 2, 3, 4, 5]], [[9, 2, 3, 8, 5, 6]]
    logits = _argmax_logits(targets, vocab=10)
    assert _greedy(spec, targets, logits)[0] == [9, -1, -1, -1, -1, -1]
    logits[0] = torch.tensor([0.8, 0.9] + [-100.0] * 7 + [1.0])
    assert _greedy(spec, targets, logits)[0] == [9, -1, -1, -1, -1, -1]
    _assert_no_lossy_method("fly", logits, spec)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fly_does_not_override_target_constraint(temperature: float) -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_fly_does_not_override_target_constraint.

    A draft whose target logit is ``-inf`` is never accepted, greedy or sampled (even with
    accept uniform 0), and never emitted: greedy emits the argmax 9; sampled with final
    uniform 0 emits the first token of positive probability, 0.
    """
    logits = torch.full((3, 10), -100.0)
    logits[0, 9], logits[0, 0], logits[0, 8], logits[0, 1] = 1.0, 0.9, 0.8, -torch.inf
    logits[1, 2] = logits[2, 3] = 100.0
    out = verify(
        logits,
        torch.tensor([1, 2, 3]),
        [3],
        bonus_token_ids=torch.tensor([4]),
        temperature=temperature,
        uniforms=_uniforms(0.0, 1, 4),
    )
    assert out.token_ids.tolist() == [[9 if temperature == 0.0 else 0, -1, -1, -1]]
    _assert_no_lossy_method("fly", logits, [[1, 2, 3]])


def _probability_rows(entries: list[dict[int, float]], vocab: int) -> torch.Tensor:
    rows = torch.zeros(len(entries), vocab)
    for row, probs in enumerate(entries):
        for token, prob in probs.items():
            rows[row, token] = prob
    return rows


def test_fly_target_only_sampling_uses_mapped_target_ids() -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_fly_target_only_sampling_uses_mapped_target_ids.

    vLLM patches its uniforms to 0.5; we pass them. One-hot draft 7 with ``q(7) = 0.4`` fails
    its test (0.5 >= 0.4), and the residual ``q`` without 7 is all on 9: the exact rule
    emits 9 and stops (FLy would accept all four drafts).
    """
    q = _probability_rows(
        [{9: 0.6, 7: 0.4}, {0: 0.2, 2: 0.8}, {0: 0.2, 3: 0.8}, {0: 0.2, 4: 0.8}], 10
    )
    out = verify(
        q.log(),
        torch.tensor([7, 2, 3, 4]),
        [4],
        bonus_token_ids=torch.tensor([8]),
        uniforms=_uniforms(0.5, 1, 5),
    )
    assert out.token_ids.tolist() == [[9, -1, -1, -1, -1]]
    _assert_no_lossy_method("fly", q.log(), [[7, 2, 3, 4]])


def test_fly_probabilistic_draft_sampling_uses_probability_ratio() -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_fly_probabilistic_draft_sampling_uses_probability_ratio.

    Uniforms 0.9: draft 1 with ``q(1) / p(1) = 0.4 / 0.5 = 0.8`` is rejected and the residual
    ``max(0, q - p)`` is all on token 0 (FLy would accept all four drafts).
    """
    q = _probability_rows([{0: 0.6, 1: 0.4}] + [{0: 0.4, t: 0.6} for t in (2, 3, 4)], 8)
    p = _probability_rows([{0: 0.5, 1: 0.5}] + [{0: 0.5, t: 0.5} for t in (2, 3, 4)], 8)
    out = verify(
        q.log(),
        torch.tensor([1, 2, 3, 4]),
        [4],
        draft_probs=p,
        bonus_token_ids=torch.tensor([7]),
        uniforms=_uniforms(0.9, 1, 5),
    )
    assert out.token_ids.tolist() == [[0, -1, -1, -1, -1]]
    _assert_no_lossy_method("fly", q.log(), [[1, 2, 3, 4]])


def test_fly_mixed_greedy_and_random_batch() -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_fly_mixed_greedy_and_random_batch.

    Temperatures ``[0, 1]``, uniforms 0.5: the greedy request emits its argmax 9 at the first
    mismatch; the sampled one rejects draft 4 (``q(4) = 0.4``) and emits 0, the residual's
    only token (FLy would accept every draft of both).
    """
    q = _probability_rows(
        [{9: 0.6, 1: 0.4}, {2: 1.0}, {3: 1.0}, {0: 0.6, 4: 0.4}, {5: 1.0}, {6: 1.0}], 10
    )
    out = verify(
        q.log(),
        torch.tensor([1, 2, 3, 4, 5, 6]),
        [3, 3],
        bonus_token_ids=torch.tensor([7, 8]),
        temperature=[0.0, 1.0],
        uniforms=_uniforms(0.5, 2, 4),
    )
    assert out.token_ids.tolist() == [[9, -1, -1, -1], [0, -1, -1, -1]]
    _assert_no_lossy_method("fly", q.log(), [[1, 2, 3], [4, 5, 6]])


_SYNTHETIC_SPEC = [[1, 2], [3]]
_SYNTHETIC_TARGETS = [[10, 20, 50], [30, 40]]


def _synthetic_case(all_greedy: bool, accept_uniform: float) -> list[list[int]]:
    """vLLM's synthetic inputs; sampled: target logits flattened so each draft has mass."""
    draft_ids, counts = _flat_drafts(_SYNTHETIC_SPEC)
    logits = _argmax_logits(_SYNTHETIC_TARGETS)
    if not all_greedy:
        logits = logits / 100.0
    out = verify(
        logits,
        draft_ids,
        counts,
        bonus_token_ids=_bonus(_SYNTHETIC_TARGETS),
        temperature=0.0 if all_greedy else 1.0,
        uniforms=_uniforms(accept_uniform, 2, 3),
    )
    _check_layout(out, draft_ids, counts, logits.shape[-1])
    _assert_no_lossy_method("synthetic", logits, _SYNTHETIC_SPEC)
    return out.token_ids.tolist()


@pytest.mark.parametrize("all_greedy", [True, False])
def test_synthetic_all_accepted(all_greedy: bool) -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_synthetic_all_accepted.

    vLLM's synthetic method accepts at given rates whatever the target; we have none
    (``method="synthetic"`` raises). Greedy verification still rejects drafts that are not
    the argmax. A forced full acceptance is what uniforms 0 give, where the target gives
    every draft mass: then vLLM's output is ours.
    """
    expected = [[10, -1, -1], [30, -1, -1]] if all_greedy else [[1, 2, 50], [3, 40, -1]]
    assert _synthetic_case(all_greedy, 0.0) == expected


@pytest.mark.parametrize("all_greedy", [True, False])
def test_synthetic_all_rejected(all_greedy: bool) -> None:
    """Mirrors vLLM tests/v1/sample/test_rejection_sampler.py::test_synthetic_all_rejected.

    A forced rejection of every first draft (uniforms ``1 - 2**-53``, greedy: drafts that
    are not the argmax) emits exactly one token per request, not its draft, then -1.
    """
    out = _synthetic_case(all_greedy, NEAR_ONE)
    for row, drafts in zip(out, _SYNTHETIC_SPEC, strict=True):
        assert row[0] not in (PLACEHOLDER, drafts[0])
        assert all(t == PLACEHOLDER for t in row[1:])


def test_placeholder_draft_token_rejected_random() -> None:
    """Mirrors vLLM
    tests/v1/sample/test_rejection_sampler.py::test_placeholder_draft_token_rejected_random.

    A placeholder draft id (-1) in a sampled request with its own generator is rejected
    (an id outside the vocabulary never passes) and the token emitted there is drawn from
    the target row, all on 7 here; the drafts before it are accepted. In strict mode the id
    raises ``ValueError`` naming ``draft_token_ids`` instead.
    """
    vocab = 100
    spec, targets = [[1, vocab - 1, PLACEHOLDER]], [[1, vocab - 1, 7, 9]]
    draft_ids, counts = _flat_drafts(spec)
    logits = _argmax_logits(targets, vocab=vocab)
    kwargs = {
        "bonus_token_ids": _bonus(targets),
        "temperature": [1.0],
        "generators": {0: torch.Generator().manual_seed(0)},
    }
    out = verify(logits, draft_ids, counts, **kwargs)  # type: ignore[arg-type]
    assert out.token_ids.tolist() == [[1, vocab - 1, 7, -1]]
    with pytest.raises(ValueError, match="draft_token_ids"):
        verify(logits, draft_ids, counts, strict=True, **kwargs)  # type: ignore[arg-type]
