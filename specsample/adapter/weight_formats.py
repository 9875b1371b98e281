"""Weight-only formats of a linear layer's weight, each applied by a matrix product for the
CPU (the layers that hold them: :mod:`specsample.adapter.quantize`).

``"int4a8"`` (:class:`Int4Int8Weight`)
    The int4 weights below with float32 scales and offsets, applied to activations
    quantized to int8 per group of 32, by integer dot products
    (:mod:`specsample.native.dots`), as llama.cpp applies a GGUF file's 4-bit blocks.
    Three quarters of a byte per weight.
``"int8a8"`` (:class:`Int8Int8Weight`)
    Eight-bit integers in groups of 32 inputs with a float32 scale each (GGUF's ``Q8_0``),
    applied the same way. A byte and an eighth per weight.
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

The three formats applied by PyTorch's products take their input in bfloat16 and return
bfloat16 (PyTorch's int8 and int4 CPU products are 10 to 40 times slower with float32 or
float16 inputs), their scales and offsets stored in bfloat16; ``"int4a8"`` and ``"int8a8"``
take and return float32 (:attr:`QuantizedWeight.dtype`). All but bfloat16 compute
each row alone: a row's output is bit for bit the same whatever other rows share the call.
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

FORMATS = ("bfloat16", "int8", "int4", "int4a8", "int8a8")
"""The weight formats, as :func:`quantize_weight` names them."""

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
    if group % 32 or columns % group:
        raise ValueError(
            f"group must be a multiple of 32 dividing in_features ({columns}), got {group}"
        )
    grouped = weight.detach().to(torch.float32).reshape(rows, columns // group, group)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    scales = ((high - low) / 15).to(precision).to(torch.float32)
    offsets = (low + 8 * scales).to(precision).to(torch.float32)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    steps = torch.round((grouped - offsets[..., None]) / safe[..., None]) + 8
    steps = torch.where(scales[..., None] > 0, steps, torch.full_like(steps, 8.0))
    return steps.clamp(0, 15).to(torch.int32).reshape(rows, columns), scales, offsets


def _check_int4(
    integers: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, group: int
) -> None:
    """Raise unless ``integers`` (``0..15``), ``scales`` and ``offsets`` describe int4 groups
    of ``group`` inputs."""
    if integers.dim() != 2 or integers.dtype.is_floating_point:
        raise TypeError(f"integers must be a 2-D integer tensor, got {integers.dtype}")
    rows, columns = integers.shape
    if group % 32 or columns % group:
        raise ValueError(
            f"group must be a multiple of 32 dividing in_features ({columns}), got {group}"
        )
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
        """Bytes the weight takes."""
        raise NotImplementedError

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
        """Symmetric per-channel quantization: ``s = max |w| / 127`` (in bfloat16), ``q =
        round(w / s)``.

        Parameters
        ----------
        weight : torch.Tensor
            ``[out_features, in_features]`` float.
        """
        wide = weight.detach().to(torch.float32)
        scales = (wide.abs().amax(dim=1) / 127).to(torch.bfloat16).to(torch.float32)
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        integers = torch.round(wide / safe[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(integers, scales)

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, self.integers, self.scales)

    def dequantize(self) -> torch.Tensor:
        return self.integers.to(torch.float32) * self.scales.to(torch.float32)[:, None]

    @property
    def nbytes(self) -> int:
        return self.integers.numel() + self.scales.numel() * 2

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        eights = [_same(part, cls) for part in parts]
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

    def __init__(
        self,
        integers: torch.Tensor,
        scales: torch.Tensor,
        offsets: torch.Tensor,
        group: int = GROUP_SIZE,
    ) -> None:
        _check_int4(integers, scales, offsets, group)
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
        """Asymmetric quantization per group (:func:`affine_groups`), the scales and offsets
        in bfloat16.

        Parameters
        ----------
        weight : torch.Tensor
            ``[out_features, in_features]`` float; ``in_features`` a multiple of ``group``.
        group : int
            Inputs per group (a multiple of 32).

        Raises
        ------
        ValueError
            ``in_features`` is not a multiple of ``group``.
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
        return _int4_values(self)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scale_offsets.numel() * 2

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        fours = [_same(part, cls) for part in parts]
        if len({part.group for part in fours}) != 1:
            raise ValueError("int4 weights must share their group size to be joined")
        joined = object.__new__(cls)
        joined.in_features, joined.group = fours[0].in_features, fours[0].group
        joined.out_features = sum(part.out_features for part in fours)
        if all(part.out_features % INT4_BLOCK == 0 for part in fours[:-1]):
            joined.packed = torch.cat([part.packed for part in fours])
            joined.scale_offsets = torch.cat([part.scale_offsets for part in fours], dim=1)
            return joined
        return cls(*_int4_parts(fours), joined.group)


class Int4Int8Weight(QuantizedWeight):
    """Int4 weights in groups of 32 inputs with a float32 scale and offset, applied to
    activations quantized to int8 per group of 32 (:mod:`specsample.native.dots`, which
    gives the arithmetic); float32 in and out.

    The weight is ``w = (q - 8) * s + z`` with ``q`` in ``0..15``, as for
    :class:`Int4Weight`, but ``s`` and ``z`` keep float32 (a GGUF file's float16 values
    exactly) and the product quantizes each row's inputs as llama.cpp does. Needs numba
    (``pip install specsample[cpu]``); on a CPU without AVX512-VNNI it runs, slower than
    :class:`Int4Weight` (:func:`specsample.native.dots.fast`). Runs on the calling thread
    where one thread is allowed (:func:`specsample.native.jit.threads`), else on numba's
    threads; not traceable by :func:`torch.compile`.

    Parameters
    ----------
    integers : torch.Tensor
        ``[out_features, in_features]`` integers in ``0..15`` (any integer dtype).
    scales, offsets : torch.Tensor
        ``[out_features, in_features // 32]`` float (held as float32).

    Examples
    --------
    >>> q = torch.arange(32).remainder(16).repeat(16, 1)
    >>> weight = Int4Int8Weight(q, torch.full((16, 1), 0.5), torch.ones(16, 1))
    >>> weight.dequantize()[0, :3].tolist()
    [-3.0, -2.5, -2.0]
    >>> float(weight(torch.ones(1, 32))[0, 0])
    24.0
    """

    format = "int4a8"
    dtype = torch.float32
    group = GROUP_SIZE

    def __init__(self, integers: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> None:
        from specsample.native import dots

        _need_numba(self.format)
        _check_int4(integers, scales, offsets, GROUP_SIZE)
        self.out_features, self.in_features = integers.shape
        pad = -self.out_features % dots.CHANNELS
        padded = torch.nn.functional.pad(integers.to(torch.uint8), (0, 0, 0, pad), value=8)
        self.packed = torch.from_numpy(dots.pack(padded.numpy()))
        self.scales = _channel_blocks(scales, pad)
        self.offsets = _channel_blocks(offsets, pad)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int4Int8Weight:
        """Asymmetric quantization per group of 32 (:func:`affine_groups`), the scales and
        offsets in float32.

        Parameters
        ----------
        weight : torch.Tensor
            ``[out_features, in_features]`` float; ``in_features`` a multiple of 32.

        Raises
        ------
        ValueError
            ``in_features`` is not a multiple of 32.
        """
        return cls(*affine_groups(weight, GROUP_SIZE, torch.float32))

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        from specsample.native import dots

        return _dot_product(
            self,
            rows,
            (dots.int4_int8_product_serial, dots.int4_int8_product),
            (self.packed, self.scales, self.offsets),
        )

    def integers(self) -> torch.Tensor:
        """``q``, ``[out_features, in_features]`` int32 in ``0..15``."""
        from specsample.native import dots

        unpacked = torch.from_numpy(dots.unpack(self.packed.numpy()))
        return unpacked[: self.out_features].to(torch.int32)

    def scales_and_offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``s`` and ``z``: ``[out_features, in_features // 32]`` float32 each."""
        return _channels(self.scales, self.out_features), _channels(self.offsets, self.out_features)

    def dequantize(self) -> torch.Tensor:
        return _int4_values(self)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + (self.scales.numel() + self.offsets.numel()) * 4

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        from specsample.native import dots

        pieces = [_same(part, cls) for part in parts]
        if all(part.out_features % dots.CHANNELS == 0 for part in pieces[:-1]):
            joined = object.__new__(cls)
            joined.in_features = pieces[0].in_features
            joined.out_features = sum(part.out_features for part in pieces)
            joined.packed = torch.cat([part.packed for part in pieces])
            joined.scales = torch.cat([part.scales for part in pieces])
            joined.offsets = torch.cat([part.offsets for part in pieces])
            return joined
        return cls(*_int4_parts(pieces))


class Int8Int8Weight(QuantizedWeight):
    """Int8 weights in groups of 32 inputs with a float32 scale each (GGUF's ``Q8_0``),
    applied to activations quantized to int8 per group of 32 (:mod:`specsample.native.dots`);
    float32 in and out.

    The weight is ``w = q * s`` with ``q`` in ``-128..127``. The same requirements and
    threads as :class:`Int4Int8Weight`.

    Parameters
    ----------
    integers : torch.Tensor
        ``[out_features, in_features]`` int8.
    scales : torch.Tensor
        ``[out_features, in_features // 32]`` float (held as float32).

    Examples
    --------
    >>> q = torch.arange(32, dtype=torch.int8).repeat(16, 1)
    >>> weight = Int8Int8Weight(q, torch.full((16, 1), 0.5))
    >>> weight.dequantize()[0, :3].tolist()
    [0.0, 0.5, 1.0]
    >>> float(weight(torch.ones(1, 32))[0, 0])
    248.0
    """

    format = "int8a8"
    dtype = torch.float32

    def __init__(self, integers: torch.Tensor, scales: torch.Tensor) -> None:
        from specsample.native import dots

        _need_numba(self.format)
        if integers.dtype != torch.int8 or integers.dim() != 2:
            raise TypeError(f"integers must be a 2-D int8 tensor, got {integers.dtype}")
        self.out_features, self.in_features = integers.shape
        if self.in_features % GROUP_SIZE:
            raise ValueError(
                f"in_features must be a multiple of {GROUP_SIZE}, got {self.in_features}"
            )
        expected = (self.out_features, self.in_features // GROUP_SIZE)
        if tuple(scales.shape) != expected:
            raise ValueError(f"scales must have shape {expected}, got {tuple(scales.shape)}")
        pad = -self.out_features % dots.CHANNELS
        padded = torch.nn.functional.pad(integers, (0, 0, 0, pad))
        self.packed = torch.from_numpy(dots.pack8(padded.numpy()))
        self.scales = _channel_blocks(scales, pad)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Int8Weight:
        """Symmetric quantization per group of 32: ``s = max |w| / 127``, ``q = round(w /
        s)`` (as GGUF's ``Q8_0``, but ``s`` in float32).

        Parameters
        ----------
        weight : torch.Tensor
            ``[out_features, in_features]`` float; ``in_features`` a multiple of 32.

        Raises
        ------
        ValueError
            ``in_features`` is not a multiple of 32.
        """
        rows, columns = weight.shape
        if columns % GROUP_SIZE:
            raise ValueError(f"in_features must be a multiple of {GROUP_SIZE}, got {columns}")
        grouped = weight.detach().to(torch.float32).reshape(rows, -1, GROUP_SIZE)
        scales = grouped.abs().amax(dim=-1) / 127
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        integers = torch.round(grouped / safe[..., None]).clamp(-127, 127).to(torch.int8)
        return cls(integers.reshape(rows, columns), scales)

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        from specsample.native import dots

        return _dot_product(
            self,
            rows,
            (dots.int8_int8_product_serial, dots.int8_int8_product),
            (self.packed, self.scales),
        )

    def integers(self) -> torch.Tensor:
        """``q``, ``[out_features, in_features]`` int8."""
        from specsample.native import dots

        return torch.from_numpy(dots.unpack8(self.packed.numpy()))[: self.out_features]

    def dequantize(self) -> torch.Tensor:
        steps = self.integers().to(torch.float32).reshape(self.out_features, -1, GROUP_SIZE)
        return (steps * _channels(self.scales, self.out_features)[..., None]).reshape(
            self.out_features, self.in_features
        )

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() * 4

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        pieces = [_same(part, cls) for part in parts]
        return cls(
            torch.cat([part.integers() for part in pieces]),
            torch.cat([_channels(part.scales, part.out_features) for part in pieces]),
        )


def _int4_values(weight: Any) -> torch.Tensor:
    """``(q - 8) s + z`` of an int4 weight (:class:`Int4Weight`, :class:`Int4Int8Weight`),
    ``[out_features, in_features]`` float32."""
    scales, offsets = weight.scales_and_offsets()
    steps = (weight.integers() - 8).to(torch.float32)
    grouped = steps.reshape(weight.out_features, -1, weight.group)
    return (grouped * scales[..., None] + offsets[..., None]).reshape(steps.shape)


def _int4_parts(parts: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The integers, scales and offsets of int4 weights, their output channels end to end."""
    scales, offsets = zip(*(part.scales_and_offsets() for part in parts), strict=True)
    return torch.cat([part.integers() for part in parts]), torch.cat(scales), torch.cat(offsets)


def _need_numba(format: str) -> None:
    from specsample.native import jit

    if not jit.available():
        raise RuntimeError(f"{format} weights need numba: pip install 'specsample[cpu]'")


def _channel_blocks(values: torch.Tensor, pad: int) -> torch.Tensor:
    """``[out, groups]`` per-group values as the dot-product kernels read them: float32
    ``[(out + pad) // 16, groups, 16]`` (``pad`` zero rows added)."""
    from specsample.native import dots

    padded = torch.nn.functional.pad(values.detach().to(torch.float32), (0, 0, 0, pad))
    return padded.reshape(-1, dots.CHANNELS, values.shape[1]).transpose(1, 2).contiguous()


def _channels(blocks: torch.Tensor, out_features: int) -> torch.Tensor:
    """The inverse of :func:`_channel_blocks`: ``[out_features, groups]``."""
    return blocks.transpose(1, 2).reshape(-1, blocks.shape[1])[:out_features]


def _dot_product(
    weight: QuantizedWeight,
    rows: torch.Tensor,
    kernels: tuple[Any, Any],
    tensors: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """``rows @ W^T`` by a kernel of :mod:`specsample.native.dots` (``kernels``: the serial
    one, taken where :func:`specsample.native.jit.threads` is 1, and the parallel one)
    reading ``tensors``."""
    from specsample.native import dots, jit

    if not rows.is_cpu:
        raise ValueError(f"{weight.format} weights run on the CPU, got x on {rows.device}")
    blocks = tensors[0].shape[0]
    out = torch.empty(rows.shape[0], blocks * dots.CHANNELS)
    codes = torch.empty(rows.numel(), dtype=torch.int8)
    kernel = kernels[0] if jit.threads() == 1 else kernels[1]
    addresses = (tensor.data_ptr() for tensor in tensors)
    kernel(
        rows.data_ptr(),
        rows.shape[0],
        weight.in_features,
        *addresses,
        blocks,
        out.data_ptr(),
        codes.data_ptr(),
    )
    return out[:, : weight.out_features] if out.shape[1] != weight.out_features else out


def _same(part: QuantizedWeight, kind: type[Any]) -> Any:
    if not isinstance(part, kind):
        raise TypeError(f"cannot join a {part.format} weight with {kind.format} ones")
    return part


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


def dot_products() -> bool:
    """Whether the formats of integer dot products (``"int4a8"``, ``"int8a8"``) are the
    faster ones here: numba is installed and the CPU has AVX512-VNNI
    (:func:`specsample.native.dots.fast`).

    Examples
    --------
    >>> isinstance(dot_products(), bool)
    True
    """
    from specsample.native import jit

    if not jit.available():
        return False
    from specsample.native import dots

    return dots.fast()


def int4_format() -> str:
    """The int4 format that is faster on this machine: ``"int4a8"`` where
    :func:`dot_products`, else ``"int4"``.

    Measured at one thread on a two-core AMD EPYC (Zen 5, AVX512-VNNI), the products of a
    135M-parameter Llama's layers (3072 x 576, 576 x 1536, 960 x 576, 576 x 576) with
    one / five rows: int4a8 2.8-3.8x / 2.1-2.7x faster than int4. Without VNNI the same
    integers by plain vector arithmetic ran 0.6-0.9x / 0.3-0.4x int4's speed there.

    Examples
    --------
    >>> int4_format() in ("int4", "int4a8")
    True
    """
    return "int4a8" if dot_products() else "int4"


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
