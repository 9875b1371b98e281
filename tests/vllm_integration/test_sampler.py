"""Contract tests of :mod:`specsample.integrations.vllm.sampler` on vLLM's own objects.

The batches are vLLM's ``SpecDecodeMetadata`` and ``SamplingMetadata`` (built by
:mod:`specsample.integrations.vllm.testing` as vLLM's input batch builds them), the bonus
tokens are drawn by vLLM's ``Sampler``, and the output is checked against vLLM's
conventions: ``SamplerOutput``, int32 ``[batch, max_spec_len + 1]``, ``-1`` placeholders.

The statistical tests use the project's harness (:mod:`specsample.testing`) as
``tests/test_logits_exactness.py`` does: raw logits tables ``L [k + 1, vocab, vocab]``
(position, previous token), a family whose target is vLLM's own processed distribution
(temperature, then vLLM's top-k/top-p function), and an adapter that lays each simulated
sequence out as one vLLM request. Every case simulates ``ROWS = 100_000`` sequences with
``k = 3`` drafts over 8 tokens; the harness's ``k + 3`` tests share a false-failure rate of
``ALPHA = 1e-4`` (Bonferroni), and each case states the smallest total variation at output
position 0 it detects with probability 99%.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
from vllm.v1.sample.sampler import Sampler

from specsample.integrations.vllm.sampler import (
    SpecsampleRejectionSampler,
    exact_method,
)
from specsample.integrations.vllm.testing import sampling_metadata, spec_metadata
from specsample.testing import ExactnessReport, Family, exactness_report
from tests.test_logits_exactness import (
    ALPHA,
    ROWS,
    START,
    VOCAB,
    _assert_positions,
    _one_hot_acceptance,
    _raw_rows,
    _tables,
)

Params = dict[str, Any]
Adapter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _sampler(method: str = "chain", logprobs_mode: str = "raw_logprobs") -> Any:
    return SpecsampleRejectionSampler(Sampler(logprobs_mode), method=method, backend="torch")


def _vllm_probs(logits: torch.Tensor, params: Params) -> torch.Tensor:
    """vLLM's processed distribution of each row: temperature, then its top-k/top-p."""
    rows = logits.shape[0]
    top_k = params.get("top_k")
    top_p = params.get("top_p")
    scaled = logits.to(torch.float32) / params["temperature"]
    masked = apply_top_k_top_p_pytorch(
        scaled,
        None if top_k is None else torch.full((rows,), top_k, dtype=torch.int32),
        None if top_p is None else torch.full((rows,), top_p),
    )
    return torch.softmax(masked, dim=-1)


def _family(name: str, logits: torch.Tensor, draft: torch.Tensor, params: Params) -> Family:
    target = _vllm_probs(logits.reshape(-1, VOCAB), params).view(logits.shape)
    return Family(name, target, draft, start=START)


def _generators(rows: int, every: int, used: list[int]) -> dict[int, torch.Generator]:
    """A fresh generator for every ``every``-th request (none when ``every`` is 0)."""
    if not every:
        return {}
    out = {i: torch.Generator().manual_seed(used[0] + i) for i in range(0, rows, every)}
    used[0] += rows
    return out


def vllm_verifier(
    sampler: Any,
    logits: torch.Tensor,
    params: Params,
    *,
    one_hot: bool = False,
    seeded_every: int = 0,
    greedy_checked: list[int] | None = None,
) -> Adapter:
    """The vLLM sampler behind the harness's signature: one vLLM request per sequence.

    The harness's target rows and bonus token are ignored: each request's raw logits rows
    are rebuilt from its contexts, the bonus row being ``L[k, x_{k-1}]``, so vLLM's
    ``Sampler`` draws the bonus token itself. ``one_hot`` passes no draft probabilities
    (n-gram drafts); ``seeded_every`` gives every such request its own generator;
    ``greedy_checked`` adds a greedy copy after every request, checks it against the argmax
    oracle and counts it there.
    """
    used = [0]

    def verifier(
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        del target_probs, bonus_token_ids
        rows = draft_token_ids.shape[0]
        raw, ids, probs = _raw_rows(logits, draft_token_ids), draft_token_ids, draft_probs
        temperature = [params["temperature"]] * rows
        copies = 1 if greedy_checked is None else 2
        if copies == 2:
            raw, ids, probs = (torch.repeat_interleave(t, 2, dim=0) for t in (raw, ids, probs))
            temperature = [params["temperature"], 0.0] * rows
        batch = rows * copies
        metadata = spec_metadata(ids.tolist())
        batch_params = sampling_metadata(
            temperature,
            vocab=VOCAB,
            top_k=None if "top_k" not in params else [params["top_k"]] * batch,
            top_p=None if "top_p" not in params else [params["top_p"]] * batch,
            generators=_generators(batch, seeded_every, used),
        )
        out = sampler(
            metadata,
            None if one_hot else probs.reshape(-1, VOCAB),
            raw.reshape(-1, VOCAB),
            batch_params,
        ).sampled_token_ids.to(torch.int64)
        if greedy_checked is not None:
            _check_greedy(out[1::2], raw[1::2], ids[1::2])
            greedy_checked.append(rows)
        return out[0::copies]

    return verifier


def _greedy_expected(raw: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    """The argmax oracle: accept while the draft is its row's argmax, then emit the argmax."""
    k = draft_token_ids.shape[1]
    argmax = raw.argmax(dim=-1)
    accepted = (draft_token_ids == argmax[:, :k]).to(torch.int64).cumprod(dim=1).sum(dim=1)
    return torch.where(torch.arange(k + 1) <= accepted.unsqueeze(-1), argmax, -1)


def _check_greedy(out: torch.Tensor, raw: torch.Tensor, draft_token_ids: torch.Tensor) -> None:
    assert torch.equal(out, _greedy_expected(raw, draft_token_ids))


def _case(
    seed: int, params: Params, *, method: str = "chain", **adapter: Any
) -> tuple[ExactnessReport, Family]:
    logits, draft = _tables(seed)
    if adapter.get("one_hot"):
        draft = torch.nn.functional.one_hot(draft.argmax(dim=-1), VOCAB).to(torch.float32)
    family = _family(f"vllm-{method}", logits, draft, params)
    verifier = vllm_verifier(_sampler(method), logits, params, **adapter)
    return exactness_report(verifier, family, rows=ROWS, seed=seed, rule=method), family


@pytest.mark.slow
def test_sampled_rows_follow_the_target() -> None:
    """T = 0.8, draft probabilities. False-failure rate <= 1e-4; TV >= 0.0123 at position 0
    detected with prob. >= 99%."""
    report, _ = _case(11, {"temperature": 0.8})
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0123


@pytest.mark.slow
def test_top_k_top_p_with_per_request_generators() -> None:
    """T = 1.0, top-k 5 and top-p 0.9 (vLLM's meaning), every third request seeded by its
    own generator. False-failure rate <= 1e-4; TV >= 0.0123 at position 0 detected with
    prob. >= 99%; a token outside vLLM's top-k/top-p fails deterministically."""
    report, _ = _case(12, {"temperature": 1.0, "top_k": 5, "top_p": 0.9}, seeded_every=3)
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0123


@pytest.mark.slow
def test_mixed_greedy_and_sampled_batch() -> None:
    """A greedy copy after every request (temperature 0 in vLLM's batch): the greedy rows
    equal the argmax oracle token for token; the sampled rows (T = 0.9, top-k 4) pass the
    harness. False-failure rate <= 1e-4; TV >= 0.0115 at position 0 detected with prob.
    >= 99%."""
    checked: list[int] = []
    report, _ = _case(13, {"temperature": 0.9, "top_k": 4}, greedy_checked=checked)
    assert report.passed(ALPHA), str(report)
    assert sum(checked) == ROWS
    assert report.detectable_tv(0, ALPHA) <= 0.0115


@pytest.mark.slow
def test_block_verification() -> None:
    """vLLM's ``rejection_sample_method="block"`` runs specsample's block rule: exact too.
    T = 1.0, top-p 0.95. False-failure rate <= 1e-4; TV >= 0.0123 at position 0 detected
    with prob. >= 99%."""
    report, _ = _case(14, {"temperature": 1.0, "top_p": 0.95}, method="block")
    assert report.passed(ALPHA), str(report)
    assert report.detectable_tv(0, ALPHA) <= 0.0123


@pytest.mark.slow
def test_drafts_without_probabilities() -> None:
    """n-gram drafts (``draft_probs=None``): one-hot drafts accepted with probability
    ``q(x)``. The harness's chi-square tests at their Bonferroni levels, acceptance z-scores
    recomputed for the one-hot rule. False-failure rate <= 1e-4; TV >= 0.0123 at position 0
    detected with prob. >= 99%."""
    report, family = _case(15, {"temperature": 1.0}, one_hot=True)
    _assert_positions(report)
    rate, mean, variance = _one_hot_acceptance(family)
    z_max = report.z_threshold(ALPHA)
    z_rate = (report.acceptance_rate - rate) / math.sqrt(rate * (1 - rate) / ROWS)
    z_mean = (report.mean_accepted - mean) / math.sqrt(variance / ROWS)
    assert abs(z_rate) < z_max and abs(z_mean) < z_max, (z_rate, z_mean, str(report))
    assert report.detectable_tv(0, ALPHA) <= 0.0123


def test_block_method_verifies_drafts_without_probabilities_by_the_chain_rule() -> None:
    """``method="block"`` with n-gram (or greedy draft-model) drafts, which come without
    probabilities: block verification accepts exactly as many one-hot drafts in expectation
    as the chain rule, which runs instead; the same generators give the same tokens."""
    drafts, logits = _ragged_batch(1)

    def tokens(method: str) -> list[list[int]]:
        generators = {i: torch.Generator().manual_seed(7 + i) for i in range(len(drafts))}
        batch = sampling_metadata([1.0] * len(drafts), vocab=VOCAB, generators=generators)
        out = _sampler(method)(spec_metadata(drafts), None, logits, batch)
        return out.sampled_token_ids.tolist()

    assert tokens("block") == tokens("chain")


def _ragged_batch(seed: int) -> tuple[list[list[int]], torch.Tensor]:
    """Drafts of 3, 0, 1 and 2 tokens and ``[num_tokens + batch, vocab]`` logits."""
    gen = torch.Generator().manual_seed(seed)
    drafts = [[1, 4, 2], [], [6], [0, 3]]
    rows = sum(len(d) for d in drafts) + len(drafts)
    return drafts, torch.randn(rows, VOCAB, generator=gen) * 2


def test_output_follows_vllm_conventions() -> None:
    drafts, logits = _ragged_batch(0)
    batch = sampling_metadata([0.0, 1.0, 0.7, 1.2], vocab=VOCAB)
    out = _sampler()(spec_metadata(drafts), None, logits, batch)
    assert isinstance(out, SamplerOutput)
    assert out.logprobs_tensors is None
    ids = out.sampled_token_ids
    assert ids.dtype == torch.int32 and ids.shape == (4, 4)
    for row, draft in zip(ids.tolist(), drafts, strict=True):
        emitted = [t for t in row if t != -1]
        assert row == emitted + [-1] * (4 - len(emitted))
        assert 1 <= len(emitted) <= len(draft) + 1
        assert emitted[:-1] == draft[: len(emitted) - 1]
        assert 0 <= emitted[-1] < VOCAB


def test_greedy_batch_equals_argmax_path() -> None:
    gen = torch.Generator().manual_seed(1)
    rows, k = 64, 3
    raw = torch.randn(rows, k + 1, VOCAB, generator=gen)
    ids = torch.randint(0, VOCAB, (rows, k), generator=gen)
    ids[::2] = raw[::2, :k].argmax(dim=-1)
    out = _sampler()(
        spec_metadata(ids.tolist()),
        None,
        raw.reshape(-1, VOCAB),
        sampling_metadata([0.0] * rows, vocab=VOCAB),
    )
    assert torch.equal(out.sampled_token_ids.to(torch.int64), _greedy_expected(raw, ids))


def test_allowed_token_mask_is_applied_at_draft_positions() -> None:
    """vLLM's allowed-token mask (``True`` = not allowed) holds for drafts and bonus alike."""
    drafts, logits = _ragged_batch(2)
    mask = torch.zeros(4, VOCAB, dtype=torch.bool)
    mask[:, :4] = True
    batch = sampling_metadata([0.0, 1.0, 0.5, 0.0], vocab=VOCAB, allowed_token_ids_mask=mask)
    for _ in range(20):
        ids = _sampler()(spec_metadata(drafts), None, logits.clone(), batch).sampled_token_ids
        last = ids.gather(1, ((ids != -1).sum(dim=1, keepdim=True) - 1).to(torch.int64))
        assert bool((last >= 4).all())


def _one_request_batch(index: int, others: int, seed: int) -> Any:
    """Request ``index`` of ``others + 1`` has drafts ``[2, 5]`` and a generator seeded
    ``seed``; the others are random, unseeded, with their own drafts."""
    gen = torch.Generator().manual_seed(100 + others)
    drafts = [torch.randint(0, VOCAB, (3,), generator=gen).tolist() for _ in range(others + 1)]
    drafts[index] = [2, 5]
    logits = [torch.randn(len(d) + 1, VOCAB, generator=gen) for d in drafts]
    logits[index] = torch.tensor([[0.3, -0.2, 1.1, 0.0, 0.4, 0.9, -1.0, 0.2]]).repeat(3, 1)
    batch = sampling_metadata(
        [1.0] * (others + 1),
        vocab=VOCAB,
        generators={index: torch.Generator().manual_seed(seed)},
    )
    return spec_metadata(drafts), torch.cat(logits), batch


def test_a_request_generator_gives_the_same_tokens_whatever_the_batch() -> None:
    for seed in range(10):
        alone = _sampler()(*_insert_none(_one_request_batch(0, 0, seed))).sampled_token_ids
        crowded = _sampler()(*_insert_none(_one_request_batch(3, 5, seed))).sampled_token_ids
        assert alone[0, :3].tolist() == crowded[3, :3].tolist()


def _insert_none(batch: tuple[Any, torch.Tensor, Any]) -> tuple[Any, None, torch.Tensor, Any]:
    metadata, logits, params = batch
    return metadata, None, logits, params


def test_logprobs_tensors_follow_vllm() -> None:
    """``max_num_logprobs = 2``: vLLM's ``LogprobsTensors`` over ``batch * (max_spec + 1)``
    rows; at each emitted token, its logprob is the raw target's log-softmax there."""
    drafts, logits = _ragged_batch(3)
    batch = sampling_metadata([0.0, 1.0, 0.7, 1.2], vocab=VOCAB, max_num_logprobs=2)
    metadata = spec_metadata(drafts)
    out = _sampler()(metadata, None, logits, batch)
    tensors = out.logprobs_tensors
    assert tensors is not None
    assert tensors.logprob_token_ids.shape == (16, 3) and tensors.logprobs.shape == (16, 3)
    assert tensors.selected_token_ranks.shape == (16,)
    log_q = torch.log_softmax(logits, dim=-1)
    starts = metadata.cu_num_sampled_tokens.tolist()
    for request, row in enumerate(out.sampled_token_ids.tolist()):
        first = starts[request - 1] if request else 0
        for j, token in enumerate(t for t in row if t != -1):
            flat = request * 4 + j
            assert int(tensors.logprob_token_ids[flat, 0]) == token
            assert float(tensors.logprobs[flat, 0]) == pytest.approx(
                float(log_q[first + j, token]), abs=1e-5
            )
            top = torch.topk(log_q[first + j], 2).values
            assert torch.allclose(tensors.logprobs[flat, 1:], top, atol=1e-5)


def test_raw_logprobs_ignore_processors_and_the_callers_logits_stay_unchanged() -> None:
    """The processors (here the allowed-token mask) change the rows the sampler verifies in
    place: raw logprobs still read the rows before them, and the caller's logits are never
    written, whether or not logprobs are asked for (without them no copy is kept)."""
    drafts, logits = _ragged_batch(3)
    mask = torch.zeros(4, VOCAB, dtype=torch.bool)
    mask[:, :4] = True
    given = logits.clone()
    log_q = torch.log_softmax(logits, dim=-1)
    metadata = spec_metadata(drafts)
    for logprobs in (None, 2):
        batch = sampling_metadata(
            [0.0, 1.0, 0.7, 1.2], vocab=VOCAB, allowed_token_ids_mask=mask,
            max_num_logprobs=logprobs,
        )  # fmt: skip
        out = _sampler()(metadata, None, logits, batch)
        assert torch.equal(logits, given)
        assert bool((out.sampled_token_ids[:, 0] >= 4).all())
        if logprobs is None:
            continue
        tensors = out.logprobs_tensors
        assert tensors is not None
        top = torch.topk(log_q[0], 2).values
        assert torch.allclose(tensors.logprobs[0, 1:], top, atol=1e-5)


def test_lossy_vllm_methods_stay_vllms() -> None:
    """vLLM's own flags keep their meaning: its lossy methods run vLLM's sampler."""
    for name, expected in [("standard", "chain"), ("block", "block"), ("fly", None)]:
        assert exact_method(SimpleNamespace(rejection_sample_method=name), "chain") == expected
    assert exact_method(SimpleNamespace(rejection_sample_method="synthetic"), "block") is None
    assert exact_method(SimpleNamespace(rejection_sample_method="standard"), "block") == "block"
    with pytest.raises(ValueError, match="method"):
        exact_method(None, "tree")


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSAMPLE_VLLM_METHOD", "block")
    monkeypatch.setenv("SPECSAMPLE_VLLM_BACKEND", "torch")
    sampler = SpecsampleRejectionSampler(Sampler())
    assert (sampler.method, sampler.backend) == ("block", "torch")
    assert SpecsampleRejectionSampler(Sampler(), method="chain").method == "chain"
