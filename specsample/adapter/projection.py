"""Linear layers that read the same input, applied as one matrix product.

:class:`Projection` joins the query, key and value projections of an attention layer (or the
gate and up projections of an MLP) for :class:`~specsample.adapter.fused.FusedForward`:
float32 weights laid out once for oneDNN (:func:`can_pack`), weight-only quantized ones
(:class:`~specsample.adapter.quantize.QuantizedLinear`) joined in their own format.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from specsample.adapter.quantize import QuantizedLinear
from specsample.adapter.weight_formats import QuantizedWeight

PACK_MIN_ELEMENTS = 1 << 17
"""Smallest joined weight laid out for oneDNN: a oneDNN product costs about 15 us more per
call, which smaller weights do not win back (measured on a two-core x86-64 machine)."""


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``weight`` may be laid out for oneDNN's matrix product (float32 on a CPU).

    Examples
    --------
    >>> can_pack(torch.zeros(4, 3, dtype=torch.float64))
    False
    """
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


class Projection:
    """Linear layers that read the same input, applied as one matrix product.

    Parameters
    ----------
    layers : sequence of torch.nn.Linear or QuantizedLinear
        Layers with the same ``in_features``; their outputs are returned in order.
    pack : bool
        Lay the joined weight of float layers out for oneDNN (see :func:`can_pack`) when it
        has at least ``min_elements`` elements; otherwise the layers run one by one
        on their own weights, which are not copied. Quantized layers
        (:class:`~specsample.adapter.quantize.QuantizedLinear`) of one format are always
        joined (:meth:`~specsample.adapter.weight_formats.QuantizedWeight.join`: each output
        bit for bit the layer's own).
    min_elements : int
        Fewest elements of a joined float weight laid out for oneDNN (default
        :data:`PACK_MIN_ELEMENTS`; 0 lays out every one, as a row-exact forward needs).

    Attributes
    ----------
    in_features : int
        Width of the input rows.
    packed : tuple or None
        The joined float weight laid out for oneDNN, and the joined bias.
    quantized : QuantizedWeight or None
        The joined quantized weight (its bias is ``bias``).

    Examples
    --------
    >>> q, k = torch.nn.Linear(4, 3), torch.nn.Linear(4, 2, bias=False)
    >>> x = torch.randn(2, 4)
    >>> a, b = Projection([q, k], pack=False)(x)
    >>> bool(torch.equal(a, q(x))) and bool(torch.equal(b, k(x)))
    True
    """

    def __init__(
        self, layers: Sequence[Any], *, pack: bool, min_elements: int | None = None
    ) -> None:
        if min_elements is None:
            min_elements = PACK_MIN_ELEMENTS
        self.in_features = int(layers[0].in_features)
        self.sizes = [int(layer.out_features) for layer in layers]
        self.layers: list[Callable[[torch.Tensor], torch.Tensor]] = [
            _apply(layer) for layer in layers
        ]
        self.packed: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.quantized: QuantizedWeight | None = None
        self.bias: torch.Tensor | None = None
        formats = {_format(layer) for layer in layers}
        if len(formats) != 1:
            return
        (format,) = formats
        biases = [_bias(layer) for layer in layers]
        outputs = [int(layer.out_features) for layer in layers]
        if format is not None:
            weights: list[QuantizedWeight] = [layer.quantized for layer in layers]
            self.quantized = weights[0] if len(weights) == 1 else type(weights[0]).join(weights)
            self.bias = _joined_bias(biases, outputs)
        elif pack and sum(layer.weight.numel() for layer in layers) >= min_elements:
            weight = torch.cat([layer.weight.detach() for layer in layers])
            self.packed = (
                torch.ops.mkldnn._reorder_linear_weight(weight),
                _joined_bias(biases, outputs),
            )

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The layers' outputs for ``x [..., in_features]``."""
        joined = self.joined(x)
        if joined is None:
            return [layer(x) for layer in self.layers]
        return list(joined.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [joined]

    def joined(self, x: torch.Tensor) -> torch.Tensor | None:
        """The layers' outputs end to end, ``[..., sum(out_features)]``, as one product;
        ``None`` where the layers run one by one."""
        if self.quantized is not None:
            joined = self.quantized(x).to(x.dtype)
            return joined if self.bias is None else joined + self.bias
        if self.packed is not None:
            weight, bias = self.packed
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return None


def _format(layer: Any) -> str | None:
    """The format of a quantized layer's weight, ``None`` for a float one."""
    return layer.quantized.format if isinstance(layer, QuantizedLinear) else None


def _apply(layer: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``layer`` as a function of its input (a float layer on its weight, not the module)."""
    if isinstance(layer, QuantizedLinear):
        return layer
    return functools.partial(F.linear, weight=layer.weight.detach(), bias=_bias(layer))


def _joined_bias(biases: list[torch.Tensor | None], sizes: list[int]) -> torch.Tensor | None:
    """The biases of joined layers end to end (zeros for a layer without), ``None`` if none."""
    if all(bias is None for bias in biases):
        return None
    like = next(bias for bias in biases if bias is not None)
    return torch.cat(
        [
            bias if bias is not None else like.new_zeros(n)
            for bias, n in zip(biases, sizes, strict=True)
        ]
    )


def _bias(layer: Any) -> torch.Tensor | None:
    return None if layer.bias is None else layer.bias.detach()
