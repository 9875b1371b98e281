"""The decoding loop (:mod:`specsample.generate.decoder`) on tiny random Llama models.

Covers :mod:`specsample.generate.decoder` (:class:`Decoder`, :func:`speculative_generate`,
:func:`target_generate`) and the pieces it runs: :mod:`specsample.generate.config` (one call's
configuration and callbacks), :mod:`specsample.generate.loop` (the steps, and when a costless
drafter is searched), :mod:`specsample.generate.verifying` (the verification calls, keyed by
absolute position) and :mod:`specsample.generate.inputs` (the validation of the arguments).

Greedy outputs are compared token for token with transformers' own greedy ``generate``
(float64 models, so no near-tie can flip); seeded sampled outputs with each other. The law of
sampled outputs is tested in ``tests/test_generate.py``, continuous batching in
``tests/test_batch.py``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from specsample.generate import (
    ModelDrafter,
    NGramDrafter,
    speculative_generate,
    target_generate,
)
from specsample.generate import verifying as verifying_module
from specsample.params import SamplingParams
from tests.tiny_llama import PROMPTS, VOCAB, make_pair


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
    with pytest.raises(ValueError, match=r"k must be in \[1, 64\], got 0"):
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
    with pytest.raises(ValueError, match=r"k must be in \[1, 64\]"):
        speculative_generate(target, PROMPTS, draft, k=65)
    with pytest.raises(TypeError, match="method must be a str"):
        speculative_generate(target, PROMPTS, draft, method=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_p"):
        target_generate(target, PROMPTS, temperature=1.0, top_p=[0.5, 0.5, 0.5, 0.5, 0.0])


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
