"""The speculative decoding loop on tiny random Llama models (built here, never downloaded).

The target has 2 layers; the draft is a perturbed 1-layer copy of it, so acceptance is
neither 0 nor 1. Greedy outputs are compared token for token with transformers' own greedy
``generate`` (float64 models, so no near-tie can flip). Sampling is checked against the
target's exact two-token joint (first-token distribution times each first token's
conditional) by a chi-square test over cells with expected count >= 5 (the rest pooled),
and the third token (reached through a step after all drafts were accepted) against its exact
marginal; each test passes at p > 1e-5, so with seven such tests the family-wise
false-failure rate is below 1e-4.

Covers the loop's modules of :mod:`specsample.generate`: ``loop`` (the :class:`Decoder` and
its wrappers), ``run``, ``batch``, ``step``, ``verifying``, ``sampling``, ``state``,
``drafters``, ``ngram`` and ``inputs``.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")

from specsample import adapter  # noqa: E402
from specsample.generate import (  # noqa: E402
    DecodeState,
    GenerationStats,
    ModelDrafter,
    NGramDrafter,
    SamplingState,
    speculative_generate,
    target_generate,
)
from specsample.generate import verifying as verifying_module  # noqa: E402
from specsample.generate.sampling import DRAFT_STRIDE  # noqa: E402
from specsample.params import SamplingParams  # noqa: E402
from specsample.probs import processed_probs  # noqa: E402
from specsample.random import Stream, counter_uniform  # noqa: E402

VOCAB = 64
JOINT_ROWS = 40_000
JOINT_BATCH = 10_000
JOINT_ALPHA = 1e-5
JOINT_PROMPT = [1, 2, 3, 4, 5]
NGRAM_PROMPT = [10, 6, 31, 10, 6]
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17], [3, 3, 3]]


def _config(layers: int, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "initializer_range": 0.2,
        "eos_token_id": None,
        "bos_token_id": None,
        "pad_token_id": None,
    }
    values.update(overrides)
    return transformers.LlamaConfig(**values)


def make_pair(seed: int = 0, **overrides: Any) -> tuple[Any, Any]:
    """A 2-layer target and a perturbed 1-layer copy of it, in float64 and eval mode."""
    torch.manual_seed(seed)
    target = transformers.LlamaForCausalLM(_config(2, **overrides)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(3.0)
        target.model.layers[1].self_attn.o_proj.weight.mul_(0.3)
        target.model.layers[1].mlp.down_proj.weight.mul_(0.3)
    draft = transformers.LlamaForCausalLM(_config(1, **overrides)).eval()
    shared = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    draft.load_state_dict(shared)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(0.05 * parameter.std() * torch.randn_like(parameter))
    return target.double(), draft.double()


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    return make_pair()


@pytest.fixture(scope="module")
def pair32(pair: tuple[Any, Any]) -> tuple[Any, Any]:
    return copy.deepcopy(pair[0]).float(), copy.deepcopy(pair[1]).float()


def hf_greedy(model: Any, prompt: list[int], new: int) -> list[int]:
    """``transformers``' own greedy ``generate`` of exactly ``new`` tokens (batch 1, no EOS)."""
    ids = torch.tensor([prompt])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


# --------------------------------------------------------------------------- greedy


@pytest.fixture(scope="module")
def greedy_reference(pair: tuple[Any, Any]) -> list[list[int]]:
    return [hf_greedy(pair[0], p, 24) for p in PROMPTS]


def test_target_only_greedy_matches_transformers(pair, greedy_reference) -> None:
    out = target_generate(pair[0], PROMPTS, max_new_tokens=24, max_batch_size=3)
    assert out.sequences == greedy_reference
    assert out.stats.tokens == 24 * len(PROMPTS)
    assert out.stats.sequence_forwards == out.stats.tokens


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_speculative_greedy_matches_target_greedy(pair, greedy_reference, k, drafter) -> None:
    target, draft = pair
    source = ModelDrafter(draft) if drafter == "model" else NGramDrafter()
    out = speculative_generate(
        target, PROMPTS, source, k=k, max_new_tokens=24, max_batch_size=4, adaptive=False
    )
    assert out.sequences == greedy_reference
    stats = out.stats
    assert 0.0 < stats.acceptance_rate < 1.0
    assert stats.tokens == sum(len(s) for s in out.sequences)
    assert stats.sequence_forwards < stats.tokens


def test_block_greedy_and_per_request_temperature(pair, greedy_reference) -> None:
    target, draft = pair
    out = speculative_generate(target, PROMPTS, draft, k=3, method="block", max_new_tokens=24)
    assert out.sequences == greedy_reference
    temps = [0.0, 1.0, 0.0, 1.0, 0.0]
    mixed = speculative_generate(
        target, PROMPTS, draft, k=3, temperature=temps, top_k=8, max_new_tokens=24, seeds=3
    )
    for seq, ref, t in zip(mixed.sequences, greedy_reference, temps, strict=True):
        assert len(seq) == 24
        if t == 0.0:
            assert seq == ref


def test_typical_acceptance_in_the_loop(pair, greedy_reference) -> None:
    """Typical acceptance is lossy when sampling, but at temperature 0 it is greedy decoding."""
    target, draft = pair
    out = speculative_generate(target, PROMPTS, draft, k=3, method="typical", max_new_tokens=24)
    assert out.sequences == greedy_reference
    assert out.stats.method == "typical"
    runs = [
        speculative_generate(
            target,
            PROMPTS,
            draft,
            k=3,
            method="typical",
            temperature=1.0,
            max_new_tokens=24,
            seeds=5,
            adaptive=False,
        )
        for _ in range(2)
    ]
    assert runs[0].sequences == runs[1].sequences
    assert all(len(s) == 24 and max(s) < VOCAB for s in runs[0].sequences)
    assert 0.0 < runs[0].stats.acceptance_rate < 1.0


def test_long_generation_compacts_the_caches(pair, monkeypatch) -> None:
    target, draft = pair
    prompt = [[4, 9, 1]]
    reference = hf_greedy(target, prompt[0], 120)
    compactions: list[int] = []
    original = adapter.CachedLM.maybe_compact

    def spy(self: adapter.CachedLM, max_length: int) -> bool:
        done = original(self, max_length)
        if done:
            compactions.append(self.width)
        return done

    monkeypatch.setattr(adapter.CachedLM, "maybe_compact", spy)
    out = speculative_generate(target, prompt, draft, k=6, max_new_tokens=120, adaptive=False)
    assert out.sequences[0] == reference
    assert compactions, "the masked slots never triggered a compaction"


def test_eos_and_context_limits(pair, greedy_reference) -> None:
    target, draft = pair
    eos = greedy_reference[0][5]
    out = speculative_generate(target, PROMPTS, draft, k=4, max_new_tokens=24, eos_token_id=eos)
    for seq, ref in zip(out.sequences, greedy_reference, strict=True):
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert seq == ref[:cut]
    short = make_pair(max_position_embeddings=12)
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    out = speculative_generate(short[0], prompt, short[1], k=4, max_new_tokens=50)
    assert len(out.sequences[0]) == 2
    with pytest.raises(ValueError, match="context is 12"):
        speculative_generate(short[0], [list(range(12))], short[1], k=2)


def test_streaming_and_seeds(pair) -> None:
    target, draft = pair
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}

    def on_tokens(index: int, ids: list[int]) -> None:
        streamed[index].extend(ids)

    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11], [1, 2, 3, 4, 5]]
    # Fixed draft lengths: with adaptive ones the law is the same, but which numbers a
    # sequence reads depends on the lengths chosen, hence on its neighbours and timings.
    kwargs: dict[str, Any] = {"k": 3, "temperature": 1.0, "max_new_tokens": 20, "adaptive": False}
    out = speculative_generate(
        target, prompts, draft, seeds=[11, 12, 11], on_tokens=on_tokens, **kwargs
    )
    assert [streamed[i] for i in range(3)] == out.sequences
    assert out.sequences[0] == out.sequences[2]
    alone = speculative_generate(target, [prompts[1]], draft, seeds=[12], **kwargs)
    assert alone.sequences[0] == out.sequences[1]
    again = speculative_generate(target, prompts, draft, seeds=[11, 12, 11], **kwargs)
    assert again.sequences == out.sequences
    other = speculative_generate(target, prompts, draft, seeds=[13, 14, 15], **kwargs)
    assert other.sequences != out.sequences


@pytest.mark.parametrize("drafter", ["model", "ngram", None])
def test_continuous_batching_refills_places_without_changing_outputs(pair, drafter) -> None:
    """Two places, six prompts of different lengths and budgets: each finished sequence is
    replaced at once, and every output equals that prompt decoded alone (greedy and seeded)."""
    target, draft = pair
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13], [5], [4, 9, 1, 2], [3, 3], [8, 1, 6, 2, 7]]
    budgets = [9, 3, 14, 1, 6, 11]
    temps = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    finished: list[int] = []

    def run(rows: list[int], **extra: Any) -> Any:
        common: dict[str, Any] = {
            "max_new_tokens": [budgets[i] for i in rows],
            "temperature": [temps[i] for i in rows],
            "seeds": [40 + i for i in rows],
            **extra,
        }
        chosen = [prompts[i] for i in rows]
        if drafter is None:
            return target_generate(target, chosen, **common)
        source = ModelDrafter(draft) if drafter == "model" else NGramDrafter()
        return speculative_generate(target, chosen, source, k=3, adaptive=False, **common)

    def on_finish(index: int, ids: list[int]) -> None:
        finished.append(index)
        assert len(ids) == budgets[index]

    out = run(list(range(6)), max_batch_size=2, on_finish=on_finish)
    assert sorted(finished) == list(range(6)) and finished != list(range(6))
    assert [len(s) for s in out.sequences] == budgets
    assert out.stats.sequences == 6 and out.stats.tokens == sum(budgets)
    for i in range(6):
        assert run([i]).sequences[0] == out.sequences[i]


def test_adaptive_draft_lengths_keep_greedy_outputs_under_continuous_batching(
    pair, greedy_reference
) -> None:
    target, draft = pair
    for source in (ModelDrafter(draft), NGramDrafter()):
        out = speculative_generate(
            target, PROMPTS, source, k=5, max_new_tokens=24, max_batch_size=2, adaptive=True
        )
        assert out.sequences == greedy_reference
        assert out.stats.tokens == sum(len(s) for s in out.sequences)


def test_a_costless_drafter_is_searched_only_when_the_policy_would_draft(
    pair, greedy_reference, monkeypatch
) -> None:
    """With n-gram drafts the length is chosen knowing which sequences found a match: a
    step the policy would not draft for searches nothing, the others cut the proposal to
    the length chosen for the sequences that found one, and only those are observed."""
    from specsample.generate import policy as policy_module

    target, _ = pair
    searches, masks, offered, calls = [], [], [], []
    propose = NGramDrafter.propose
    choose = policy_module.DraftLengthPolicy.choose
    refine = policy_module.DraftLengthPolicy.refine
    record = policy_module.DraftLengthPolicy.record

    def counted(self: NGramDrafter, *args: Any, **kwargs: Any) -> Any:
        searches.append(args[1])
        return propose(self, *args, **kwargs)

    def every_other(self: Any, *args: Any, **kwargs: Any) -> int:
        calls.append(choose(self, *args, **kwargs))
        return 0 if len(calls) % 2 and not self.exploring else calls[-1]

    def seen(self: Any, room: Any, drafting: list[bool]) -> int:
        masks.append((list(room), list(drafting)))
        return refine(self, room, drafting)

    def noted(self: Any, *args: Any, **kwargs: Any) -> None:
        offered.append(args[4] if len(args) > 4 else kwargs.get("offered"))
        record(self, *args, **kwargs)

    monkeypatch.setattr(NGramDrafter, "propose", counted)
    monkeypatch.setattr(policy_module.DraftLengthPolicy, "choose", every_other)
    monkeypatch.setattr(policy_module.DraftLengthPolicy, "refine", seen)
    monkeypatch.setattr(policy_module.DraftLengthPolicy, "record", noted)
    out = speculative_generate(
        target, PROMPTS, NGramDrafter(), k=4, max_new_tokens=24, max_batch_size=2
    )
    assert out.sequences == greedy_reference
    assert 0 < len(searches) == len(masks) < len(calls)
    assert any(o is not None and not any(o) for o in offered)
    assert all(k <= max(room) - 1 for k, (room, _) in zip(searches, masks, strict=True))
    drafted = [o for o in offered if o is not None and any(o)]
    assert drafted, "no step drafted"
    assert any(not all(wants) for _, wants in masks), "every sequence always found a match"
    assert all(len(room) == len(wants) for room, wants in masks)


# --------------------------------------------------------------------------- exactness


def exact_joint(target: Any, prompt: list[int], **params: Any) -> torch.Tensor:
    """``P(x1 = a, x2 = b)`` under the target's processed distribution, ``[vocab, vocab]``."""
    with torch.no_grad():
        first = target(torch.tensor([prompt])).logits[0, -1:]
        second = target(torch.tensor([[*prompt, a] for a in range(VOCAB)])).logits[:, -1]

    def processed(logits: torch.Tensor) -> torch.Tensor:
        rows = logits.shape[0]
        filters = {
            name: torch.full((rows,), params[name])
            for name in ("top_k", "top_p")
            if params.get(name) is not None
        }
        temperature = torch.full((rows,), params.get("temperature", 1.0))
        return processed_probs(logits, temperature, **filters).double()

    joint = processed(first)[0].unsqueeze(1) * processed(second)
    return joint / joint.sum()


def chi_square_pvalue(sequences: list[list[int]], joint: torch.Tensor) -> float:
    pairs = torch.tensor([s[:2] for s in sequences])
    rows = pairs.shape[0]
    observed = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    observed.index_add_(0, pairs[:, 0] * VOCAB + pairs[:, 1], torch.ones(rows, dtype=torch.float64))
    expected = joint.reshape(-1) * rows
    assert observed[expected == 0].sum() == 0, "a pair of probability 0 was generated"
    big = expected >= 5
    assert int(big.sum()) >= 50, "the joint is too concentrated for a useful test"
    obs, exp = observed[big], expected[big]
    if not bool(big.all()):
        obs = torch.cat([obs, observed[~big].sum().reshape(1)])
        exp = torch.cat([exp, expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(scipy_stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


JOINT_CASES: dict[str, dict[str, Any]] = {
    "target-only": {},
    "draft-chain": {"drafter": "model", "k": 2, "method": "chain"},
    "draft-block": {"drafter": "model", "k": 2, "method": "block"},
    "ngram-chain": {"drafter": "ngram", "k": 3, "method": "chain", "prompt": NGRAM_PROMPT},
    "draft-chain-filtered": {
        "drafter": "model",
        "k": 2,
        "method": "chain",
        "temperature": 1.5,
        "top_k": 20,
        "top_p": 0.95,
    },
    "draft-block-filtered": {
        "drafter": "model",
        "k": 2,
        "method": "block",
        "temperature": 1.5,
        "top_k": 20,
        "top_p": 0.95,
    },
}


@pytest.mark.parametrize("case", list(JOINT_CASES))
def test_first_two_tokens_follow_the_target_joint(pair32, case) -> None:
    target, draft = pair32
    spec = dict(JOINT_CASES[case])
    prompt = spec.pop("prompt", JOINT_PROMPT)
    drafter = spec.pop("drafter", None)
    names = ("temperature", "top_k", "top_p")
    params: dict[str, Any] = {name: spec.pop(name) for name in names if name in spec}
    params.setdefault("temperature", 1.0)
    common: dict[str, Any] = {
        "max_new_tokens": 2,
        "max_batch_size": JOINT_BATCH,
        "seeds": list(range(JOINT_ROWS)),
        **params,
    }
    prompts = [prompt] * JOINT_ROWS
    if drafter is None:
        out = target_generate(target, prompts, **common)
    else:
        source = ModelDrafter(draft) if drafter == "model" else NGramDrafter()
        out = speculative_generate(target, prompts, source, **spec, **common)
        assert 0.0 < out.stats.acceptance_rate < 1.0
    assert all(len(s) == 2 for s in out.sequences)
    pvalue = chi_square_pvalue(out.sequences, exact_joint(target, prompt, **params))
    print(f"{case}: chi-square p = {pvalue:.4g}")
    assert pvalue > JOINT_ALPHA


def test_third_token_after_all_accepted_follows_the_target(pair32) -> None:
    """k = 1: after an accepted draft the next draft forward feeds two slots (the pending one).

    (With k = 1 block verification is the chain rule, so one test covers both.)
    """
    target, draft = pair32
    rows = JOINT_ROWS // 2
    out = speculative_generate(
        target,
        [JOINT_PROMPT] * rows,
        draft,
        k=1,
        temperature=1.0,
        max_new_tokens=3,
        max_batch_size=JOINT_BATCH,
        seeds=list(range(rows)),
    )
    counts = out.stats.accepted_counts
    assert counts[1] > rows // 4, "too few steps accepted their draft to exercise the path"
    joint = exact_joint(target, JOINT_PROMPT)
    prefixes = [[*JOINT_PROMPT, a, b] for a in range(VOCAB) for b in range(VOCAB)]
    with torch.no_grad():
        logits = target(torch.tensor(prefixes)).logits[:, -1]
    third = processed_probs(logits, torch.ones(len(prefixes))).double()
    marginal = (joint.reshape(-1, 1) * third).sum(dim=0)
    observed = torch.bincount(torch.tensor([s[2] for s in out.sequences]), minlength=VOCAB)
    expected = marginal / marginal.sum() * rows
    assert observed[expected == 0].sum() == 0
    big = expected >= 5
    obs = torch.cat([observed[big].double(), observed[~big].sum().double().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    pvalue = float(scipy_stats.chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue)
    print(f"third token: chi-square p = {pvalue:.4g}")
    assert pvalue > JOINT_ALPHA


# --------------------------------------------------------------------------- pieces


def test_ngram_proposals() -> None:
    tokens = torch.tensor(
        [
            [5, 6, 7, 8, 5, 6, 0, 0, 0, 0],
            [1, 2, 1, 2, 1, 0, 0, 0, 0, 0],
            [9, 8, 7, 0, 0, 0, 0, 0, 0, 0],
            [4, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ]
    )
    state = DecodeState(tokens, torch.tensor([6, 5, 3, 1]), 6, 10)
    proposal = NGramDrafter().propose(state, 4, None)
    assert proposal.probs is None
    assert proposal.token_ids.tolist() == [
        [7, 8, 5, 6],  # "5 6" seen at 0: what followed, then periodically
        [2, 1, 2, 1],  # "1 2 1" seen at 0
        [7, 7, 7, 7],  # no match: the last token repeated
        [4, 4, 4, 4],
    ]
    windowed = NGramDrafter(max_ngram=2, window=4).propose(state, 2, None)
    assert windowed.token_ids.tolist()[0] == [6, 6]
    with pytest.raises(ValueError, match="min_ngram"):
        NGramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(TypeError, match="window"):
        NGramDrafter(window=2.5)  # type: ignore[arg-type]


def test_greedy_sequences_without_a_match_borrow_from_the_others() -> None:
    """A greedy row whose suffix never occurred in its own tokens takes what followed it in
    another row, or in a finished sequence; a sampled row never does."""
    tokens = torch.tensor(
        [
            [9, 8, 7, 0, 0, 0, 0, 0],
            [3, 8, 7, 6, 5, 4, 0, 0],
            [1, 2, 0, 0, 0, 0, 0, 0],
        ]
    )
    state = DecodeState(tokens, torch.tensor([3, 6, 2]), 6, 10)
    cpu = torch.device("cpu")
    greedy = SamplingState.build(3, cpu, SamplingParams(temperature=[0.0, 0.0, 0.0]))
    sampled = SamplingState.build(
        3, cpu, SamplingParams(temperature=[1.0, 0.0, 0.0], seeds=[0, 1, 2])
    )
    proposal = NGramDrafter().propose(state, 3, greedy)
    assert proposal.token_ids.tolist()[0] == [6, 5, 4]  # "8 7" found in row 1
    assert proposal.token_ids.tolist()[2] == [2, 2, 2]  # "2" found nowhere else
    assert NGramDrafter().propose(state, 3, sampled).token_ids.tolist()[0] == [7, 7, 7]
    assert NGramDrafter(others=False).propose(state, 3, greedy).token_ids.tolist()[0] == [7, 7, 7]
    state.archive(state.tokens[1:2], state.lengths[1:2], 6)
    state.select(torch.tensor([0, 2]))
    state.max_length = 3
    kept = NGramDrafter().propose(state, 4, greedy.rows([0, 2]))
    assert kept.token_ids.tolist()[0] == [6, 5, 4, 4]  # from the finished row, then its end
    with pytest.raises(TypeError, match="others"):
        NGramDrafter(others=1)  # type: ignore[arg-type]


def test_stats_table_and_merge() -> None:
    a = GenerationStats("speculative", "n-gram", "chain", 2, 1, 6, 0.5, 3, 3, (1, 1, 1))
    b = GenerationStats("speculative", "n-gram", "chain", 2, 2, 4, 0.5, 2, 4, (2, 2, 0))
    merged = a.merge(b)
    assert (merged.sequences, merged.tokens, merged.steps) == (3, 10, 5)
    assert merged.accepted_counts == (3, 3, 1)
    assert merged.acceptance_by_position == pytest.approx([4 / 7, 1 / 7])
    assert merged.tokens_per_s == pytest.approx(10.0)
    table = merged.format_table()
    for label in ("tokens/s", "acceptance rate", "acceptance by position", "forwards saved"):
        assert label in table
    assert merged.as_dict()["target_forwards_saved"] == 3


def test_a_decoder_takes_parameter_objects_and_serves_many_calls(pair) -> None:
    """A Decoder's calls take SamplingParams and Callbacks: a sequence with a generator of
    its own draws from it alone, so it decodes the same in any company; the wrappers refuse
    an unknown keyword."""
    from specsample.generate import Callbacks, Decoder, TreeShape

    target, draft = pair
    decoder = Decoder(target, draft, k=3, adaptive=False)
    prompts = [[1, 2, 3], [7, 8], [5]]
    finished: list[int] = []

    def params(rows: list[int]) -> SamplingParams:
        own = {j: torch.Generator().manual_seed(70 + i) for j, i in enumerate(rows) if i != 1}
        seeds = [40 if i == 1 else None for i in rows]
        return SamplingParams(temperature=1.0, top_p=0.9, seeds=seeds, generators=own)

    out = decoder.generate(
        prompts,
        params([0, 1, 2]),
        max_new_tokens=8,
        max_batch_size=2,
        callbacks=Callbacks(on_finish=lambda index, ids: finished.append(index)),
    )
    assert sorted(finished) == [0, 1, 2]
    for i in range(3):
        alone = decoder.generate([prompts[i]], params([i]), max_new_tokens=8)
        assert alone.sequences[0] == out.sequences[i]
    with pytest.raises(TypeError, match="temprature"):
        speculative_generate(target, prompts, draft, temprature=1.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'k'"):
        target_generate(target, prompts, k=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="callbacks"):
        decoder.generate(prompts, callbacks=print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tree"):
        Decoder(target, tree=TreeShape((2,)))


def test_validation_errors(pair) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match="k must be >= 1"):
        speculative_generate(target, PROMPTS, draft, k=0)
    with pytest.raises(ValueError, match="block"):
        speculative_generate(target, PROMPTS, NGramDrafter(), method="block")
    with pytest.raises(ValueError, match="method"):
        speculative_generate(target, PROMPTS, draft, method="tree")
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        speculative_generate(target, [[1], []], draft)
    with pytest.raises(ValueError, match="outside"):
        target_generate(target, [[VOCAB]])
    with pytest.raises(TypeError, match="prompts"):
        target_generate(target, "hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drafter"):
        speculative_generate(target, PROMPTS, object())
    with pytest.raises(ValueError, match="max_new_tokens"):
        target_generate(target, PROMPTS, max_new_tokens=0)
    with pytest.raises(ValueError, match="seeds"):
        target_generate(target, PROMPTS, seeds=[1, 2])
    with pytest.raises(ValueError, match="k must be <= 64"):
        speculative_generate(target, PROMPTS, draft, k=65)
    with pytest.raises(TypeError, match="method must be a str"):
        speculative_generate(target, PROMPTS, draft, method=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_p"):
        target_generate(target, PROMPTS, temperature=1.0, top_p=[0.5, 0.5, 0.5, 0.5, 0.0])


def test_sampling_state_streams_and_processing() -> None:
    cpu = torch.device("cpu")
    positions = torch.tensor([9, 9, 10])
    state = SamplingState.build(3, cpu, SamplingParams(temperature=1.0, seeds=[4, None, 4]))
    u = state.draft_uniforms(positions, 3)
    counters = positions.unsqueeze(1) * DRAFT_STRIDE + torch.arange(3)
    assert torch.equal(
        u[[0, 2]], counter_uniform(torch.tensor([4, 4]), counters[[0, 2]], Stream.DRAFT)
    )
    assert not torch.equal(u[0], u[2])  # the next position reads a stripe of its own
    alone = SamplingState.build(1, cpu, SamplingParams(temperature=1.0, seeds=[4]))
    alone_u = alone.draft_uniforms(positions[:1], 3)
    assert torch.equal(alone_u, u[:1])
    unseeded = [
        SamplingState.build(
            n,
            cpu,
            SamplingParams(
                temperature=1.0, seeds=seeds, generator=torch.Generator().manual_seed(1)
            ),
        )
        for n, seeds in ((1, None), (3, [4, None, 4]))
    ]
    assert torch.equal(
        unseeded[0].draft_uniforms(positions[:1], 2), unseeded[1].draft_uniforms(positions, 2)[1:2]
    )
    mixed = SamplingState.build(
        2, cpu, SamplingParams(temperature=[0.0, 0.5], top_k=[0, 2], seeds=[None, 3])
    )
    logits = torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(0))
    expected = processed_probs(
        logits.reshape(6, VOCAB),
        torch.tensor([0.0] * 3 + [0.5] * 3),
        top_k=torch.tensor([0] * 3 + [2] * 3),
    )
    assert torch.equal(mixed.probs(logits), expected.reshape(2, 3, VOCAB))
    kept = mixed.rows([1])
    assert kept.metadata.inv_temperature.tolist() == [2.0] and kept.seeds == [3]
    assert kept.seeding.seeds is not None and kept.seeding.seeds.tolist() == [3]


def test_selected_rows_equal_a_state_built_for_them_alone() -> None:
    """Rows selected from a call's state (validated once) carry the parameters, host hints,
    unused filters and random sources a state built for those rows alone has."""
    cpu = torch.device("cpu")
    params = {
        "temperature": [0.0, 0.7, 0.0, 1.0, 0.0],
        "top_k": [5, 0, 3, 0, 0],
        "top_p": [0.5, 1.0, 1.0, 0.9, 1.0],
        "min_p": [0.0, 0.0, 0.2, 0.0, 0.0],
        "seeds": [None, 8, 9, None, None],
    }
    generator = torch.Generator().manual_seed(3)
    call = SamplingState.build(5, cpu, SamplingParams(generators={3: generator}, **params))
    for rows in ([0, 2], [0, 2, 4], [1, 3], [4, 3, 1, 0], [3], []):
        chosen = {name: [values[i] for i in rows] for name, values in params.items()}
        own = {j: generator for j, i in enumerate(rows) if i == 3}
        alone = SamplingState.build(len(rows), cpu, SamplingParams(generators=own, **chosen))
        kept = call.rows(rows)
        assert kept.seeds == alone.seeds
        got, want = kept.metadata, alone.metadata
        assert (got.all_greedy, got.any_greedy, got.max_top_k) == (
            want.all_greedy,
            want.any_greedy,
            want.max_top_k,
        )
        for name in ("inv_temperature", "greedy", "top_k", "top_p", "min_p"):
            mine, theirs = getattr(got, name), getattr(want, name)
            assert (mine is None) == (theirs is None), (rows, name)
            assert mine is None or torch.equal(mine, theirs), (rows, name)
        for name in ("seeds", "shared_rows", "seeded"):
            mine, theirs = getattr(kept.seeding, name), getattr(alone.seeding, name)
            assert (mine is None) == (theirs is None), (rows, name)
            assert mine is None or torch.equal(mine, theirs), (rows, name)
        assert kept.seeding.generators == alone.seeding.generators
        assert kept.rows(list(range(len(rows)))[::-1]).seeds == alone.seeds[::-1]


def test_loop_keys_randomness_by_absolute_position(pair, monkeypatch) -> None:
    target, draft = pair
    seen: list[list[int]] = []

    verify = verifying_module.verify

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["requests"].positions.tolist())
        return verify(*args, **kwargs)

    monkeypatch.setattr(verifying_module, "verify", spy)
    out = speculative_generate(
        target, [[1, 2, 3], [4]], draft, k=2, temperature=1.0, max_new_tokens=6, seeds=1
    )
    assert seen[0] == [3, 1]  # the first draft's position: the prompt lengths
    both = [step for step in seen if len(step) == 2]
    for before, after in itertools.pairwise(both):
        assert after[0] > before[0] and after[1] > before[1]
    assert [len(s) for s in out.sequences] == [6, 6]


def test_masked_cache_check(pair) -> None:
    adapter.check_masked_cache(pair[0])

    class IgnoresPositions(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.inner = model
            self.config = model.config

        def forward(
            self, input_ids: Any, position_ids: Any = None, cache: Any = None, **kwargs: Any
        ) -> Any:
            return self.inner(input_ids=input_ids, cache=cache, **kwargs)

    with pytest.raises(ValueError, match="does not honour"):
        adapter.check_masked_cache(IgnoresPositions(pair[0]))
    with pytest.raises(ValueError, match="the draft model does not honour"):
        speculative_generate(pair[0], [[1, 2]], IgnoresPositions(pair[1]))


# --------------------------------------------------------------------------- forward compatibility


class _CacheKeyword(torch.nn.Module):
    """A causal LM whose forward takes its KV cache under one keyword, recording each use.

    The cache is handed on to the wrapped model under the keyword the installed
    ``transformers`` expects, so the wrapper runs on every version.
    """

    keyword = ""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config
        self.inner_keyword = adapter.cache_argument(inspect.signature(model.forward).parameters)
        self.seen: list[str] = []

    def run(self, cache: Any, kwargs: dict[str, Any]) -> Any:
        assert not {"cache", "past_key_values"} & set(kwargs), "the cache came twice"
        if cache is not None:
            self.seen.append(self.keyword)
        return self.inner(**kwargs, **{self.inner_keyword: cache})


class _TakesCache(_CacheKeyword):
    keyword = "cache"

    def forward(self, input_ids: Any, cache: Any = None, **kwargs: Any) -> Any:
        return self.run(cache, {"input_ids": input_ids, **kwargs})


class _TakesPastKeyValues(_CacheKeyword):
    keyword = "past_key_values"

    def forward(self, input_ids: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        return self.run(past_key_values, {"input_ids": input_ids, **kwargs})


@pytest.mark.parametrize("wrapper", [_TakesCache, _TakesPastKeyValues])
def test_the_cache_goes_by_the_keyword_the_forward_names(pair, greedy_reference, wrapper) -> None:
    """transformers 5 names the cache ``cache=``; earlier versions ``past_key_values=``."""
    target, draft = wrapper(pair[0]), wrapper(pair[1])
    out = speculative_generate(target, PROMPTS[:2], draft, k=3, max_new_tokens=24)
    assert out.sequences == greedy_reference[:2]
    assert set(target.seen) == {wrapper.keyword} and set(draft.seen) == {wrapper.keyword}


def test_no_cache_deprecation_warning_on_the_installed_transformers(pair) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        speculative_generate(pair[0], [[1, 2, 3]], pair[1], k=2, max_new_tokens=6)
    assert not [w for w in caught if "past_key_values" in str(w.message)]


# --------------------------------------------------------------------------- draft vocabulary


def test_a_draft_with_a_smaller_vocabulary_is_refused_before_it_runs(pair) -> None:
    torch.manual_seed(1)
    small = transformers.LlamaForCausalLM(_config(1, vocab_size=VOCAB - 8)).eval().double()
    calls: list[int] = []
    small.register_forward_hook(lambda *args: calls.append(1))
    message = f"vocabulary has {VOCAB - 8} tokens but the target's has {VOCAB}"
    with pytest.raises(ValueError, match=message):
        speculative_generate(pair[0], [[1, 2, VOCAB - 1]], small, k=2)
    assert calls == []
    with pytest.raises(ValueError, match=message):
        speculative_generate(pair[0], [[1, 2]], ModelDrafter(small), k=2)


def test_a_draft_with_a_larger_vocabulary_proposes_target_tokens_only(
    pair, greedy_reference
) -> None:
    """Extra draft logits (a padded embedding table) are dropped: the output is unchanged."""
    torch.manual_seed(1)
    big = transformers.LlamaForCausalLM(_config(1, vocab_size=VOCAB + 8)).eval().double()
    out = speculative_generate(pair[0], PROMPTS[:2], big, k=3, max_new_tokens=24)
    assert out.sequences == greedy_reference[:2]
    sampled = speculative_generate(
        pair[0], PROMPTS[:2], big, k=3, temperature=1.0, max_new_tokens=24, seeds=2
    )
    assert all(max(s) < VOCAB for s in sampled.sequences)


def test_import_without_transformers() -> None:
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import specsample, specsample.generate, specsample.cli\n"
        "from specsample.generate import NGramDrafter\n"
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
