"""What a causal LM's config tells the adapter (:mod:`specsample.adapter.config`): here,
that recurrent and state-space models are refused for what they are.

``transformers`` gives every layer that carries a state from token to token (Mamba blocks,
RG-LRU, linear attention) the layer type ``"linear_attention"``; the refusal names the model
kind instead of claiming such attention layers.
"""

from __future__ import annotations

from typing import Any

import pytest

from specsample import adapter
from specsample.adapter.config import recurrent_kind

transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2}


def _config(name: str, **extra: Any) -> Any:
    return getattr(transformers, name)(**extra)


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        ("MambaConfig", "a state-space (Mamba) model"),
        ("Mamba2Config", "a state-space (Mamba) model"),
        ("FalconMambaConfig", "a state-space (Mamba) model"),
        ("JambaConfig", "a hybrid of attention and state-space (Mamba) layers"),
        ("BambaConfig", "a hybrid of attention and state-space (Mamba) layers"),
        ("RecurrentGemmaConfig", "a recurrent model (Griffin's RG-LRU layers"),
        ("Qwen3NextConfig", "a model with linear-attention layers (qwen3_next)"),
    ],
)
def test_recurrent_models_are_named_for_what_they_are(config: str, kind: str) -> None:
    if not hasattr(transformers, config):
        pytest.skip(f"{config} is not in this transformers")
    assert (recurrent_kind(_config(config)) or "").startswith(kind)
    with pytest.raises(ValueError) as error:
        adapter.attention_window(_config(config), role="draft")
    message = str(error.value)
    assert message.startswith(f"the draft model is {kind}")
    assert "does not support" in message and "'linear_attention'" not in message


def test_attention_models_are_not_recurrent() -> None:
    for name in ("LlamaConfig", "Gemma2Config", "MistralConfig"):
        assert recurrent_kind(_config(name)) is None


@pytest.mark.parametrize(
    ("model", "config", "extra"),
    [
        ("MambaForCausalLM", "MambaConfig", {"state_size": 4}),
        (
            "RecurrentGemmaForCausalLM",
            "RecurrentGemmaConfig",
            {"num_attention_heads": 2, "lru_width": 16, "attention_window_size": 8},
        ),
    ],
)
def test_a_recurrent_model_is_refused_before_any_step(
    model: str, config: str, extra: dict[str, Any]
) -> None:
    lm = getattr(transformers, model)(_config(config, **TINY, **extra)).eval()
    with pytest.raises(ValueError, match=r"^the target model is a .*recurrent state"):
        adapter.CachedLM(lm, role="target")
