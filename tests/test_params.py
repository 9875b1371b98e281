"""The parameter objects (:mod:`specsample.params`) and how :func:`specsample.verify` takes
them (:mod:`specsample.api.options`): one validated :class:`Requests` gives the tokens the
same keywords give, step after step, and the two forms do not mix.

Also covers the PyTorch backend's typical-acceptance step on logits
(:mod:`specsample.backends.lossy`).
"""

from __future__ import annotations

import pytest
import torch

from specsample import BatchLayout, Requests, SamplingParams, verify
from specsample.probs import processed_probs
from specsample.rules.typical import typical_acceptance

CPU = torch.device("cpu")


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Logits of a ragged batch of three requests with 3, 0 and 2 drafts, vocabulary 7."""
    gen = torch.Generator().manual_seed(seed)
    counts = [3, 0, 2]
    logits = torch.randn(sum(counts) + len(counts), 7, generator=gen) * 2
    ids = torch.randint(0, 7, (sum(counts),), generator=gen)
    return logits, ids, counts


PARAMS = {"temperature": [0.0, 0.9, 1.3], "top_k": [0, 3, 5], "seeds": [11, 12, 13]}


@pytest.mark.parametrize("method", ["chain", "typical"])
def test_requests_give_the_tokens_of_the_keywords(method: str) -> None:
    logits, ids, counts = _batch()
    requests = Requests.build(3, CPU, SamplingParams(**PARAMS))  # type: ignore[arg-type]
    layout = BatchLayout.build(counts, CPU)
    for position in (0, 5, 40):
        by_keywords = verify(logits, ids, counts, method=method, positions=[position] * 3, **PARAMS)
        moved = requests.at(torch.full((3,), position))
        by_object = verify(logits, ids, layout, method=method, requests=moved)
        assert torch.equal(by_keywords.token_ids, by_object.token_ids)
        assert torch.equal(by_keywords.num_accepted, by_object.num_accepted)


def test_positions_move_given_requests() -> None:
    logits, ids, counts = _batch(1)
    requests = Requests.build(3, CPU, SamplingParams(**PARAMS))  # type: ignore[arg-type]
    moved = verify(logits, ids, counts, requests=requests, positions=[7, 7, 7])
    direct = verify(logits, ids, counts, requests=requests.at(torch.full((3,), 7)))
    assert torch.equal(moved.token_ids, direct.token_ids)


def test_requests_and_sampling_keywords_do_not_mix() -> None:
    logits, ids, counts = _batch()
    requests = Requests.build(3, CPU)
    with pytest.raises(ValueError, match="not both"):
        verify(logits, ids, counts, requests=requests, temperature=0.5)
    with pytest.raises(ValueError, match="requests has 2 requests"):
        verify(logits, ids, counts, requests=Requests.build(2, CPU))
    with pytest.raises(TypeError, match="requests must be a Requests"):
        verify(logits, ids, counts, requests=SamplingParams())  # type: ignore[arg-type]


def test_unknown_keyword_is_named() -> None:
    logits, ids, counts = _batch()
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        verify(logits, ids, counts, temprature=0.5)  # type: ignore[call-arg]


def test_bad_sampling_params_are_named_when_built() -> None:
    with pytest.raises(ValueError, match="top_p"):
        Requests.build(2, CPU, SamplingParams(top_p=[0.5, 1.5]))
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        Requests.build(2, CPU, {"temperature": 1.0})  # type: ignore[arg-type]


def test_a_given_layout_must_match_the_bonus_rows() -> None:
    logits, ids, counts = _batch()
    layout = BatchLayout.build(counts, CPU, bonus_rows=False)
    with pytest.raises(ValueError, match="bonus rows"):
        verify(logits, ids, layout)


def test_typical_step_is_the_rule_on_processed_rows() -> None:
    """Through :func:`verify`, typical acceptance equals the rule on each request's
    processed ``[k + 1, vocab]`` rows (greedy rows one-hot), request by request."""
    logits, ids, counts = _batch(2)
    out = verify(logits, ids, counts, method="typical", temperature=[0.0, 0.9, 1.3])
    start, drafted = 0, 0
    for i, (n, t) in enumerate(zip(counts, [0.0, 0.9, 1.3], strict=True)):
        rows = logits[start : start + n + 1]
        probs = processed_probs(rows, torch.full((n + 1,), t))
        alone = typical_acceptance(probs.unsqueeze(0), ids[drafted : drafted + n].unsqueeze(0))
        assert out.num_accepted[i] == alone.num_accepted[0]
        assert torch.equal(out.token_ids[i, : n + 1], alone.token_ids[0])
        assert bool((out.token_ids[i, n + 1 :] == -1).all())
        start, drafted = start + n + 1, drafted + n


def test_typical_needs_the_bonus_rows() -> None:
    logits, ids, counts = _batch()
    drafts_only = logits[[0, 1, 2, 4, 5]]
    with pytest.raises(ValueError, match="method='typical' needs the bonus rows"):
        verify(drafts_only, ids, counts, method="typical", bonus_token_ids=torch.zeros(3).long())


def test_typical_logprobs_draw_no_random_numbers() -> None:
    """Log-probabilities of a typical step are ``log q`` at the emitted tokens, and reading
    them leaves the shared generator untouched (the rule draws nothing)."""
    logits, ids, counts = _batch(3)
    generator = torch.Generator().manual_seed(5)
    before = generator.get_state()
    temps = [0.7, 0.9, 1.3]
    out = verify(
        logits,
        ids,
        counts,
        method="typical",
        temperature=temps,
        generator=generator,
        return_logprobs=True,
    )
    assert torch.equal(generator.get_state(), before)
    assert out.logprobs is not None
    start = 0
    for i, (n, t) in enumerate(zip(counts, temps, strict=True)):
        probs = processed_probs(logits[start : start + n + 1], torch.full((n + 1,), t))
        emitted = out.token_ids[i, : int(out.num_accepted[i]) + 1]
        expected = probs[torch.arange(emitted.numel()), emitted].log()
        torch.testing.assert_close(out.logprobs[i, : emitted.numel()], expected)
        start += n + 1
    with pytest.raises(ValueError, match="uniforms"):
        verify(
            logits, ids, counts, method="typical", uniforms=torch.zeros(3, 4, dtype=torch.float64)
        )
