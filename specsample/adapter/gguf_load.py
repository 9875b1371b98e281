"""A transformers model and tokenizer from a GGUF file, its tensors read and decoded once.

:func:`loads_itself` tells whether this module loads a file: one of an architecture of
:data:`ARCHITECTURES` (``llama``: Llama, SmolLM, TinyLlama, ...) whose tensors are all of a
type :mod:`~specsample.adapter.gguf_quants` decodes (``F32``, ``F16``, ``BF16``, ``Q8_0``,
``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q2_K`` to ``Q6_K``);
:mod:`~specsample.adapter.loading` hands any other file to transformers' own GGUF loader.

:func:`load_gguf_model` builds the model's config from the file's metadata
(:func:`gguf_config`: the keys transformers' GGUF support maps, the same config), decodes
each tensor from a memory map of the file straight into the float32 tensor the model keeps
(:func:`read_weights`) and gives them to the transformers model class, which keeps them:
the model takes the memory of its float32 parameters and little more. Asked to keep the
weights quantized (``quantize``, :func:`weight_format`), it builds each linear layer of a
4-bit type (``Q4_0``, ``Q4_1``, ``Q4_K``) as an int4 layer from the file's own integers,
scales and offsets, without decoding it to float32, and quantizes the others from their
float32 values (:mod:`specsample.adapter.quantize`).
:func:`load_gguf_tokenizer` builds transformers' own GGUF tokenizer, the one
``AutoTokenizer`` builds for the architecture, without transformers first parsing the whole
file for a config. Model and tokenizer are those transformers' GGUF loader gives, tensor
for tensor and token for token.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import numpy as np
import torch

from specsample.adapter.dot_weights import (
    Int4Int8Weight,
    Int8Int8Weight,
    dot_products,
    int4_format,
)
from specsample.adapter.gguf import GgufFile, GgufTensor
from specsample.adapter.gguf_quants import (
    FORMATS,
    INT4_GROUP,
    INT4_KINDS,
    dequantize,
    int4_groups,
    int8_groups,
    tensor_bytes,
)
from specsample.adapter.quantize import (
    HEAD_FORMAT,
    MODES,
    QuantizedLinear,
    fits,
    quantize_weight,
    replace_module,
)
from specsample.adapter.weight_formats import Int4Weight, QuantizedWeight

_LLAMA_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _llama_name(name: str) -> str | None:
    """The Llama parameter a GGUF tensor is (``blk.3.attn_q.weight``:
    ``model.layers.3.self_attn.q_proj.weight``), ``None`` for one it has no place for."""
    stem, _, suffix = name.rpartition(".")
    if stem in _LLAMA_GLOBAL:
        return f"{_LLAMA_GLOBAL[stem]}.{suffix}"
    block, _, part = stem.partition(".")[2].partition(".")
    if stem.startswith("blk.") and block.isdigit() and part in _LLAMA_LAYER:
        return f"model.layers.{block}.{_LLAMA_LAYER[part]}.{suffix}"
    return None


def _llama_heads(name: str, config: dict[str, Any]) -> int | None:
    """How many heads a query or key tensor's rows interleave, ``None`` for other tensors.

    llama.cpp stores the query and key rows of each head with its two rotary halves
    interleaved; a file that does not give both head counts is left as stored, as
    transformers leaves it.
    """
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads is None or kv_heads is None:
        return None
    return heads if ".attn_q." in name else kv_heads if ".attn_k." in name else None


class Architecture(NamedTuple):
    """How to load the GGUF files of one architecture (:data:`ARCHITECTURES`).

    Attributes
    ----------
    model_class, tokenizer_class : str
        The transformers classes.
    parameter : callable
        A GGUF tensor name to the parameter name, ``None`` for a tensor to skip.
    heads : callable
        ``(tensor name, config dict)`` to the number of heads whose rows the file stores
        interleaved, ``None`` for a tensor stored as the model keeps it.
    """

    model_class: str
    tokenizer_class: str
    parameter: Callable[[str], str | None]
    heads: Callable[[str, dict[str, Any]], int | None]


ARCHITECTURES = {
    "llama": Architecture("LlamaForCausalLM", "PreTrainedTokenizerFast", _llama_name, _llama_heads),
}
"""The architectures :func:`load_gguf_model` loads, by ``general.architecture``."""


def loads_itself(file: GgufFile) -> bool:
    """Whether :func:`load_gguf_model` loads ``file``: its architecture and tensor types."""
    return file.architecture in ARCHITECTURES and all(t.kind in FORMATS for t in file.tensors)


def _config_values(file: GgufFile) -> dict[str, Any]:
    """The config keys the file's metadata gives, renamed as transformers' GGUF support does."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    values = {}
    for key, value in file.metadata.items():
        prefix, _, rest = key.partition(".")
        section = GGUF_CONFIG_MAPPING.get(prefix)
        renamed = section.get(rest) if isinstance(section, dict) else None
        if renamed is not None and renamed != -1:
            values[renamed] = value
    values["tie_word_embeddings"] = all(t.name != "output.weight" for t in file.tensors)
    tokens = file.metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in values and isinstance(tokens, list):
        values["vocab_size"] = len(tokens)
    return values


def gguf_config(file: GgufFile) -> Any:
    """The transformers config of a GGUF file, from its metadata.

    Raises
    ------
    ValueError
        ``file`` is not one :func:`loads_itself`.
    """
    if not loads_itself(file):
        raise ValueError(f"file must be a GGUF file of {', '.join(ARCHITECTURES)}: {file.path}")
    from transformers import AutoConfig

    return AutoConfig.for_model(**_config_values(file))


def _decode(raw: np.ndarray, tensor: GgufTensor, heads: int | None) -> torch.Tensor:
    """One tensor as float32, its rows put back in the model's order when ``heads`` is set."""
    values = torch.empty(tensor.shape, dtype=torch.float32)
    if heads is None:
        dequantize(tensor.kind, raw, values.numpy().reshape(-1))
        return values
    stored = np.empty(values.numel(), dtype=np.float32)
    dequantize(tensor.kind, raw, stored)
    rows, rest = tensor.shape[0], tensor.shape[1:]
    half = rows // heads // 2
    order = stored.reshape(heads, half, 2, *rest).swapaxes(1, 2)
    np.copyto(values.numpy().reshape(heads, 2, half, *rest), order)
    return values


def _mapped(file: GgufFile) -> np.ndarray:
    """The file's bytes, memory-mapped."""
    with file.path.open("rb") as handle:
        return np.frombuffer(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)


def _raw(data: np.ndarray, tensor: GgufTensor, file: GgufFile) -> np.ndarray:
    """The bytes of ``tensor`` in the mapped ``data``."""
    end = tensor.offset + tensor_bytes(tensor.kind, math.prod(tensor.shape))
    if end > data.size:
        raise ValueError(f"GGUF file ends inside tensor {tensor.name}: {file.path}")
    return data[tensor.offset : end]


def read_weights(file: GgufFile, skip: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """The file's tensors as float32, under the parameter names of its architecture.

    The file is memory-mapped and each tensor decoded into the tensor returned (query and
    key rows through one tensor-sized buffer); tensors the model has no place for are
    skipped.

    Parameters
    ----------
    file : GgufFile
    skip : collection of str
        Parameter names not decoded: each gets an uninitialised tensor of its shape (a
        weight that will be replaced).

    Raises
    ------
    ValueError
        ``file`` is not one :func:`loads_itself`, or a tensor's data lies past its end.
    """
    if not loads_itself(file):
        raise ValueError(f"file must be a GGUF file of {', '.join(ARCHITECTURES)}: {file.path}")
    architecture = ARCHITECTURES[str(file.architecture)]
    config = _config_values(file)
    data = _mapped(file)
    weights = {}
    for tensor in file.tensors:
        name = architecture.parameter(tensor.name)
        if name is None:
            continue
        raw = _raw(data, tensor, file)
        if name in skip:
            weights[name] = torch.empty(tensor.shape, dtype=torch.float32)
        else:
            weights[name] = _decode(raw, tensor, architecture.heads(tensor.name, config))
    return weights


def weight_format(kind: str, quantize: str, in_features: int, *, head: bool = False) -> str | None:
    """The format a linear layer stored as ``kind`` is kept in under ``quantize``.

    ``"auto"`` keeps the file's own quantization: the 4-bit types as int4 (in the format of
    :func:`~specsample.adapter.dot_weights.int4_format`: ``"int4a8"`` where its integer
    dot products are fast, else ``"int4"``), ``Q8_0`` as ``"int8a8"`` where those are fast
    (its integers and scales exactly), the other quantized types as bfloat16 (no bits of
    theirs lost but bfloat16's rounding of each value), float types as float32.
    ``"none"``: float32. Any other mode is that format where the layer fits it
    (:func:`~specsample.adapter.quantize.fits`), and
    :data:`~specsample.adapter.quantize.HEAD_FORMAT` for the LM head (``head``), as
    :func:`~specsample.adapter.quantize.quantize_model` does.

    Parameters
    ----------
    kind : str
        The tensor's GGML type (``"Q4_1"``, ...).
    quantize : str
        One of :data:`~specsample.adapter.quantize.MODES`.
    in_features : int
        The layer's inputs.

    Returns
    -------
    str or None
        A format of :data:`~specsample.adapter.quantize.FORMATS`, ``None`` for float32.

    Raises
    ------
    ValueError
        ``quantize`` is not one of :data:`~specsample.adapter.quantize.MODES`.

    Examples
    --------
    >>> [weight_format(kind, "auto", 576) for kind in ("Q5_0", "F16")]
    ['bfloat16', None]
    >>> weight_format("Q4_1", "auto", 576) in ("int4", "int4a8")
    True
    >>> weight_format("Q4_1", "int4", 576), weight_format("Q8_0", "int4", 576, head=True)
    ('int4', 'bfloat16')
    """
    if quantize not in MODES:
        raise ValueError(f"quantize must be one of {', '.join(MODES)}, got {quantize!r}")
    if quantize == "none":
        return None
    if quantize == "auto":
        if kind in INT4_KINDS:
            return int4_format()
        if kind == "Q8_0" and dot_products():
            return "int8a8"
        return None if kind in FLOAT_KINDS else "bfloat16"
    chosen = HEAD_FORMAT if head else quantize
    return chosen if fits(chosen, in_features) else None


def _linear_tensors(file: GgufFile) -> dict[str, GgufTensor]:
    """The tensor each linear layer's weight comes from, by module name (the LM head tied
    to the token embedding when the file has no ``output.weight``)."""
    architecture = ARCHITECTURES[str(file.architecture)]
    found = {}
    for tensor in file.tensors:
        name = architecture.parameter(tensor.name)
        module = None if name is None else name.removesuffix(".weight")
        if module is not None and module != name and module.rsplit(".", 1)[-1] in _LINEAR:
            found[module] = tensor
        if tensor.name == "token_embd.weight" and "lm_head" not in found:
            found["lm_head"] = tensor
    return found


_LINEAR = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
)

FLOAT_KINDS = frozenset({"F32", "F16", "BF16"})
"""GGML types that hold plain floats."""

_INT4_FORMATS = frozenset({"int4", "int4a8"})


def _from_blocks(tensor: GgufTensor, format: str | None) -> bool:
    """Whether a layer of ``format`` takes ``tensor``'s integers as they are."""
    return (format in _INT4_FORMATS and tensor.kind in INT4_KINDS) or (
        format == "int8a8" and tensor.kind == "Q8_0"
    )


def _block_weight(
    raw: np.ndarray, tensor: GgufTensor, heads: int | None, format: str
) -> QuantizedWeight:
    """A weight of ``format`` with ``tensor``'s own integers, scales and offsets: an int4
    one (``"int4"`` or ``"int4a8"``) of ``Q4_0``, ``Q4_1``, ``Q4_K``, an ``"int8a8"`` one of
    ``Q8_0``; its rows put back in the model's order when ``heads`` is set."""
    rows, columns = tensor.shape
    if format == "int8a8":
        eights = int8_groups(raw, rows * columns)
        arrays = [eights[0].reshape(rows, columns), eights[1].reshape(rows, -1)]
    else:
        integers, scales, offsets = int4_groups(tensor.kind, raw, rows * columns)
        arrays = [
            integers.reshape(rows, columns),
            scales.reshape(rows, -1),
            offsets.reshape(rows, -1),
        ]
    if heads is not None:
        half = rows // heads // 2
        arrays = [a.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(rows, -1) for a in arrays]
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    if format == "int8a8":
        return Int8Int8Weight(tensors[0], tensors[1])
    if format == "int4a8":
        return Int4Int8Weight(tensors[0], tensors[1], tensors[2])
    return Int4Weight(tensors[0], tensors[1], tensors[2], INT4_GROUP)


def load_gguf_model(file: GgufFile, quantize: str = "none") -> Any:
    """The transformers causal LM a GGUF file holds, in eval mode.

    With ``quantize="none"`` every tensor is decoded to float32. Otherwise each linear layer
    (the projections and the LM head) is put in the format :func:`weight_format` picks, as
    a :class:`~specsample.adapter.quantize.QuantizedLinear`: an int4 or int4a8 layer stored
    as ``Q4_0``, ``Q4_1`` or ``Q4_K`` takes the file's integers, scales and offsets
    (:func:`~specsample.adapter.gguf_quants.int4_groups`; the scales and offsets then
    rounded to bfloat16 for int4, kept in float32 for int4a8), without decoding the tensor
    to float32; any other is quantized
    from its float32 values (:func:`~specsample.adapter.quantize.quantize_weight`). The
    token embedding stays float32.

    Parameters
    ----------
    file : GgufFile
    quantize : str
        One of :data:`~specsample.adapter.quantize.MODES`.

    Raises
    ------
    ValueError
        ``quantize`` is not one of :data:`~specsample.adapter.quantize.MODES`; ``file`` is
        not one :func:`loads_itself`, is cut short, or lacks a tensor the model needs (the
        message names them).
    """
    import transformers

    if quantize not in MODES:
        raise ValueError(f"quantize must be one of {', '.join(MODES)}, got {quantize!r}")
    config = gguf_config(file)
    architecture = ARCHITECTURES[str(file.architecture)]
    values = _config_values(file)
    formats = {
        module: (
            tensor,
            weight_format(tensor.kind, quantize, tensor.shape[-1], head=module == "lm_head"),
        )
        for module, tensor in _linear_tensors(file).items()
    }
    from_blocks = {
        module for module, (tensor, format) in formats.items() if _from_blocks(tensor, format)
    }
    skip = {f"{module}.weight" for module in from_blocks} - {"model.embed_tokens.weight"}
    model_class = getattr(transformers, architecture.model_class)
    model, info = model_class.from_pretrained(
        None, config=config, state_dict=read_weights(file, skip), output_loading_info=True
    )
    if info["missing_keys"]:
        missing = ", ".join(sorted(info["missing_keys"]))
        raise ValueError(f"GGUF file lacks the tensors of {missing}: {file.path}")
    data = _mapped(file)
    for module, (tensor, format) in formats.items():
        if format is None:
            continue
        layer = model.get_submodule(module)
        if module in from_blocks:
            heads = architecture.heads(tensor.name, values)
            weight: QuantizedWeight = _block_weight(_raw(data, tensor, file), tensor, heads, format)
        else:
            weight = quantize_weight(layer.weight, format)
        replace_module(model, module, QuantizedLinear(weight, layer.bias))
    model.name_or_path = model.config.name_or_path = str(file.path.parent)
    return model.eval()


def load_gguf_tokenizer(file: GgufFile) -> Any:
    """transformers' tokenizer of a GGUF file, of the class ``AutoTokenizer`` picks for it.

    Raises
    ------
    ValueError
        ``file`` is not of an architecture of :data:`ARCHITECTURES`.
    """
    architecture = ARCHITECTURES.get(str(file.architecture))
    if architecture is None:
        raise ValueError(f"file must be a GGUF file of {', '.join(ARCHITECTURES)}: {file.path}")
    import transformers

    tokenizer_class = getattr(transformers, architecture.tokenizer_class)
    path = file.path.resolve()
    return tokenizer_class.from_pretrained(
        str(path.parent), gguf_file=str(path), local_files_only=True
    )
