"""The cache within the model's context, and attention the loop cannot honour.

Covers what the adapter reads from a model's config, :mod:`specsample.adapter.config`
(the attention window), the loop's context check, and the command's: ``specsample generate``
reads the target's context from its config alone (:func:`specsample.cli.load.context_length`)
and refuses a prompt that leaves no room in it before any weights load.

The masked rectangular cache grows by the slots of every step, accepted or not. It must never
need more slots than the model's context (``max_position_embeddings``): some models index a
fixed causal-mask buffer by slot (GPT-Neo), and every model's positions end there. Models whose
attention the loop cannot honour are refused before anything is generated, by a one-line
message naming the layer type or the cause.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from specsample import adapter  # noqa: E402
from specsample.cli import generate, main  # noqa: E402
from specsample.cli.load import context_length  # noqa: E402
from specsample.generate import (  # noqa: E402
    NGramDrafter,
    speculative_generate,
    target_generate,
)

CONTEXT = 64
PROMPTS = [list(range(3, 16)), [5, 5, 6, 1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12]]
"""Ragged prompts; the first is the 13-token prompt of a 64-position context that used to fail."""

FAMILIES: dict[str, dict[str, Any]] = {
    "gpt_neo": {
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 4,
        "attention_types": [[["global"], 2]],
        "max_position_embeddings": CONTEXT,
    },
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": CONTEXT},
    "opt": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "ffn_dim": 64,
        "word_embed_proj_dim": 32,
        "max_position_embeddings": CONTEXT,
    },
}


def _tiny(model_type: str, seed: int, **config: Any) -> Any:
    """A tiny random float64 causal LM of ``model_type`` (vocabulary 128)."""
    torch.manual_seed(seed)
    made = transformers.AutoConfig.for_model(model_type, vocab_size=128, **config)
    return transformers.AutoModelForCausalLM.from_config(made).to(torch.float64).eval()


@pytest.fixture
def widths(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int | None]]]:
    """Record ``(width, max_positions)`` of every cache after every forward."""
    seen: list[tuple[int, int | None]] = []
    forward = adapter.CachedLM.forward

    def recording(self: adapter.CachedLM, *args: Any, **kwargs: Any) -> torch.Tensor:
        logits = forward(self, *args, **kwargs)
        seen.append((self.width, self.max_positions))
        return logits

    monkeypatch.setattr(adapter.CachedLM, "forward", recording)
    yield seen


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generation_reaches_the_context_limit_without_passing_it(
    family: str, widths: list[tuple[int, int | None]]
) -> None:
    """Every prompt decodes up to the 64-position context, equal to target-only greedy output.

    With a draft model (fixed and adaptive draft lengths) and with n-gram drafts, two places
    for three prompts: neither cache ever holds more slots than its model's context, and
    target-only output equals transformers' own greedy ``generate``.
    """
    target, draft = _tiny(family, 0, **FAMILIES[family]), _tiny(family, 1, **FAMILIES[family])
    expected = target_generate(target, PROMPTS, max_new_tokens=100).sequences
    assert [len(p) + len(e) for p, e in zip(PROMPTS, expected, strict=True)] == [CONTEXT] * 3
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        ids = torch.tensor([prompt])
        theirs = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=CONTEXT - len(prompt),
            min_new_tokens=CONTEXT - len(prompt),
        )
        assert theirs[0, len(prompt) :].tolist() == tokens
    for adaptive, drafter in ((False, draft), (True, draft), (True, NGramDrafter())):
        got = speculative_generate(
            target,
            PROMPTS,
            drafter,
            k=4,
            max_new_tokens=100,
            max_batch_size=2,
            adaptive=adaptive,
        )
        assert got.sequences == expected, (adaptive, type(drafter).__name__)
    assert widths and all(width <= limit for width, limit in widths if limit is not None)


def test_gpt_neo_local_attention_is_refused_before_generating() -> None:
    """GPT-Neo's local layers window cache slots: refused at once, naming the layer type."""
    local = {**FAMILIES["gpt_neo"], "attention_types": [[["global", "local"], 1]]}
    model = _tiny("gpt_neo", 0, window_size=8, **local)
    streamed: list[int] = []
    with pytest.raises(ValueError, match="'local' attention layers") as raised:
        target_generate(model, PROMPTS, on_tokens=lambda i, ids: streamed.extend(ids))
    assert "\n" not in str(raised.value) and not streamed
    with pytest.raises(ValueError, match="draft model has 'local' attention layers"):
        speculative_generate(_tiny("gpt_neo", 1, **FAMILIES["gpt_neo"]), PROMPTS, model)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            SimpleNamespace(layer_types=["full_attention", "chunked_attention"]),
            "'chunked_attention'",
        ),
        (SimpleNamespace(layer_types=["sliding_attention"], sliding_window=None), "no positive"),
        (SimpleNamespace(sliding_window=0), "no positive sliding_window"),
    ],
)
def test_unservable_attention_layers_are_named(config: Any, message: str) -> None:
    """Layer types other than full and sliding attention, or a window of no size, are named."""
    with pytest.raises(ValueError, match=message):
        adapter.attention_window(config)


def test_qwen2_style_window_switch_off_means_full_attention() -> None:
    """A ``sliding_window`` with ``use_sliding_window=False`` is not a window at all."""
    config = SimpleNamespace(sliding_window=16, use_sliding_window=False)
    assert adapter.attention_window(config) == adapter.AttentionWindow(None, False)


def test_nan_from_padding_in_float64_eager_attention_names_the_cause() -> None:
    """Eager attention in float64 turns a padding slot into NaN: the message says so."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "llama",
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
    )
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    with pytest.raises(ValueError, match="NaN for a left-padded input even without a cache"):
        adapter.check_masked_cache(model)


LONG_PROMPT = "x = 1\n" * 400
"""About 1,600 tokens of the shipped tokenizer: more than the shipped target's 1024 positions."""

REFUSED = re.compile(
    r"specsample generate: error: argument prompt: the prompt has (\d+) tokens but the "
    r"target's context is (\d+) positions: nothing can be generated \(give at most (\d+) "
    r"tokens\)\n"
)
"""The one line a prompt too long for the context gets."""


@pytest.fixture
def no_weights_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading any model fail the test (tokenizers and configs may load)."""

    def never(*args: Any, **kwargs: Any) -> None:
        pytest.fail("a model was loaded")

    monkeypatch.setattr(adapter, "load_model", never)
    monkeypatch.setattr(generate, "load_models", never)


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    """A tiny random Llama as a GGUF file: a context of 256 positions, the shipped tokenizer."""
    files = pytest.importorskip("tests.gguf_files")
    model = files.tiny_llama()
    assert model.config.max_position_embeddings == 256
    return Path(files.write_gguf(tmp_path / "tiny.gguf", model, files.default_tokenizer_dir()))


def test_context_length_is_read_from_the_config_alone(
    tmp_path: Path, tiny_gguf: Path, no_weights_load: None
) -> None:
    """A directory holding only ``config.json`` (GPT-2 names its context ``n_positions``),
    a GGUF file's metadata, and a config that sets no context."""
    for name, config in (
        ("gpt2", transformers.AutoConfig.for_model("gpt2", n_positions=CONTEXT)),
        ("llama", transformers.AutoConfig.for_model("llama", max_position_embeddings=48)),
        ("mamba", transformers.AutoConfig.for_model("mamba")),
    ):
        config.save_pretrained(tmp_path / name)
    assert context_length(tmp_path / "gpt2") == CONTEXT
    assert context_length(tmp_path / "llama") == 48
    assert context_length(tmp_path / "mamba") is None
    assert context_length(tiny_gguf) == 256
    with pytest.raises(ValueError, match="target model path does not exist"):
        context_length(tmp_path / "nowhere")


def test_a_prompt_beyond_the_context_is_refused_before_any_model_loads(
    capsys: pytest.CaptureFixture[str], no_weights_load: None
) -> None:
    """The shipped pair: one line naming the argument, the prompt's tokens and the limit."""
    if adapter.default_pair() is None:
        pytest.fail("the default model pair is not installed")
    assert main(["generate", LONG_PROMPT]) == 1
    captured = capsys.readouterr()
    refused = REFUSED.fullmatch(captured.err)
    assert refused is not None, captured.err
    tokens, context, most = (int(group) for group in refused.groups())
    assert tokens > context == 1024 and most == 1023 and captured.out == ""


def test_a_gguf_prompt_beyond_the_context_is_refused_before_the_file_loads(
    tiny_gguf: Path, capsys: pytest.CaptureFixture[str], no_weights_load: None
) -> None:
    assert main(["generate", "x = 1\n" * 100, "--target", str(tiny_gguf), "--ngram"]) == 1
    refused = REFUSED.fullmatch(capsys.readouterr().err)
    assert refused is not None and refused.group(2, 3) == ("256", "255")


def test_an_input_line_beyond_the_context_is_refused_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_weights_load: None
) -> None:
    """With ``--input``, by line, and the output file is not created."""
    if adapter.default_pair() is None:
        pytest.fail("the default model pair is not installed")
    source, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [{"prompt": "def f():"}, {"prompt": LONG_PROMPT}]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert main(["generate", "--input", str(source), "--output", str(results)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"specsample generate: error: {source}:2: prompt has ")
    assert "the target's context is 1024 positions" in err and err.count("\n") == 1
    assert not results.exists()
