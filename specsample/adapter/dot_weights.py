"""Weight-only formats applied by integer dot products of our own
(:mod:`specsample.adapter.int_products`), beside PyTorch's of
:mod:`specsample.adapter.weight_formats`.

``"int4a8"`` (:class:`Int4Int8Weight`)
    The int4 weights of :class:`~specsample.adapter.weight_formats.Int4Weight` with float32
    scales and offsets, applied to activations quantized to int8 per group of 32, as
    llama.cpp applies a GGUF file's 4-bit blocks. Three quarters of a byte per weight.
``"int8a8"`` (:class:`Int8Int8Weight`)
    Eight-bit integers in groups of 32 inputs with a float32 scale each (GGUF's ``Q8_0``),
    applied the same way. A byte and an eighth per weight.

Both take and return float32 and compute each row alone (bit for bit the same whatever
other rows share the call); they need numba. :func:`dot_products` says whether they are the
faster formats on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from specsample.adapter.weight_formats import (
    GROUP_SIZE,
    QuantizedWeight,
    affine_groups,
    check_int4,
    int4_parts,
    int4_values,
    same_format,
    symmetric_groups,
)
from specsample.kernels.cpu import compiler


def dot_products() -> bool:
    """Whether the formats of integer dot products (``"int4a8"``, ``"int8a8"``) are the
    faster ones here: numba is installed and the CPU has AVX512-VNNI
    (:func:`specsample.adapter.int_products.fast`).

    Examples
    --------
    >>> isinstance(dot_products(), bool)
    True
    """
    if not compiler.available():
        return False
    from specsample.adapter import int_products as dots

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


class Int4Int8Weight(QuantizedWeight):
    """Int4 weights in groups of 32 inputs with a float32 scale and offset, applied to
    activations quantized to int8 per group of 32 (:mod:`specsample.adapter.int_products`, which
    gives the arithmetic); float32 in and out.

    The weight is ``w = (q - 8) * s + z`` with ``q`` in ``0..15``, as for
    :class:`Int4Weight`, but ``s`` and ``z`` keep float32 (a GGUF file's float16 values
    exactly) and the product quantizes each row's inputs as llama.cpp does. Needs numba
    (``pip install specsample[cpu]``); on a CPU without AVX512-VNNI it runs, slower than
    :class:`Int4Weight` (:func:`specsample.adapter.int_products.fast`). Runs on the calling thread
    where one thread is allowed (:func:`specsample.kernels.cpu.compiler.threads`), else on numba's
    threads; not traceable by :func:`torch.compile`.

    Parameters
    ----------
    integers : torch.Tensor
        ``[out_features, in_features]`` integers in ``0..15`` (any integer dtype).
    scales, offsets : torch.Tensor
        ``[out_features, in_features // 32]`` float (held as float32).

    Examples
    --------
    >>> weight = Int4Int8Weight(torch.full((16, 32), 9), torch.ones(16, 1), torch.zeros(16, 1))
    >>> weight.dequantize()[0, :2].tolist()
    [1.0, 1.0]
    >>> x = torch.zeros(1, 32)
    >>> x[0, :2] = torch.tensor([1.0, 0.25])
    >>> round(float(weight(x)[0, 0]) * 127)  # 0.25 taken as 32 steps of 1 / 127
    159
    """

    format = "int4a8"
    dtype = torch.float32
    stored = ("packed", "scales", "offsets")
    group = GROUP_SIZE

    def __init__(self, integers: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> None:
        dots = _dots(self.format)
        check_int4(integers, scales, offsets, GROUP_SIZE)
        self.out_features, self.in_features = integers.shape
        pad = -self.out_features % dots.CHANNELS
        padded = torch.nn.functional.pad(integers.to(torch.uint8), (0, 0, 0, pad), value=8)
        self.packed = torch.from_numpy(dots.pack(padded.numpy()))
        self.scales = _channel_blocks(scales, pad, dots.CHANNELS)
        self.offsets = _channel_blocks(offsets, pad, dots.CHANNELS)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int4Int8Weight:
        """Asymmetric quantization per group of 32 inputs, the scales and offsets in float32
        (:func:`affine_groups`, which raises a :class:`ValueError` unless 32 divides
        ``in_features``).
        """
        return cls(*affine_groups(weight, GROUP_SIZE, torch.float32))

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        return _dot_product(self, rows, (self.packed, self.scales, self.offsets))

    def integers(self) -> torch.Tensor:
        """``q``, ``[out_features, in_features]`` int32 in ``0..15``."""
        dots = _dots(self.format)
        unpacked = torch.from_numpy(dots.unpack(self.packed.numpy()))
        return unpacked[: self.out_features].to(torch.int32)

    def scales_and_offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``s`` and ``z``: ``[out_features, in_features // 32]`` float32 each."""
        return _channels(self.scales, self.out_features), _channels(self.offsets, self.out_features)

    def dequantize(self) -> torch.Tensor:
        return int4_values(self)

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        dots = _dots(cls.format)
        pieces = [same_format(part, cls) for part in parts]
        if all(part.out_features % dots.CHANNELS == 0 for part in pieces[:-1]):
            joined = object.__new__(cls)
            joined.in_features = pieces[0].in_features
            joined.out_features = sum(part.out_features for part in pieces)
            joined.packed = torch.cat([part.packed for part in pieces])
            joined.scales = torch.cat([part.scales for part in pieces])
            joined.offsets = torch.cat([part.offsets for part in pieces])
            return joined
        return cls(*int4_parts(pieces))


class Int8Int8Weight(QuantizedWeight):
    """Int8 weights in groups of 32 inputs with a float32 scale each (GGUF's ``Q8_0``),
    applied to activations quantized to int8 per group of 32
    (:mod:`specsample.adapter.int_products`);
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
    stored = ("packed", "scales")

    def __init__(self, integers: torch.Tensor, scales: torch.Tensor) -> None:
        dots = _dots(self.format)
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
        self.scales = _channel_blocks(scales, pad, dots.CHANNELS)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Int8Weight:
        """Symmetric quantization per group of 32: ``s = max |w| / 127``, ``q = round(w /
        s)``, as GGUF's ``Q8_0`` but ``s`` in float32 (:func:`symmetric_groups`; a
        :class:`ValueError` where 32 does not divide ``in_features``).
        """
        return cls(*symmetric_groups(weight, GROUP_SIZE, torch.float32))

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        return _dot_product(self, rows, (self.packed, self.scales, None))

    def integers(self) -> torch.Tensor:
        """``q``, ``[out_features, in_features]`` int8."""
        unpacked = _dots(self.format).unpack8(self.packed.numpy())
        return torch.from_numpy(unpacked)[: self.out_features]

    def dequantize(self) -> torch.Tensor:
        steps = self.integers().to(torch.float32).reshape(self.out_features, -1, GROUP_SIZE)
        return (steps * _channels(self.scales, self.out_features)[..., None]).reshape(
            self.out_features, self.in_features
        )

    @classmethod
    def join(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        pieces = [same_format(part, cls) for part in parts]
        return cls(
            torch.cat([part.integers() for part in pieces]),
            torch.cat([_channels(part.scales, part.out_features) for part in pieces]),
        )


def _dots(format: str) -> ModuleType:
    """:mod:`specsample.adapter.int_products`, imported once numba is known to be installed (without
    it, a :class:`RuntimeError` that says so: the module cannot be imported then) and its
    kernels compiled: the first call compiles every CPU kernel, announced, or loads them
    (:func:`specsample.kernels.cpu.compiler.ready`), so that no product compiles behind its
    caller."""
    if not compiler.available():
        raise RuntimeError(f"{format} weights need numba: pip install 'specsample[cpu]'")
    if not compiler.ready():
        raise RuntimeError(f"{format} weights need the CPU kernels, which did not compile")
    from specsample.adapter import int_products as dots

    return dots


def _channel_blocks(values: torch.Tensor, pad: int, channels: int) -> torch.Tensor:
    """``[out, groups]`` per-group values as the dot-product kernels read them: float32
    ``[(out + pad) // channels, groups, channels]`` (``pad`` zero rows added)."""
    padded = torch.nn.functional.pad(values.detach().to(torch.float32), (0, 0, 0, pad))
    return padded.reshape(-1, channels, values.shape[1]).transpose(1, 2).contiguous()


def _channels(blocks: torch.Tensor, out_features: int) -> torch.Tensor:
    """The inverse of :func:`_channel_blocks`: ``[out_features, groups]``."""
    return blocks.transpose(1, 2).reshape(-1, blocks.shape[1])[:out_features]


def _dot_product(
    weight: QuantizedWeight,
    rows: torch.Tensor,
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> torch.Tensor:
    """``rows @ W^T`` by :func:`specsample.adapter.int_products.int_product` (its serial twin where
    :func:`specsample.kernels.cpu.compiler.threads` is 1) on the weights, scales and offsets
    ``tensors`` (offsets ``None`` for int8 weights): ``[rows, out_features]`` float32.

    The kernel reads every tensor by its address: ``rows`` of another dtype or layout are
    first made float32 and contiguous, and the result is made like them (float32), not of
    PyTorch's default dtype."""
    dots = _dots(weight.format)
    if not rows.is_cpu:
        raise ValueError(f"{weight.format} weights run on the CPU, got x on {rows.device}")
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.to(torch.float32).contiguous()
    packed, scales, offsets = tensors
    blocks = packed.shape[0]
    out = rows.new_empty(rows.shape[0], blocks * dots.CHANNELS)
    codes = torch.empty(rows.numel(), dtype=torch.int8)
    kernel = dots.int_product_serial if compiler.threads() == 1 else dots.int_product
    kernel(
        rows.data_ptr(),
        rows.shape[0],
        weight.in_features,
        packed.data_ptr(),
        scales.data_ptr(),
        None if offsets is None else offsets.data_ptr(),
        blocks,
        out.data_ptr(),
        codes.data_ptr(),
    )
    return out[:, : weight.out_features] if out.shape[1] != weight.out_features else out
