"""The decoding loop across transformers architectures, on tiny random models built here.

Every family in :data:`FAMILIES` is built from its own ``transformers`` config (2 layers,
hidden 32, 4 heads, 2 key/value heads where the architecture has them, vocabulary
:data:`VOCAB`), seeded, in float64 (so that no near-tie between two logits can flip an
argmax between batch shapes). The windowed families (Mistral, Qwen2 and Phi-3 with a window,
Gemma 2 and 3, GPT-Neo's local layers) get a window of :data:`WINDOW` positions, shorter than
every generated sequence, so the window really slides; the hybrid ones (Gemma 2 and 3, Qwen2
with ``max_window_layers``) have one sliding and one full layer.

Greedy (temperature 0), for every family:

* as the target, with a draft model of its own family (a perturbed copy) and with an
  :class:`NGramDrafter`, ``k = 3``, three ragged prompts in two places (so a prompt joins a
  batch mid-sequence and rejected drafts leave masked slots), fixed and adaptive draft
  lengths: the speculative output equals :func:`target_generate`'s, and both equal
  ``transformers``' own greedy ``generate`` run prompt by prompt;
* as the draft: drafting for a tiny Llama target, the output equals that target's greedy
  output; drafting for itself, the output equals its own greedy output and every draft is
  accepted, which holds only if the draft's cache computes exactly what the target's does;
* the references are worth matching: no greedy continuation collapses into a repeated
  token, and for a windowed family each differs from that of the same weights without the
  window.

A family is either served (the default) or, where the table says so (GPT-Neo's local
layers, whose window counts cache slots), may instead be refused: by a one-line
``ValueError`` naming the layer type, raised before any token is generated. A served family
that raises fails, with the message.

Temperature 1: the two-token joint law of speculative output is tested against the target's
exact joint for one sliding-window family and one hybrid family (see
:func:`test_two_token_joint_follows_the_target`).

False failures and power of the temperature-1 test: each chi-square test runs at level
``JOINT_ALPHA = 1e-5`` (two families: a false-failure rate of 2e-5 together), and the
smallest total variation of the joint it detects with probability 0.99 is printed and
asserted to be at most ``MAX_DETECTABLE_TV = 0.06`` (and below the window's own effect).
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample.generate import (  # noqa: E402
    GenerationOutput,
    ModelDrafter,
    NGramDrafter,
    speculative_generate,
    target_generate,
)
from specsample.testing import detectable_tv, joint_test, two_token_joint  # noqa: E402
from tests.tiny_llama import hf_greedy as transformers_greedy  # noqa: E402

VOCAB = 128
HIDDEN = 32
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
INTERMEDIATE = 64
POSITIONS = 128
WINDOW = 8
INIT = 0.6  # weights' spread: peaked, context-dependent logits
MIN_DISTINCT = 10  # fewest distinct tokens in a greedy reference (no collapsed continuation)
K = 3
PROMPTS = [
    [5, 17, 33, 5, 17, 33, 5],
    [90, 12, 64, 3, 77, 12, 64, 3, 41, 90],
    [101, 7, 7, 58, 101, 7],
]
NEW_TOKENS = [24, 28, 25]
BATCH = 2
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Family:
    """One architecture's tiny config and what the loop is expected to do with it.

    Attributes
    ----------
    name : str
        The test id.
    model_type : str
        ``transformers``' model type (the key of ``AutoConfig.for_model``).
    config : dict
        Config keyword arguments (the architecture's own names for the sizes).
    attn : str
        Attention implementation (``"eager"`` where the architecture needs it).
    load : dict
        Further ``from_config`` keyword arguments.
    served : bool
        Whether the loop must serve it; ``False`` allows a one-line ``ValueError`` naming
        ``feature`` instead (never a wrong output).
    feature : str or None
        The layer type or feature a refusal must name (``None``: any refusal fails).
    layer_types : tuple of str
        Attention layer types the config must hold (hybrid families hold both).
    window : int or None
        The sliding window the config must hold.
    seed : int
        Seed of the target's weights (one whose greedy continuations of :data:`PROMPTS` do
        not collapse into repeating one token).
    """

    name: str
    model_type: str
    config: dict[str, Any] = field(default_factory=dict)
    attn: str = "sdpa"
    load: dict[str, Any] = field(default_factory=dict)
    served: bool = True
    feature: str | None = None
    layer_types: tuple[str, ...] = ()
    window: int | None = None
    seed: int = 0


def _llama_like(**extra: Any) -> dict[str, Any]:
    """Tiny sizes under the Llama-style config names."""
    return {
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": POSITIONS,
        **extra,
    }


def _gpt2_like(**extra: Any) -> dict[str, Any]:
    """Tiny sizes under the GPT-2-style config names."""
    return {
        "n_embd": HIDDEN,
        "n_layer": LAYERS,
        "n_head": HEADS,
        "n_inner": INTERMEDIATE,
        "n_positions": POSITIONS,
        **extra,
    }


_NO_KV = {"num_key_value_heads": HEADS}
_HEAD_DIM = {"head_dim": HEAD_DIM}  # where the default is not hidden / heads
_MOE = {"num_experts_per_tok": 2, "num_local_experts": 4}
_EAGER_EXPERTS = {"experts_implementation": "eager"}  # grouped_mm has no float64
_GPT_NEO = {
    "hidden_size": HIDDEN,
    "num_layers": LAYERS,
    "num_heads": HEADS,
    "intermediate_size": INTERMEDIATE,
    "max_position_embeddings": POSITIONS,
    "window_size": WINDOW,
}
_SLIDING = "sliding"

FAMILIES: list[Family] = [
    # Served today: every layer sees every earlier position.
    Family("llama", "llama", _llama_like()),
    Family("qwen2", "qwen2", _llama_like()),
    Family("qwen3", "qwen3", _llama_like(**_HEAD_DIM)),
    Family(
        "qwen3-moe",
        "qwen3_moe",
        _llama_like(moe_intermediate_size=32, **_MOE),
        load=_EAGER_EXPERTS,
        seed=1,
    ),
    Family("mixtral", "mixtral", _llama_like(**_MOE), load=_EAGER_EXPERTS),
    Family("gemma", "gemma", _llama_like(**_HEAD_DIM)),
    Family("phi", "phi", _llama_like()),
    Family("phi3", "phi3", _llama_like()),
    Family("stablelm", "stablelm", _llama_like()),
    Family("olmo", "olmo", _llama_like()),
    Family("olmo2", "olmo2", _llama_like(), seed=1),
    Family("cohere", "cohere", _llama_like(), seed=1),
    Family("granite", "granite", _llama_like()),
    Family("starcoder2", "starcoder2", _llama_like(), seed=1),
    Family("smollm3", "smollm3", _llama_like(no_rope_layer_interval=2)),
    Family("gpt2", "gpt2", _gpt2_like()),
    Family("gpt-bigcode", "gpt_bigcode", _gpt2_like()),
    Family("gpt-neox", "gpt_neox", _llama_like(**_NO_KV)),
    Family("gptj", "gptj", _gpt2_like(rotary_dim=HEAD_DIM // 2)),
    Family("falcon", "falcon", _llama_like(ffn_hidden_size=INTERMEDIATE)),
    Family("opt", "opt", _llama_like(ffn_dim=INTERMEDIATE, init_std=INIT, **_NO_KV)),
    Family(
        "gpt-neo-global",
        "gpt_neo",
        {**_GPT_NEO, "attention_types": [[["global"], 2]]},
        attn="eager",  # transformers has no sdpa for GPT-Neo
    ),
    # Sliding windows, on every layer or on some.
    Family(
        "mistral-window",
        "mistral",
        _llama_like(sliding_window=WINDOW),
        feature=_SLIDING,
        layer_types=(),
        window=WINDOW,
    ),
    Family(
        "qwen2-window",
        "qwen2",
        _llama_like(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
        feature=_SLIDING,
        layer_types=(FULL, SLIDING),
        window=WINDOW,
    ),
    Family(
        "phi3-window",
        "phi3",
        _llama_like(sliding_window=WINDOW),
        feature=_SLIDING,
        window=WINDOW,
    ),
    Family(
        "gemma2",
        "gemma2",
        _llama_like(sliding_window=WINDOW, query_pre_attn_scalar=HEAD_DIM, **_HEAD_DIM),
        attn="eager",  # soft-capped attention logits: transformers has no sdpa for Gemma 2
        feature=_SLIDING,
        layer_types=(SLIDING, FULL),
        window=WINDOW,
    ),
    Family(
        "gemma3-text",
        "gemma3_text",
        _llama_like(
            sliding_window=WINDOW,
            query_pre_attn_scalar=HEAD_DIM,
            layer_types=[SLIDING, FULL],
            **_HEAD_DIM,
        ),
        feature=_SLIDING,
        layer_types=(SLIDING, FULL),
        window=WINDOW,
    ),
    # GPT-Neo's local layers: a window of cache slots; the loop may refuse them.
    Family(
        "gpt-neo-local",
        "gpt_neo",
        {**_GPT_NEO, "attention_types": [[["global", "local"], 1]]},
        attn="eager",
        served=False,
        feature="local",
        window=WINDOW,
    ),
]
BY_NAME = {family.name: family for family in FAMILIES}
FAMILY_PARAMS = [pytest.param(family, id=family.name) for family in FAMILIES]


def tiny_config(family: Family, **overrides: Any) -> Any:
    """The family's tiny config (skips the test when ``transformers`` lacks the architecture)."""
    values: dict[str, Any] = {
        "vocab_size": VOCAB,
        "initializer_range": INIT,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "tie_word_embeddings": False,
        **family.config,
        **overrides,
    }
    try:
        return transformers.AutoConfig.for_model(family.model_type, **values)
    except (KeyError, ValueError) as error:
        if family.model_type in str(error):
            pytest.skip(f"transformers {transformers.__version__} has no {family.model_type!r}")
        raise


def build(family: Family, seed: int, **overrides: Any) -> Any:
    """A tiny random causal LM of ``family``, seeded, in float64 and eval mode."""
    config = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=family.attn, **family.load
        )
    return model.to(torch.float64).eval()


def perturbed(model: Any, seed: int, scale: float = 0.05) -> Any:
    """A copy of ``model`` with seeded noise of ``scale`` times each parameter's spread."""
    copied = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copied.parameters():
            if parameter.numel() > 1:
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                parameter.add_(scale * parameter.std() * noise)
    return copied


@functools.cache
def target_of(name: str) -> Any:
    """The family's target model (of the family's seed), built once."""
    family = BY_NAME[name]
    return build(family, seed=family.seed)


@functools.cache
def draft_of(name: str) -> Any:
    """The family's draft model: the target with noise (seeded)."""
    return perturbed(target_of(name), seed=7)


def hf_greedy_of(model: Any, prompt: list[int], new: int) -> tuple[int, ...]:
    """``transformers``' own greedy ``generate`` of exactly ``new`` tokens (batch 1, no EOS)."""
    return tuple(transformers_greedy(model, prompt, new))


@functools.cache
def hf_greedy(name: str) -> tuple[tuple[int, ...], ...]:
    """The family target's greedy references: every prompt, one at a time, no padding."""
    model = target_of(name)
    return tuple(hf_greedy_of(model, p, n) for p, n in zip(PROMPTS, NEW_TOKENS, strict=True))


def served_or_refused(
    family: Family, call: Callable[..., GenerationOutput]
) -> GenerationOutput | None:
    """Run ``call``; return its output, or ``None`` for an allowed refusal.

    A ``ValueError`` is allowed only when the table says the family may be refused: it must
    then be one line naming the family's layer type or feature, raised before any token was
    generated (``call`` gets an ``on_tokens`` callback that records them). A served family
    that raises fails the test, with the message.
    """
    emitted: list[int] = []
    try:
        if family.served:
            return call()
        return call(on_tokens=lambda index, tokens: emitted.append(index))
    except ValueError as error:
        message = str(error)
        if family.served:
            pytest.fail(f"{family.name} is expected to be served, but was refused: {message}")
        assert "\n" not in message, f"refusal of {family.name} is not one line: {message!r}"
        assert family.feature is not None
        assert family.feature in message, f"refusal does not name {family.feature!r}: {message}"
        assert not emitted, f"{family.name} was refused after generating tokens"
        return None


def test_configs_have_the_intended_layers() -> None:
    """The tiny configs hold what the table says: the window, both layer types where hybrid."""
    for family in FAMILIES:
        try:
            config = tiny_config(family)
        except pytest.skip.Exception:
            continue
        if family.window is not None:
            window = getattr(config, "sliding_window", None) or config.window_size
            assert window == family.window, family.name
            assert window < min(len(p) + n for p, n in zip(PROMPTS, NEW_TOKENS, strict=True))
        else:
            assert getattr(config, "sliding_window", None) is None, family.name
        layer_types = getattr(config, "layer_types", None)
        if family.layer_types:
            assert tuple(layer_types) == family.layer_types, family.name
        elif layer_types is not None:
            assert set(layer_types) <= {FULL, SLIDING}, family.name
        if family.model_type == "gpt_neo":
            kinds = {"global"} if family.served else {"global", "local"}
            assert set(config.attention_layers) == kinds, family.name


def unwindowed(family: Family, model: Any, **overrides: Any) -> Any:
    """``model`` (of ``family``, built with ``overrides``) with the same weights and a window
    as wide as its context."""
    key = "window_size" if family.model_type == "gpt_neo" else "sliding_window"
    wide = build(family, seed=0, **{**overrides, key: POSITIONS})
    wide.load_state_dict(model.state_dict())
    return wide


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_references_exercise_the_model(family: Family) -> None:
    """The greedy references are worth matching: every continuation holds at least
    ``MIN_DISTINCT`` distinct tokens (none collapses into a repeated token), and for a
    windowed family every one differs from the continuation of the same weights without the
    window (so a loop that ignored the window, or let it see masked slots, would be caught)."""
    reference = hf_greedy(family.name)
    assert min(len(set(s)) for s in reference) >= MIN_DISTINCT
    if family.window is not None:
        wide = unwindowed(family, target_of(family.name))
        without = [
            hf_greedy_of(wide, prompt, new) for prompt, new in zip(PROMPTS, NEW_TOKENS, strict=True)
        ]
        assert all(a != b for a, b in zip(without, reference, strict=True))


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_target_greedy_matches_transformers(family: Family) -> None:
    """Target-only greedy output (two places, three ragged prompts) equals ``generate``'s."""
    target = target_of(family.name)
    out = served_or_refused(
        family,
        lambda **kw: target_generate(
            target, PROMPTS, max_new_tokens=NEW_TOKENS, max_batch_size=BATCH, **kw
        ),
    )
    if out is not None:
        assert tuple(map(tuple, out.sequences)) == hf_greedy(family.name)


@pytest.mark.parametrize(("drafter", "adaptive"), [("model", False), ("ngram", True)])
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_speculative_greedy_as_target(family: Family, drafter: str, adaptive: bool) -> None:
    """Speculative greedy output with the family as target equals ``generate``'s (and so
    target-only greedy output, see above): a draft model of its family or prompt lookup,
    ``k = 3``, three ragged prompts in two places."""
    target = target_of(family.name)
    source = draft_of(family.name) if drafter == "model" else NGramDrafter()
    out = served_or_refused(
        family,
        lambda **kw: speculative_generate(
            target,
            PROMPTS,
            source,
            k=K,
            max_new_tokens=NEW_TOKENS,
            max_batch_size=BATCH,
            adaptive=adaptive,
            **kw,
        ),
    )
    if out is None:
        return
    assert tuple(map(tuple, out.sequences)) == hf_greedy(family.name)
    if drafter == "model" and not adaptive:
        assert 0.0 < out.stats.acceptance_rate < 1.0, "no draft accepted, or none rejected"


@functools.cache
def llama_greedy() -> tuple[tuple[int, ...], ...]:
    """Target-only greedy output of the fixed Llama target."""
    out = target_generate(
        target_of("llama"), PROMPTS, max_new_tokens=NEW_TOKENS, max_batch_size=BATCH
    )
    return tuple(map(tuple, out.sequences))


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_as_draft(family: Family) -> None:
    """As a draft model: for the Llama target (adaptive draft lengths) the output is that
    target's greedy output; for itself (fixed ``k``) the output is its own greedy output and
    every draft is accepted, which holds only if the draft's masked cache computes what
    the target's does."""
    model, llama = target_of(family.name), target_of("llama")
    out = served_or_refused(
        family,
        lambda **kw: speculative_generate(
            llama,
            PROMPTS,
            model,
            k=K,
            max_new_tokens=NEW_TOKENS,
            max_batch_size=BATCH,
            adaptive=True,
            **kw,
        ),
    )
    if out is not None:
        assert tuple(map(tuple, out.sequences)) == llama_greedy()
    out = served_or_refused(
        family,
        lambda **kw: speculative_generate(
            model,
            PROMPTS,
            ModelDrafter(model),
            k=K,
            max_new_tokens=NEW_TOKENS,
            max_batch_size=BATCH,
            adaptive=False,
            **kw,
        ),
    )
    if out is not None:
        assert tuple(map(tuple, out.sequences)) == hf_greedy(family.name)
        assert out.stats.proposed > 0
        assert out.stats.acceptance_rate == 1.0


# --------------------------------------------------------------------------- temperature 1

JOINT_VOCAB = 16
JOINT_WINDOW = 3
JOINT_PROMPT = [3, 14, 1, 5, 9, 2]
JOINT_INIT = 0.4  # flatter than the greedy models: some 100 cells of the joint are tested
JOINT_SEED = 1
JOINT_ROWS = 12_000
JOINT_ALPHA = 1e-5
MAX_DETECTABLE_TV = 0.06


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "adaptive"),
    [
        pytest.param(BY_NAME["mistral-window"], False, id="mistral-window"),
        pytest.param(BY_NAME["gemma2"], True, id="gemma2"),
    ],
)
def test_two_token_joint_follows_the_target(family: Family, adaptive: bool) -> None:
    """At temperature 1, the first two tokens of speculative output follow the target's law.

    A tiny model of the family (vocabulary ``JOINT_VOCAB`` = 16) with a window of
    ``JOINT_WINDOW`` = 3 positions, shorter than the 6-token prompt so that it slides before
    the first token, drafted for by a perturbed copy (``k = 2``; fixed draft lengths for
    Mistral, adaptive for Gemma 2; budgets of 2 to 4 tokens and a quarter of the rows at a
    time, so rows finish at different steps and new rows join batches mid-sequence),
    generates ``JOINT_ROWS`` seeded sequences. Their first two tokens are tested against the
    exact joint ``q(x1) q(x2 | x1)``, computed from full forwards of the target alone (with
    ``transformers``' own window masks), by one chi-square test (cells as in
    :func:`specsample.testing.joint_test`). The test fails a correct loop with probability
    ``JOINT_ALPHA`` = 1e-5 (2e-5 for the two families); the smallest total-variation
    deviation of the joint it detects with probability 0.99 is printed and asserted to be at most
    ``MAX_DETECTABLE_TV`` = 0.06, and ignoring the window (the same weights without it) is
    asserted to move the joint by more than that.
    """
    sizes = {
        "vocab_size": JOINT_VOCAB,
        "sliding_window": JOINT_WINDOW,
        "initializer_range": JOINT_INIT,
    }
    target = build(family, seed=JOINT_SEED, **sizes)
    draft = perturbed(target, seed=3, scale=0.3)
    joint = two_token_joint(target, JOINT_PROMPT)
    without = two_token_joint(unwindowed(family, target, **sizes), JOINT_PROMPT)
    window_tv = 0.5 * float((without - joint).abs().sum())
    budgets = [2 + i % 3 for i in range(JOINT_ROWS)]
    out = served_or_refused(
        family,
        lambda **kw: speculative_generate(
            target,
            [JOINT_PROMPT] * JOINT_ROWS,
            draft,
            k=2,
            temperature=1.0,
            max_new_tokens=budgets,
            seeds=list(range(JOINT_ROWS)),
            max_batch_size=JOINT_ROWS // 4,
            adaptive=adaptive,
            **kw,
        ),
    )
    assert out is not None
    assert [len(s) for s in out.sequences] == budgets
    assert 0.0 < out.stats.acceptance_rate < 1.0
    assert out.stats.accepted_counts[0] > 0, "no step rejected its first draft"
    pvalue, df = joint_test(out.sequences, joint)
    tv = detectable_tv(JOINT_ROWS, df, JOINT_ALPHA)
    print(
        f"{family.name}: p = {pvalue:.3g} ({df} df), detects TV >= {tv:.3f}, window {window_tv:.3f}"
    )
    assert tv <= MAX_DETECTABLE_TV
    assert window_tv > tv, "the window barely matters: the test cannot tell"
    assert pvalue > JOINT_ALPHA
