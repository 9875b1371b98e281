"""Weight-only formats of a linear layer's weight applied by a matrix product PyTorch ships
for the CPU, and what every format shares (:class:`QuantizedWeight`; the formats of integer
dot products: :mod:`specsample.adapter.dot_weights`; the layers that hold them:
:mod:`specsample.adapter.quantize`).

``"int4"`` (:class:`Int4Weight`)
    Four-bit integers ``q`` in ``0..15`` in groups of :data:`GROUP_SIZE` along the input,
    each group with a scale ``s`` and an offset ``z``: ``w = (q - 8) * s + z``
    (``torch.ops.aten._weight_int4pack_mm_for_cpu``). Half a byte per weight.
``"int8"`` (:class:`Int8Weight`)
    Eight-bit integers with one scale per output channel: ``w = q * s``
    (``torch.ops.aten._weight_int8pack_mm``). One byte per weight.
``"bfloat16"`` (:class:`BFloat16Weight`)
    The weight rounded to bfloat16, laid out once for oneDNN where the CPU computes in
    bfloat16. Two bytes per weight.

These three take their input in bfloat16 and return bfloat16 (PyTorch's int8 and int4 CPU
products are 10 to 40 times slower with float32 or float16 inputs; other formats say so in
:attr:`QuantizedWeight.dtype`), their scales and offsets stored in bfloat16. The int4 and
int8 products compute each row alone: a row's output is bit for bit the same whatever other
rows share the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

GROUP_SIZE = 32
"""Weights per int4 group along the input (as in GGUF's ``Q4_0``, ``Q4_1`` and the
sub-blocks of ``Q4_K``)."""

INT4_ROWS = 16
"""The int4 layout holds output channels by multiples of this; others are padded with
zero rows."""

INT4_BLOCK = 64
"""The int4 layout interleaves output channels by blocks of this many (a last, shorter
block otherwise): two laid-out weights end to end are one only when the first holds whole
blocks."""

INT8_COLUMNS = 16
"""The int8 product needs ``in_features`` a multiple of this (it reads past the end of
other rows: wrong values or a crash, in PyTorch 2.13)."""

_INNER_K_TILES = 2
"""The int4 layout's ``innerKTiles`` (1, 2, 4 and 8 timed alike on the CPU)."""


def bfloat16_kernels() -> bool:
    """Whether oneDNN computes in bfloat16 on this CPU (else bfloat16 weights use the
    default matrix product).

    Examples
    --------
    >>> isinstance(bfloat16_kernels(), bool)
    True
    """
    return bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def _rows(x: torch.Tensor, features: int, dtype: torch.dtype) -> torch.Tensor:
    """``x [..., features]`` as a contiguous matrix of ``dtype``."""
    return x.reshape(-1, features).to(dtype).contiguous()


def affine_groups(
    weight: torch.Tensor, group: int, precision: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric quantization per group: the group's range in 16 steps.

    ``s = (max - min) / 15`` and ``z = min + 8 s`` (both rounded to ``precision``, then
    held as float32), ``q = round((w - z) / s) + 8`` clamped to ``0..15``; a constant group
    gets ``s = 0``, ``z`` its value, ``q = 8``. Then ``w ~ (q - 8) s + z``.

    Parameters
    ----------
    weight : torch.Tensor
        ``[out_features, in_features]`` float; ``in_features`` a multiple of ``group``.
    group : int
        Inputs per group (a multiple of 32).
    precision : torch.dtype
        The dtype the scales and offsets are rounded to (``torch.bfloat16``,
        ``torch.float32``).

    Returns
    -------
    tuple of torch.Tensor
        ``(q, s, z)``: ``[out_features, in_features]`` int32 and ``[out_features,
        in_features // group]`` float32 twice.

    Raises
    ------
    ValueError
        ``in_features`` is not a multiple of ``group``, or ``group`` of 32.

    Examples
    --------
    >>> q, s, z = affine_groups(torch.arange(32.0).reshape(1, 32), 32, torch.float32)
    >>> q[0, :3].tolist(), s.tolist(), z.tolist()
    ([0, 0, 1], [[2.066666603088379]], [[16.53333282470703]])
    """
    rows, columns = weight.shape
    _check_group(columns, group)
    grouped = weight.detach().to(torch.float32).reshape(rows, columns // group, group)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    scales = ((high - low) / 15).to(precision).to(torch.float32)
    offsets = (low + 8 * scales).to(precision).to(torch.float32)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    steps = torch.round((grouped - offsets[..., None]) / safe[..., None]) + 8
    steps = torch.where(scales[..., None] > 0, steps, torch.full_like(steps, 8.0))
    return steps.clamp(0, 15).to(torch.int32).reshape(rows, columns), scales, offsets


def symmetric_groups(
    weight: torch.Tensor, group: int | None, precision: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization per group: ``s = max |w| / 127`` (rounded to ``precision``,
    then held as float32), ``q = round(w / s)`` clamped to ``-127..127``; a group of zeros
    gets ``s = 0``, ``q = 0``. Then ``w ~ q s``.

    Parameters
    ----------
    weight : torch.Tensor
        ``[out_features, in_features]`` float; ``in_features`` a multiple of ``group``.
    group : int or None
        Inputs per group; ``None``: one group per output channel.
    precision : torch.dtype
        The dtype the scales are rounded to (``torch.bfloat16``, ``torch.float32``).

    Returns
    -------
    tuple of torch.Tensor
        ``(q, s)``: ``[out_features, in_features]`` int8 and ``[out_features, groups]``
        float32.

    Raises
    ------
    ValueError
        ``in_features`` is not a multiple of ``group``.

    Examples
    --------
    >>> q, s = symmetric_groups(torch.tensor([[-2.0, 1.0, 0.5, 0.0]]), 2, torch.float32)
    >>> q.tolist(), (s * 127).tolist()
    ([[-127, 64, 127, 0]], [[2.0, 0.5]])
    """
    rows, columns = weight.shape
    if group is not None and columns % group:
        raise ValueError(f"in_features must be a multiple of {group}, got {columns}")
    shape = (rows, 1, columns) if group is None else (rows, -1, group)
    grouped = weight.detach().to(torch.float32).reshape(shape)
    scales = (grouped.abs().amax(dim=-1) / 127).to(precision).to(torch.float32)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    integers = torch.round(grouped / safe[..., None]).clamp(-127, 127).to(torch.int8)
    return integers.reshape(rows, columns), scales


def _check_group(columns: int, group: int) -> None:
    """Raise unless ``group`` is a multiple of 32 dividing ``columns`` (``in_features``)."""
    if group % 32 or columns % group:
        raise ValueError(
            f"group must be a multiple of 32 dividing in_features ({columns}), got {group}"
        )


def check_int4(
    integers: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, group: int
) -> None:
    """Raise unless ``integers`` (``0..15``), ``scales`` and ``offsets`` describe int4 groups
    of ``group`` inputs."""
    if integers.dim() != 2 or integers.dtype.is_floating_point:
        raise TypeError(f"integers must be a 2-D integer tensor, got {integers.dtype}")
    rows, columns = integers.shape
    _check_group(columns, group)
    expected = (rows, columns // group)
    for name, value in (("scales", scales), ("offsets", offsets)):
        if tuple(value.shape) != expected:
            raise ValueError(f"{name} must have shape {expected}, got {tuple(value.shape)}")
    if integers.numel() and not bool(((integers >= 0) & (integers <= 15)).all()):
        raise ValueError("integers must lie in 0..15")


class QuantizedWeight:
    """A linear layer's weight in a weight-only format, and the product that applies it.

    Attributes
    ----------
    format : str
        One of :data:`FORMATS`.
    out_features, in_features : int
        The weight's shape.
    """

    format: ClassVar[str]
    dtype: ClassVar[torch.dtype] = torch.bfloat16
    """The dtype of the product's input and output."""
    stored: ClassVar[tuple[str, ...]] = ()
    """The attributes that hold the weight's tensors, whose bytes :attr:`nbytes` counts."""
    out_features: int
    in_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` for ``x [..., in_features]``: ``[..., out_features]`` of
        :attr:`dtype`."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must end in {self.in_features} features, got {tuple(x.shape)}")
        rows = _rows(x, self.in_features, self.dtype)
        out = self._matmul(rows) if rows.shape[0] else rows.new_empty(0, self.out_features)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        """The weight the product applies, ``[out_features, in_features]`` float32."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes the weight takes: those of its tensors (:attr:`stored`)."""
        return sum(getattr(self, name).nbytes for name in self.stored)

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        """One weight whose outputs are those of ``parts``, in order (same ``in_features``).

        The joined product gives each part's outputs bit for bit.
        """
        raise NotImplementedError


class BFloat16Weight(QuantizedWeight):
    """A weight rounded to bfloat16 (laid out for oneDNN where :func:`bfloat16_kernels`).

    Parameters
    ----------
    weight : torch.Tensor
        ``[out_features, in_features]`` float, rounded to bfloat16.

    Examples
    --------
    >>> w = torch.tensor([[1.0, 2.0], [3.0, 1.0 / 3.0]])
    >>> BFloat16Weight(w)(torch.tensor([[1.0, 1.0]])).tolist()
    [[3.0, 3.328125]]
    """

    format = "bfloat16"

    def __init__(self, weight: torch.Tensor) -> None:
        plain = weight.detach().to(torch.bfloat16).contiguous()
        self.out_features, self.in_features = plain.shape
        self.packed = bfloat16_kernels()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(plain) if self.packed else plain

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(rows, self.weight, None, "none", [], "")
        return torch.nn.functional.linear(rows, self.weight)

    def dequantize(self) -> torch.Tensor:
        plain = self.weight.to_dense() if self.packed else self.weight
        return plain.to(torch.float32)

    def __deepcopy__(self, memo: dict[int, Any]) -> BFloat16Weight:
        """A copy laid out anew (oneDNN's layout cannot be copied as a tensor)."""
        return BFloat16Weight(self.dequantize())

    @property
    def nbytes(self) -> int:
        return self.out_features * self.in_features * 2

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        return cls(torch.cat([part.dequantize() for part in parts]))


class Int8Weight(QuantizedWeight):
    """Int8 weights with one bfloat16 scale per output channel: ``w = q * s``.

    Parameters
    ----------
    integers : torch.Tensor
        ``[out_features, in_features]`` int8.
    scales : torch.Tensor
        ``[out_features]`` float, rounded to bfloat16.

    Examples
    --------
    >>> integers = torch.zeros(2, 16, dtype=torch.int8)
    >>> integers[:, :2] = torch.tensor([[1, -2], [127, 0]])
    >>> weight = Int8Weight(integers, torch.tensor([0.5, 0.25]))
    >>> weight.dequantize()[:, :2].tolist()
    [[0.5, -1.0], [31.75, 0.0]]
    >>> weight(torch.tensor([[2.0, 1.0] + [0.0] * 14])).tolist()
    [[0.0, 63.5]]
    """

    format = "int8"
    stored = ("integers", "scales")

    def __init__(self, integers: torch.Tensor, scales: torch.Tensor) -> None:
        if integers.dtype != torch.int8 or integers.dim() != 2:
            raise TypeError(f"integers must be a 2-D int8 tensor, got {integers.dtype}")
        if integers.shape[1] % INT8_COLUMNS:
            raise ValueError(
                f"in_features must be a multiple of {INT8_COLUMNS}, got {integers.shape[1]}"
            )
        if scales.shape != integers.shape[:1]:
            raise ValueError(
                f"scales must have shape {tuple(integers.shape[:1])}, got {tuple(scales.shape)}"
            )
        self.integers = integers.contiguous()
        self.scales = scales.detach().to(torch.bfloat16).contiguous()
        self.out_features, self.in_features = integers.shape

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Weight:
        """Symmetric per-channel quantization (:func:`symmetric_groups`): ``s = max |w| /
        127`` (in bfloat16), ``q = round(w / s)``.

        Parameters
        ----------
        weight : torch.Tensor
            ``[out_features, in_features]`` float.
        """
        integers, scales = symmetric_groups(weight, None, torch.bfloat16)
        return cls(integers, scales[:, 0])

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, self.integers, self.scales)

    def dequantize(self) -> torch.Tensor:
        return self.integers.to(torch.float32) * self.scales.to(torch.float32)[:, None]

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        eights = [same_format(part, cls) for part in parts]
        return cls(
            torch.cat([part.integers for part in eights]),
            torch.cat([part.scales for part in eights]),
        )


class Int4Weight(QuantizedWeight):
    """Int4 weights in groups of ``group`` inputs, each with a bfloat16 scale and offset.

    The weight is ``w = (q - 8) * s + z`` with ``q`` in ``0..15``; ``s`` and ``z`` are kept
    per output channel and group. Output channels are held by multiples of
    :data:`INT4_ROWS` (zero rows pad the rest).

    Parameters
    ----------
    integers : torch.Tensor
        ``[out_features, in_features]`` integers in ``0..15`` (any integer dtype).
    scales, offsets : torch.Tensor
        ``[out_features, in_features // group]`` float, rounded to bfloat16.
    group : int
        Inputs per group: ``in_features`` must be a multiple of it, and it a multiple of
        32 (the kernel's).

    Examples
    --------
    >>> q = torch.arange(32).remainder(16).repeat(16, 1)
    >>> weight = Int4Weight(q, torch.full((16, 1), 0.5), torch.ones(16, 1))
    >>> weight.dequantize()[0, :3].tolist()
    [-3.0, -2.5, -2.0]
    >>> float(weight(torch.ones(1, 32))[0, 0])
    24.0
    """

    format = "int4"
    stored = ("packed", "scale_offsets")

    def __init__(
        self,
        integers: torch.Tensor,
        scales: torch.Tensor,
        offsets: torch.Tensor,
        group: int = GROUP_SIZE,
    ) -> None:
        check_int4(integers, scales, offsets, group)
        rows, columns = integers.shape
        self.out_features, self.in_features, self.group = rows, columns, group
        pad = -rows % INT4_ROWS
        padded = torch.nn.functional.pad(integers.to(torch.int32), (0, 0, 0, pad), value=8)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            padded.contiguous(), _INNER_K_TILES
        )
        pairs = torch.stack([scales.detach(), offsets.detach()], dim=-1).to(torch.bfloat16)
        pairs = torch.nn.functional.pad(pairs, (0, 0, 0, 0, 0, pad))
        self.scale_offsets = pairs.transpose(0, 1).contiguous()

    @classmethod
    def from_float(cls, weight: torch.Tensor, group: int = GROUP_SIZE) -> Int4Weight:
        """Asymmetric quantization per group of ``group`` inputs by :func:`affine_groups`
        (its parameters and errors), the scales and offsets in bfloat16.
        """
        return cls(*affine_groups(weight, group, torch.bfloat16), group)

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows, self.packed, self.group, self.scale_offsets
        )
        return out[:, : self.out_features] if out.shape[1] != self.out_features else out

    def integers(self) -> torch.Tensor:
        """``q``, ``[out_features, in_features]`` int32 in ``0..15``, read back from the
        kernel's layout (through the product itself, with unit scales)."""
        columns = self.in_features
        unit = torch.zeros_like(self.scale_offsets)
        unit[..., 0] = 1
        eye = torch.eye(columns, dtype=torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group, unit)
        return out[:, : self.out_features].t().to(torch.int32) + 8

    def scales_and_offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``s`` and ``z``: ``[out_features, in_features // group]`` float32 each."""
        pairs = self.scale_offsets.transpose(0, 1)[: self.out_features].to(torch.float32)
        return pairs[..., 0], pairs[..., 1]

    def dequantize(self) -> torch.Tensor:
        return int4_values(self)

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        fours = [same_format(part, cls) for part in parts]
        if len({part.group for part in fours}) != 1:
            raise ValueError("int4 weights must share their group size to be joined")
        joined = object.__new__(cls)
        joined.in_features, joined.group = fours[0].in_features, fours[0].group
        joined.out_features = sum(part.out_features for part in fours)
        if all(part.out_features % INT4_BLOCK == 0 for part in fours[:-1]):
            joined.packed = torch.cat([part.packed for part in fours])
            joined.scale_offsets = torch.cat([part.scale_offsets for part in fours], dim=1)
            return joined
        return cls(*int4_parts(fours), joined.group)


def int4_values(weight: Any) -> torch.Tensor:
    """``(q - 8) s + z`` of an int4 weight (:class:`Int4Weight`,
    :class:`~specsample.adapter.dot_weights.Int4Int8Weight`),
    ``[out_features, in_features]`` float32."""
    scales, offsets = weight.scales_and_offsets()
    steps = (weight.integers() - 8).to(torch.float32)
    grouped = steps.reshape(weight.out_features, -1, weight.group)
    return (grouped * scales[..., None] + offsets[..., None]).reshape(steps.shape)


def int4_parts(parts: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The integers, scales and offsets of int4 weights, their output channels end to end."""
    scales, offsets = zip(*(part.scales_and_offsets() for part in parts), strict=True)
    return torch.cat([part.integers() for part in parts]), torch.cat(scales), torch.cat(offsets)


def same_format(part: QuantizedWeight, kind: type[Any]) -> Any:
    if not isinstance(part, kind):
        raise TypeError(f"cannot join a {part.format} weight with {kind.format} ones")
    return part
