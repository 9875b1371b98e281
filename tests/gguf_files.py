"""Tiny random Llama models written as GGUF files, for the GGUF tests (never downloaded).

:func:`tiny_llama` builds a random 2-layer Llama over the 4096-token vocabulary of the
shipped default tokenizer (:func:`default_tokenizer_dir`); :func:`write_gguf` writes one
with the ``gguf`` package in the layout transformers' GGUF loader and llama.cpp expect
(tensor names ``token_embd``, ``blk.N.attn_q``, ..., the query and key rows of each head
permuted), together with the default tokenizer (byte-level BPE) and :data:`CHAT_TEMPLATE`,
each tensor in the type a function of its name picks: by default the feed-forward weights
in ``Q8_0``, the rest in ``F32``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf", reason="writing a GGUF file needs the gguf package")

HEADS, KV_HEADS, HIDDEN, LAYERS, FFN = 4, 2, 64, 2, 128
ROPE_THETA = 10000.0

CHAT_TEMPLATE = (
    "{% for message in messages %}<|endoftext|>{{ message['role'] }}: {{ message['content'] }}"
    "\n{% endfor %}{% if add_generation_prompt %}<|endoftext|>assistant:{% endif %}"
)
"""A template over the default tokenizer's only special token."""

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def default_tokenizer_dir() -> Path:
    """The directory of the shipped default target: its tokenizer is the files' tokenizer."""
    from specsample import adapter

    pair = adapter.default_pair()
    if pair is None:
        pytest.fail("the default model pair is not installed")
    return pair[0]


def tiny_llama(*, tied: bool = False, seed: int = 0) -> Any:
    """A random 2-layer Llama over the default tokenizer's vocabulary, in eval mode."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=4096,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rope_theta=ROPE_THETA,
        initializer_range=0.2,
        tie_word_embeddings=tied,
    )
    return transformers.LlamaForCausalLM(config).eval()


def ffn_in_q8_0(name: str) -> Any:
    """``Q8_0`` for the feed-forward weights, ``None`` (float32) for every other tensor."""
    if ".ffn_" in name and not name.endswith("norm.weight"):
        return gguf.GGMLQuantizationType.Q8_0
    return None


def _permuted(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Query or key rows in llama.cpp's order: each head's two rotary halves interleaved."""
    rows = weight.shape[0]
    halves = weight.reshape(heads, 2, rows // heads // 2, weight.shape[1])
    return halves.transpose(1, 2).reshape(weight.shape)


def gguf_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights under llama.cpp's GGUF names (no ``output`` when tied)."""
    state = model.state_dict()
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    if not model.config.tie_word_embeddings:
        tensors["output.weight"] = state["lm_head.weight"]
    for i in range(LAYERS):
        prefix = f"model.layers.{i}."
        for ours, theirs in _LAYER_NAMES.items():
            tensors[f"blk.{i}.{theirs}.weight"] = state[f"{prefix}{ours}.weight"]
        q, k = state[f"{prefix}self_attn.q_proj.weight"], state[f"{prefix}self_attn.k_proj.weight"]
        tensors[f"blk.{i}.attn_q.weight"] = _permuted(q, HEADS)
        tensors[f"blk.{i}.attn_k.weight"] = _permuted(k, KV_HEADS)
    return tensors


def _write_metadata(writer: Any, config: Any, tokenizer_dir: Path) -> None:
    """The model's shape and the tokenizer of ``tokenizer_dir``, as llama.cpp writes them."""
    saved = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = saved["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {entry["id"] for entry in saved["added_tokens"] if entry["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]]
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_gguf(
    path: Path,
    model: Any,
    tokenizer_dir: Path,
    kind: Callable[[str], Any] = ffn_in_q8_0,
    name: str = "tiny llama",
    skip: frozenset[str] = frozenset(),
) -> Path:
    """Write ``model`` and the tokenizer of ``tokenizer_dir`` as the GGUF file ``path``.

    ``kind`` gives each tensor's GGML type by its GGUF name (``None``: float32); the
    tensors named in ``skip`` are left out.
    """
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    _write_metadata(writer, model.config, tokenizer_dir)
    for tensor_name, tensor in gguf_tensors(model).items():
        if tensor_name in skip:
            continue
        array = tensor.detach().to(torch.float32).numpy()
        quantization = kind(tensor_name)
        if quantization is None:
            writer.add_tensor(tensor_name, array)
        else:
            quantized = gguf.quants.quantize(array, quantization)
            writer.add_tensor(tensor_name, quantized, raw_dtype=quantization)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
