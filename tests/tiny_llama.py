"""Tiny random Llama models for the loop's tests (built here, never downloaded).

:func:`make_pair` builds a 2-layer target and a perturbed 1-layer copy of it as its draft,
in float64, so acceptance is neither 0 nor 1 and no near-tie can flip an argmax;
:func:`hf_greedy` is ``transformers``' own greedy ``generate``, the reference for greedy
outputs. The fixtures ``pair``, ``pair32`` and ``greedy_reference`` of ``tests/conftest.py``
are built from them.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 64
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17], [3, 3, 3]]
"""Ragged prompts; ``greedy_reference`` holds their 24-token greedy continuations."""


def llama_config(layers: int, **overrides: Any) -> Any:
    """A tiny ``LlamaConfig`` of ``layers`` layers over :data:`VOCAB` tokens, no special ids."""
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
    target = transformers.LlamaForCausalLM(llama_config(2, **overrides)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(3.0)
        target.model.layers[1].self_attn.o_proj.weight.mul_(0.3)
        target.model.layers[1].mlp.down_proj.weight.mul_(0.3)
    draft = transformers.LlamaForCausalLM(llama_config(1, **overrides)).eval()
    shared = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    draft.load_state_dict(shared)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(0.05 * parameter.std() * torch.randn_like(parameter))
    return target.double(), draft.double()


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
