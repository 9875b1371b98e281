"""specsample inside a real vLLM engine: ``vllm.LLM`` on the shipped target, plugin on and off.

Engines (:data:`~tests.vllm_engine.engines.ENGINES`): no speculation; n-gram speculation
(k = 4) with vLLM's sampler (the plugin off) and with specsample's chain rule; the shipped
draft as vLLM's draft model (k = 4), drafting greedily, with the chain rule; the same draft
sampling its drafts, with the block rule.

* **Greedy.** 16 prompts x 64 tokens give, with every speculative engine, the tokens of
  vLLM without speculation.
* **Seeds.** A seeded sampled request gives the same tokens twice, and alone or at index 3
  of a batch of 8 (n-gram and greedy drafts, whose drafts are a function of the context;
  vLLM's sampled drafts come from its global generator whatever the seed). These engines
  schedule one step at a time (:data:`~tests.vllm_engine.engines.SYNC`).
* **The law of the tokens.** The first two tokens of 3000 seeded requests ``(x1, x2)``
  against their law under the target, ``q(x1 | prompt) q(x2 | prompt, x1)``, computed from
  the target by transformers with vLLM's own temperature, top-k and top-p
  (:func:`specsample.testing.joint_test`). ``x1`` is drawn by vLLM's sampler after the
  prefill, ``x2`` by the rejection sampler wherever the drafter proposed a token after
  ``x1`` (always with the draft model; with n-grams when ``x1`` occurs in the prompt, which
  the test checks for a quarter of the requests at least). Each test fails a correct
  sampler with probability 1e-3 (the seeds are fixed, so a given version passes or fails
  every time), the seven together 0.7 %; each detects, with probability 0.99, a deviation
  of total variation 0.081 to 0.089 in the law of the pair (49 to 83 degrees of freedom;
  the figure is in a failure's message).
* **Switch.** The plugin off leaves vLLM's class; on, vLLM's log says once that specsample
  verifies, with the method and backend, and the CPU kernels are ready before the first
  request.

Every test here starts an engine or shares one (10 to 40 s each): the module is ``slow``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from specsample.testing import detectable_tv, joint_test, two_token_joint
from tests.vllm_engine.engines import ENGINES, TARGET, serves_here, start_engine

pytest.importorskip("vllm")
if not serves_here():
    pytest.skip("vLLM has no platform to serve on here (its CPU build, or a GPU)",
                allow_module_level=True)  # fmt: skip

pytestmark = pytest.mark.slow

ALPHA = 1e-3
JOINT_REQUESTS = 3000
JOINT_PROMPT = (
    'def parse(text):\n    """Read the settings."""\n    for line in text.splitlines():\n'
    '        if line.startswith("#"):\n            continue\n        key, value = line'
)

NAMES = ("parse", "load", "split", "merge", "count", "scale", "clean", "fetch")
GREEDY_PROMPTS = [f"def {name}(text):\n    for line in text.splitlines():\n" for name in NAMES] + [
    f"class {name.title()}er:\n    def __init__(self, items):\n        self." for name in NAMES
]
SEEDED = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 48, "seed": 1234, "ignore_eos": True}

SAMPLINGS = {
    "t1": {"temperature": 1.0},
    "top-k": {"temperature": 1.0, "top_k": 8},
    "top-p": {"temperature": 1.0, "top_p": 0.8},
    "top-k-top-p": {"temperature": 0.8, "top_k": 20, "top_p": 0.9},
}
"""What each law test asks of vLLM (``SamplingParams`` keywords)."""

JOINTS = [
    ("ngram-chain", "t1"),
    ("ngram-chain", "top-k-top-p"),
    ("draft-chain", "t1"),
    ("draft-chain", "top-k"),
    ("draft-chain", "top-p"),
    ("draft-block", "t1"),
    ("draft-block", "top-k-top-p"),
]
"""The law tests: (engine, sampling)."""

SWAPPED = ("ngram-chain", "draft-chain", "draft-block")
SEEDED_ENGINES = ("ngram-chain", "draft-chain")
SPECSAMPLE_CLASS = "specsample.integrations.vllm.sampler.SpecsampleRejectionSampler"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TARGET)


def _jobs(name: str, encode: Callable[[str], list[int]]) -> dict[str, Any]:
    """Every job the engine ``name`` runs: greedy prompts, seeded requests, law tests."""
    greedy = {"temperature": 0.0, "max_tokens": 64, "ignore_eos": True}
    jobs = {"greedy": {"prompts": [encode(p) for p in GREEDY_PROMPTS], "params": [greedy] * 16}}
    if name in SEEDED_ENGINES:
        alone = {"prompts": [encode(GREEDY_PROMPTS[3])], "params": [SEEDED]}
        batch = [{**SEEDED, "seed": seed} for seed in range(8)]
        batch[3] = SEEDED
        prompts = [encode(p) for p in GREEDY_PROMPTS[:8]]
        jobs |= {"alone": alone, "again": alone, "batch": {"prompts": prompts, "params": batch}}
    prompt = encode(JOINT_PROMPT)
    for engine, sampling in JOINTS:
        if engine == name:
            params = [{**SAMPLINGS[sampling], "max_tokens": 2, "seed": seed, "ignore_eos": True}
                      for seed in range(JOINT_REQUESTS)]  # fmt: skip
            jobs[sampling] = {"prompts": [prompt] * JOINT_REQUESTS, "params": params}
    return jobs


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
) -> Callable[[str], dict[str, Any]]:
    """``engine(name)``: the results of the engine ``name``'s jobs, started once."""
    folder: Path = tmp_path_factory.mktemp("engines")
    started: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in started:
            started[name] = start_engine(name, _jobs(name, tokenizer.encode), folder)
        return started[name]

    return get


class _PrefixCached:
    """The target for :func:`two_token_joint`: the prompt's keys and values computed once,
    then one token per continuation row; each chunk's logits kept for the next law."""

    def __init__(self, model: Any, prompt: list[int]) -> None:
        out = model(torch.tensor([prompt]), use_cache=True)
        self.model, self.length, self.cache = model, len(prompt), out.past_key_values
        self.first = out.logits
        self.rows: dict[tuple[int, int], torch.Tensor] = {}

    def __call__(self, ids: torch.Tensor) -> SimpleNamespace:
        if ids.shape[1] == self.length:
            return SimpleNamespace(logits=self.first)
        key = (int(ids[0, -1]), ids.shape[0])
        if key not in self.rows:
            cache = copy.deepcopy(self.cache)
            cache.batch_repeat_interleave(ids.shape[0])
            self.rows[key] = self.model(ids[:, -1:], past_key_values=cache).logits
        return SimpleNamespace(logits=self.rows[key])


@pytest.fixture(scope="module")
def target(tokenizer: Any) -> _PrefixCached:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    with torch.inference_mode():
        return _PrefixCached(model, tokenizer.encode(JOINT_PROMPT))


def vllm_sampling(temperature: float, top_k: int | None = None, top_p: float | None = None
                  ) -> Callable[[torch.Tensor], torch.Tensor]:  # fmt: skip
    """Logits to the probabilities vLLM samples from: temperature, then vLLM's own top-k
    and top-p."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    def process(logits: torch.Tensor) -> torch.Tensor:
        rows = logits.shape[0]
        k = None if top_k is None else torch.full((rows,), top_k, dtype=torch.int64)
        p = None if top_p is None else torch.full((rows,), top_p, dtype=logits.dtype)
        return torch.softmax(apply_top_k_top_p(logits / temperature, k, p), -1)

    return process


def test_plugin_off_leaves_vllms_sampler(engine: Callable[[str], dict[str, Any]]) -> None:
    off = engine("ngram-vllm")
    assert off["sampler"] == "vllm.v1.sample.rejection_sampler.RejectionSampler"
    assert "specsample verifies" not in off["log"]


@pytest.mark.parametrize("name", SWAPPED)
def test_plugin_on_verifies_and_says_so(engine: Callable[[str], dict[str, Any]], name: str) -> None:
    on = engine(name)
    assert on["sampler"] == SPECSAMPLE_CLASS
    assert on["kernels_warm"], "the CPU kernels were not ready before the first request"
    method = ENGINES[name][1].get("SPECSAMPLE_VLLM_METHOD", "chain")
    lines = [line for line in on["log"].splitlines() if "specsample verifies" in line]
    assert len(lines) == 1, on["log"][-3000:]
    assert f"method {method}, backend cpu" in lines[0]


@pytest.mark.parametrize("name", ["ngram-vllm", *SWAPPED])
def test_greedy_tokens_are_vllms_without_speculation(
    engine: Callable[[str], dict[str, Any]], name: str
) -> None:
    expected = engine("plain")["jobs"]["greedy"]
    got = engine(name)["jobs"]["greedy"]
    differing = [i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b]
    assert not differing, f"prompts {differing} differ"


@pytest.mark.parametrize("name", SEEDED_ENGINES)
def test_a_seeded_request_gives_its_tokens_whatever_the_batch(
    engine: Callable[[str], dict[str, Any]], name: str
) -> None:
    jobs = engine(name)["jobs"]
    assert len(jobs["alone"][0]) == SEEDED["max_tokens"]
    assert jobs["again"] == jobs["alone"]
    assert jobs["batch"][3] == jobs["alone"][0]


@pytest.mark.parametrize(("name", "sampling"), JOINTS)
def test_first_two_tokens_follow_the_target(
    engine: Callable[[str], dict[str, Any]],
    target: _PrefixCached,
    tokenizer: Any,
    name: str,
    sampling: str,
) -> None:
    sequences = engine(name)["jobs"][sampling]
    if name.startswith("ngram"):
        prompt = set(tokenizer.encode(JOINT_PROMPT))
        drafted = sum(seq[0] in prompt for seq in sequences) / len(sequences)
        assert drafted > 0.25, f"only {drafted:.0%} of the second tokens were drafted"
    process = vllm_sampling(**SAMPLINGS[sampling])
    joint = two_token_joint(target, tokenizer.encode(JOINT_PROMPT), process=process)
    pvalue, df = joint_test(sequences, joint)
    tv = detectable_tv(len(sequences), df, ALPHA)
    assert pvalue >= ALPHA, f"p = {pvalue:.2e} (df {df}; detects TV >= {tv:.3f})"
