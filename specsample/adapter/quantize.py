"""Weight-only quantized linear layers for decoding on a CPU.

A decoding step of a small model reads every weight once for a handful of rows, so on a CPU
its time is mostly the time to read the weights: fewer bytes per weight, less time per
token. A :class:`QuantizedLinear` keeps its weight in one of the formats of
:mod:`~specsample.adapter.weight_formats` and :mod:`~specsample.adapter.dot_weights`:

- three applied by a matrix product PyTorch ships for the CPU (int4 in groups of 32, int8
  per output channel, bfloat16), in bfloat16: PyTorch's int8 and int4 CPU products are 10
  to 40 times slower with float32 or float16 inputs. Such a layer computes ``bf16(bf16(x)
  @ W^T) + bias`` with ``W`` the format's weight (scales and offsets stored in bfloat16);
- two applied by integer dot products of our own (:mod:`specsample.adapter.int_products`: int4a8,
  int8a8): float32 in and out, each group of 32 inputs of a row quantized to int8 codes,
  the weights' scales and offsets kept in float32.

Either way the result is handed back in ``x``'s dtype. That is the quantized model's
function, deterministic. All but the bfloat16 product compute each row alone: a row's
output is bit for bit the same whatever other rows share the call (checked for 1 to 40
rows), which lets the fused forward verify a block of drafts with exactly target-only
decoding's logits (:func:`~specsample.adapter.fused.rows_agree`); oneDNN's bfloat16 product
does so for some shapes only (not for 1536 inputs on the machine measured). The function
differs from the float model's by the quantization and the roundings of the activations.

:func:`quantize_model` replaces the ``torch.nn.Linear`` modules of any model by
:class:`QuantizedLinear` ones (the generic path: the model's own forward then runs through
them); :class:`~specsample.adapter.fused.FusedForward` applies the same weights, joined
(query, key and value; gate and up) by
:meth:`~specsample.adapter.weight_formats.QuantizedWeight.join`.
:mod:`~specsample.adapter.gguf_load` builds int4 and int4a8 weights straight from a GGUF
file's ``Q4_0``, ``Q4_1`` and ``Q4_K`` blocks (their integers, scales and offsets,
:func:`~specsample.adapter.gguf_quants.int4_groups`), and int8a8 ones from ``Q8_0``.

Measured at one thread on a two-core AVX-512 (with bfloat16) x86-64 machine, the 30
layers' projections of a 135M-parameter Llama (hidden 576, intermediate 1536) take, per
forward of 1 / 5 rows: float32 (oneDNN) 26-33 / 26 ms, bfloat16 18 / 18 ms, int8
16 / 29 ms, int4 7.5 / 18 ms; its 49152 x 576 LM head 8.4 / 7.7, 3.5 / 3.9, 4.5 / 12.7 and
2.3 / 7.8 ms. The int8 and int4 products cost about linearly in the rows, oneDNN's do not.
On another such machine (Zen 5, AVX512-VNNI), the int4a8 products of one layer ran 2.8-3.8x
(1 row) and 2.1-2.7x (5 rows) faster than int4's, and the int8a8 head 2.1x / 1.35x faster
than bfloat16's.
"""

from __future__ import annotations

from typing import Any

import torch

from specsample.adapter.dot_weights import Int4Int8Weight, Int8Int8Weight
from specsample.adapter.weight_formats import (
    GROUP_SIZE,
    INT8_COLUMNS,
    BFloat16Weight,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
)

FORMATS = ("bfloat16", "int8", "int4", "int4a8", "int8a8")
"""The weight formats, as :func:`quantize_weight` names them: PyTorch's products
(:mod:`~specsample.adapter.weight_formats`) and integer dot products
(:mod:`~specsample.adapter.dot_weights`)."""

MODES = ("none", "auto", "bfloat16", "int8", "int4", "int4a8", "int8a8")
"""What :func:`specsample.adapter.load_model` accepts as ``quantize``: ``"none"`` keeps
float32 weights; ``"auto"`` keeps a GGUF file's own quantization (4-bit types as int4 in the
format of :func:`~specsample.adapter.dot_weights.int4_format`, other
quantized types as bfloat16) and a model directory's float weights; the others put every
linear layer in that format, the LM head in :data:`HEAD_FORMAT` (:func:`quantize_model`)."""


def quantize_weight(weight: torch.Tensor, format: str) -> QuantizedWeight:
    """``weight [out_features, in_features]`` (float) in ``format`` (:data:`FORMATS`).

    Raises
    ------
    ValueError
        ``format`` is not one of :data:`FORMATS`, or the shape does not fit it
        (:func:`fits`).

    Examples
    --------
    >>> weight = torch.linspace(-127.0, 127.0, 32).reshape(2, 16)
    >>> quantize_weight(weight, "int8").dequantize()[:, :3].tolist()
    [[-127.0, -119.0, -111.0], [4.0, 12.0, 20.0]]
    """
    if format == "bfloat16":
        return BFloat16Weight(weight)
    if format == "int8":
        return Int8Weight.from_float(weight)
    if format == "int4":
        return Int4Weight.from_float(weight)
    if format == "int4a8":
        return Int4Int8Weight.from_float(weight)
    if format == "int8a8":
        return Int8Int8Weight.from_float(weight)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")


def fits(format: str, in_features: int) -> bool:
    """Whether a layer of ``in_features`` inputs can be held in ``format``.

    Examples
    --------
    >>> fits("int4", 576), fits("int4", 48), fits("int8", 48), fits("bfloat16", 5)
    (True, False, True, True)
    """
    if format in ("int4", "int4a8", "int8a8"):
        return in_features % GROUP_SIZE == 0
    return format != "int8" or in_features % INT8_COLUMNS == 0


class QuantizedLinear(torch.nn.Module):
    """A ``torch.nn.Linear`` whose weight is a
    :class:`~specsample.adapter.weight_formats.QuantizedWeight` (CPU only).

    The output is the weight's product (``bf16(bf16(x) @ W^T)`` for PyTorch's formats, the
    dot products of :mod:`specsample.adapter.int_products` for int4a8 and int8a8) in ``x``'s dtype,
    plus the bias (kept in its own dtype). The weight is not a parameter: ``parameters()``
    yields the bias only.

    Parameters
    ----------
    weight : QuantizedWeight
    bias : torch.Tensor, optional
        ``[out_features]``.

    Examples
    --------
    >>> layer = QuantizedLinear.from_linear(torch.nn.Linear(64, 16), "int4")
    >>> layer(torch.randn(2, 3, 64)).shape
    torch.Size([2, 3, 16])
    """

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.quantized = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), False)

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, format: str) -> QuantizedLinear:
        """``layer`` with its weight in ``format``
        (:func:`quantize_weight`)."""
        return cls(quantize_weight(layer.weight, format), layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` to ``[..., out_features]``, in ``x``'s dtype."""
        out = self.quantized(x).to(x.dtype)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"format={self.quantized.format}, bias={self.bias is not None}"
        )


HEAD_FORMAT = "bfloat16"
"""The format :func:`quantize_model` gives the LM head: on a GGUF file of SmolLM2-135M, its
49152 x 576 head in int4 (from ``Q8_0``) moved the logits of a 300-token text by a mean KL
divergence of 0.065 nats from the float32 model's (top token the same at 80% of the
positions), in int8 by 0.0027, in bfloat16 by 0.0008 (with int4 projections); and oneDNN's
bfloat16 product is the fastest of the three there at 5 rows, and faster than int8 at 1."""


def output_layer(model: torch.nn.Module) -> str | None:
    """The name of ``model``'s LM head (its output embeddings), ``None`` if it has none.

    Examples
    --------
    >>> output_layer(torch.nn.Linear(2, 2)) is None
    True
    """
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        return None
    return next((name for name, module in model.named_modules() if module is head), None)


def quantize_model(
    model: torch.nn.Module, format: str, *, head: str | None = HEAD_FORMAT
) -> torch.nn.Module:
    """Replace, in place, each ``torch.nn.Linear`` of ``model`` by a :class:`QuantizedLinear`.

    Layers whose shape does not fit their format
    (:func:`fits`) keep their float weights. A weight
    shared by two layers (or tied to an embedding) is quantized for each layer; the embedding
    keeps its float weights.

    Parameters
    ----------
    model : torch.nn.Module
        A model on the CPU.
    format : str
        One of :data:`FORMATS`, for every linear layer but
        the LM head.
    head : str or None
        The LM head's format (:func:`output_layer`; default :data:`HEAD_FORMAT`), ``None``
        to keep its float weights.

    Returns
    -------
    torch.nn.Module
        ``model``.

    Raises
    ------
    ValueError
        ``format`` or ``head`` is not one of
        :data:`FORMATS`, or the model is not on the CPU.

    Examples
    --------
    >>> model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 7))
    >>> quantized_layers(quantize_model(model, "int4"))
    {'int4': 1}
    """
    for name, value in (("format", format), ("head", head)):
        if value is not None and value not in FORMATS:
            raise ValueError(f"{name} must be one of {', '.join(FORMATS)}, got {value!r}")
    output = output_layer(model)
    targets = []
    for name, module in model.named_modules():
        chosen = head if name == output else format
        if isinstance(module, torch.nn.Linear) and chosen and fits(chosen, module.in_features):
            targets.append((name, module, chosen))
    for name, module, chosen in targets:
        if module.weight.device.type != "cpu":
            raise ValueError(f"model must be on the CPU to be quantized: {name} is not")
        replace_module(model, name, QuantizedLinear.from_linear(module, chosen))
    return model


def replace_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    """Put ``module`` at ``name`` (dotted, as ``named_modules`` gives it) in ``model``."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def computes_in_bfloat16(model: Any) -> bool:
    """Whether some linear layer of ``model`` is a :class:`QuantizedLinear` (the products of
    PyTorch's formats take and give bfloat16, those of integer dot products round their
    input to int8 codes per group of 32: either way the logits carry a rounding of
    half-precision size).

    Examples
    --------
    >>> computes_in_bfloat16(torch.nn.Linear(2, 2)), computes_in_bfloat16(object())
    (False, False)
    """
    modules = getattr(model, "modules", None)
    return callable(modules) and any(isinstance(m, QuantizedLinear) for m in modules())


def quantized_layers(model: torch.nn.Module) -> dict[str, int]:
    """How many linear layers of ``model`` hold each format.

    Examples
    --------
    >>> quantized_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    {}
    """
    counts: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            counts[module.quantized.format] = counts.get(module.quantized.format, 0) + 1
    return counts


def quantized_bytes(model: torch.nn.Module) -> int:
    """Bytes the quantized weights of ``model`` take (its parameters not included).

    Examples
    --------
    >>> quantized_bytes(QuantizedLinear.from_linear(torch.nn.Linear(16, 2), "int8"))
    36
    """
    return sum(
        module.quantized.nbytes for module in model.modules() if isinstance(module, QuantizedLinear)
    )
