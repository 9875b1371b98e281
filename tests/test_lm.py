"""The cached causal LM the loop drives (:mod:`specsample.adapter.lm`), on tiny random Llamas.

Covers :mod:`specsample.adapter.lm` (:class:`CachedLM`: masked slots compacted on long
generations, the cache handed over under the keyword the model's forward names, as
:func:`specsample.adapter.config.cache_argument` reads it) and :mod:`specsample.adapter.checks`
(:func:`check_masked_cache` refuses a model that does not honour the masked cache).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from specsample import adapter
from specsample.generate import speculative_generate
from tests.tiny_llama import PROMPTS, hf_greedy


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


def test_nan_weights_are_reported_as_a_broken_model_not_as_padding(pair) -> None:
    """A model whose weights hold NaN returns NaN for the plain input too: the message says
    the model is broken and names the weight, not the padding advice."""
    import copy

    broken = copy.deepcopy(pair[1])
    name, weight = next((n, p) for n, p in broken.named_parameters() if "mlp" in n)
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(ValueError) as error:
        adapter.check_masked_cache(broken, role="draft")
    message = str(error.value)
    assert message.startswith("the draft model returns NaN logits for a plain input")
    assert f"the model itself is broken, its weights hold NaN or infinity (the first: {name})" in (
        message
    )
    assert "left-padded" not in message and "sdpa" not in message
