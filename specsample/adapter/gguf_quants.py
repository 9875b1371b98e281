"""Decoding GGUF tensor data to float32, one block format per GGML type.

A GGUF tensor is a run of blocks, each holding a fixed count of values in a fixed count of
bytes: one value for the plain floats (``F32``, ``F16``, ``BF16``); 32 for ``Q8_0``,
``Q4_0``, ``Q4_1``, ``Q5_0`` and ``Q5_1`` (integers with a float16 scale ``d``, and an
offset ``m`` for the ``_1`` types); 256 for the k-quants ``Q2_K`` to ``Q6_K`` (sub-blocks
of 16 or 32 integers, each with its own scale, and minimum for ``Q2_K``, ``Q4_K`` and
``Q5_K``, both relative to float16 ``d`` and ``dmin``). :data:`FORMATS` gives each type's
block shape and decoder; :func:`dequantize` decodes a tensor's bytes into a float32 array,
a slice of blocks at a time, with NumPy's vectorised operations. :func:`int4_groups` reads
the 4-bit types (``Q4_0``, ``Q4_1``, ``Q4_K``) as integers with a scale and an offset per
group of 32 instead, for :class:`specsample.adapter.weight_formats.Int4Weight`.

Every decoder first writes a block's integers into the output, then scales them in place,
in float32 and in the order of ggml's reference (``d * q + m``,
``(d * scale) * q - (dmin * min)``): the values are bit for bit those of the ``gguf``
package's ``dequantize``. A new type is a decoder ``(blocks, out)`` and a :data:`FORMATS`
entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

_CHUNK_VALUES = 1 << 16
"""How many values :func:`dequantize` decodes at once: the work of one slice stays in cache."""

_SHIFTS_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
_SHIFTS_1BIT = np.arange(8, dtype=np.uint8)[:, None]

Decoder = Callable[[np.ndarray, np.ndarray], None]
"""Fills ``out`` (blocks x values, float32) with the values of ``blocks`` (blocks x bytes)."""

_Integers = Callable[[np.ndarray, np.ndarray, int], None]
"""Writes the integers of ``blocks`` from a byte (the last argument) on into ``out``."""


class BlockFormat(NamedTuple):
    """How a GGML type stores its values (:data:`FORMATS`).

    Attributes
    ----------
    values : int
        Values per block.
    size : int
        Bytes per block.
    decode : Decoder
        Writes the float32 values of a 2-D array of blocks into a 2-D array of values.
    """

    values: int
    size: int
    decode: Decoder


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of each block, as a float32 column."""
    return blocks[:, start : start + 2].view("<f2").astype(np.float32)


def _nibbles(packed: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
    """Write the low and the high four bits of each byte of ``packed`` to ``low`` and ``high``."""
    np.bitwise_and(packed, 15, out=low)
    np.right_shift(packed, 4, out=high)


def _bits(packed: np.ndarray, shifts: np.ndarray, mask: int) -> np.ndarray:
    """``(packed >> shift) & mask`` for each shift: a new axis before the last one."""
    return (packed[..., None, :] >> shifts) & np.uint8(mask)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and minimums of a ``Q4_K`` or ``Q5_K`` block's 12 bytes."""
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    high = np.uint8(0xC0)
    scales = np.concatenate([first & 63, (third & 15) | ((first & high) >> 2)], axis=1)
    minimums = np.concatenate([second & 63, (third >> 4) | ((second & high) >> 2)], axis=1)
    return scales, minimums


def _f32(blocks: np.ndarray, out: np.ndarray) -> None:
    out[...] = blocks.view("<f4")


def _f16(blocks: np.ndarray, out: np.ndarray) -> None:
    out[...] = blocks.view("<f2")


def _bf16(blocks: np.ndarray, out: np.ndarray) -> None:
    np.left_shift(blocks.view("<u2"), 16, out=out.view(np.uint32), dtype=np.uint32)


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    np.multiply(blocks[:, 2:].view(np.int8), _half(blocks, 0), out=out)


def _q4(blocks: np.ndarray, out: np.ndarray, start: int) -> None:
    """The 32 four-bit integers from byte ``start``: low nibbles first, then high ones."""
    _nibbles(blocks[:, start : start + 16], out[:, :16], out[:, 16:])


def _q5(blocks: np.ndarray, out: np.ndarray, start: int) -> None:
    """The 32 five-bit integers: four bytes of fifth bits from ``start``, then the nibbles."""
    _q4(blocks, out, start + 4)
    out += np.unpackbits(blocks[:, start : start + 4], axis=1, bitorder="little") << np.uint8(4)


def _centred(blocks: np.ndarray, out: np.ndarray, centre: int) -> None:
    """``d * (q - centre)``: the ``_0`` types, ``d`` a block's first two bytes."""
    out -= centre
    out *= _half(blocks, 0)


def _offset(blocks: np.ndarray, out: np.ndarray) -> None:
    """``d * q + m``: the ``_1`` types, ``d`` and ``m`` a block's first four bytes."""
    out *= _half(blocks, 0)
    out += _half(blocks, 2)


def _block32(integers: _Integers, centre: int | None) -> Decoder:
    """The decoder of a type of 32 values whose integers ``integers`` reads after the
    block's float16 header: ``d`` (the ``_0`` types, values ``d * (q - centre)``), or with
    ``centre`` ``None`` ``d`` and ``m`` (the ``_1`` types, ``d * q + m``)."""
    start = 4 if centre is None else 2

    def decode(blocks: np.ndarray, out: np.ndarray) -> None:
        integers(blocks, out, start)
        if centre is None:
            _offset(blocks, out)
        else:
            _centred(blocks, out, centre)

    return decode


def _scale_k(out: np.ndarray, scale: np.ndarray, offset: np.ndarray | None = None) -> None:
    """``out = out * scale - offset`` per sub-block (``scale``: blocks x sub-blocks)."""
    sub = out.reshape(scale.shape[0], scale.shape[1], -1)
    sub *= scale[:, :, None]
    if offset is not None:
        sub -= offset[:, :, None]


def _q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    scales = blocks[:, :16]
    quants = blocks[:, 16:80].reshape(-1, 2, 32)
    out.reshape(-1, 2, 4, 32)[...] = _bits(quants, _SHIFTS_2BIT, 3)
    scale, minimum = _half(blocks, 80) * (scales & 15), _half(blocks, 82) * (scales >> 4)
    _scale_k(out, scale, minimum)


def _q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    packed = blocks[:, 96:108]
    low = np.concatenate([packed[:, :8] & 15, packed[:, :8] >> 4], axis=1)
    high = _bits(packed[:, 8:], _SHIFTS_2BIT, 3).reshape(-1, 16)
    scales = (low | (high << np.uint8(4))).view(np.int8) - np.int8(32)
    grouped = out.reshape(-1, 8, 32)
    grouped[...] = _bits(blocks[:, 32:96].reshape(-1, 2, 32), _SHIFTS_2BIT, 3).reshape(-1, 8, 32)
    grouped -= (_bits(blocks[:, :32], _SHIFTS_1BIT, 1) ^ np.uint8(1)) << np.uint8(2)
    _scale_k(out, _half(blocks, 108) * scales)


def _q4_k_quants(blocks: np.ndarray, out: np.ndarray, start: int) -> None:
    """The 256 four-bit integers from byte ``start``: per 32 bytes, two sub-blocks' nibbles."""
    pairs = out.reshape(-1, 4, 2, 32)
    _nibbles(blocks[:, start : start + 128].reshape(-1, 4, 32), pairs[:, :, 0], pairs[:, :, 1])


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    _q4_k_quants(blocks, out, 16)
    scales, minimums = _k_scales(blocks[:, 4:16])
    _scale_k(out, _half(blocks, 0) * scales, _half(blocks, 2) * minimums)


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    _q4_k_quants(blocks, out, 48)
    out.reshape(-1, 8, 32)[...] += _bits(blocks[:, 16:48], _SHIFTS_1BIT, 1) << np.uint8(4)
    scales, minimums = _k_scales(blocks[:, 4:16])
    _scale_k(out, _half(blocks, 0) * scales, _half(blocks, 2) * minimums)


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    groups = out.reshape(-1, 2, 2, 2, 32)
    low = blocks[:, :128].reshape(-1, 2, 2, 32)
    _nibbles(low, groups[:, :, 0], groups[:, :, 1])
    high = _bits(blocks[:, 128:192].reshape(-1, 2, 32), _SHIFTS_2BIT, 3) << np.uint8(4)
    out.reshape(-1, 2, 4, 32)[...] += high
    out -= 32
    _scale_k(out, _half(blocks, 208) * blocks[:, 192:208].view(np.int8))


FORMATS: dict[str, BlockFormat] = {
    "F32": BlockFormat(1, 4, _f32),
    "F16": BlockFormat(1, 2, _f16),
    "BF16": BlockFormat(1, 2, _bf16),
    "Q8_0": BlockFormat(32, 34, _q8_0),
    "Q4_0": BlockFormat(32, 18, _block32(_q4, 8)),
    "Q4_1": BlockFormat(32, 20, _block32(_q4, None)),
    "Q5_0": BlockFormat(32, 22, _block32(_q5, 16)),
    "Q5_1": BlockFormat(32, 24, _block32(_q5, None)),
    "Q2_K": BlockFormat(256, 84, _q2_k),
    "Q3_K": BlockFormat(256, 110, _q3_k),
    "Q4_K": BlockFormat(256, 144, _q4_k),
    "Q5_K": BlockFormat(256, 176, _q5_k),
    "Q6_K": BlockFormat(256, 210, _q6_k),
}
"""The block format of each GGML type :func:`dequantize` decodes, by type name."""


INT4_KINDS = ("Q4_0", "Q4_1", "Q4_K")
"""The types whose values are 4-bit integers in groups of 32 with a scale and an offset per
group, which :func:`int4_groups` reads as such."""

INT4_GROUP = 32
"""Values per group of :func:`int4_groups`."""


def _q4_0_groups(blocks: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _q4(blocks, q, 2)
    scale = _half(blocks, 0)
    return scale, np.zeros_like(scale)


def _q4_1_groups(blocks: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _q4(blocks, q, 4)
    scale = _half(blocks, 0)
    return scale, _half(blocks, 2) + 8 * scale


def _q4_k_groups(blocks: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _q4_k_quants(blocks, q, 16)
    scales, minimums = _k_scales(blocks[:, 4:16])
    scale = _half(blocks, 0) * scales
    return scale, 8 * scale - _half(blocks, 2) * minimums


_INT4_DECODERS = {"Q4_0": _q4_0_groups, "Q4_1": _q4_1_groups, "Q4_K": _q4_k_groups}


def int4_groups(kind: str, data: np.ndarray, count: int) -> tuple[np.ndarray, ...]:
    """The integers of a 4-bit tensor and, per group of 32, a scale and an offset.

    The tensor's values are ``(q - 8) * scale + offset``, per group of :data:`INT4_GROUP`
    consecutive values: for ``Q4_0`` (``d * (q - 8)``) the scale is ``d`` and the offset
    0; for ``Q4_1`` (``d * q + m``) the scale is ``d`` and the offset ``m + 8 d``; for
    ``Q4_K`` (``(d * sc) * q - dmin * mn`` per sub-block of 32) the scale is ``d * sc``
    and the offset ``8 d sc - dmin * mn``. The integers are the file's own; scales and
    offsets are computed in float32 from its float16 ``d``, ``m``, ``dmin`` and 6-bit
    ``sc``, ``mn``.

    Parameters
    ----------
    kind : str
        One of :data:`INT4_KINDS`.
    data : numpy.ndarray
        The tensor's bytes (1-D uint8, :func:`tensor_bytes` long).
    count : int
        Its number of values.

    Returns
    -------
    tuple of numpy.ndarray
        ``(integers, scales, offsets)``: ``[count]`` uint8 in ``0..15``, and
        ``[count // 32]`` float32 each.

    Raises
    ------
    ValueError
        ``kind`` is not one of :data:`INT4_KINDS`, or ``data`` does not hold ``count``
        values.

    Examples
    --------
    >>> scale_and_min = np.array([0.5, -1.0], dtype=np.float16).view(np.uint8)
    >>> block = np.concatenate([scale_and_min, np.arange(16, dtype=np.uint8)])
    >>> q, scale, offset = int4_groups("Q4_1", block, 32)
    >>> q[[0, 1, 16, 17]].tolist(), scale.tolist(), offset.tolist()
    ([0, 1, 0, 0], [0.5], [3.0])
    """
    if kind not in _INT4_DECODERS:
        raise ValueError(f"kind must be one of {', '.join(INT4_KINDS)}, got {kind!r}")
    if tensor_bytes(kind, count) != data.size:
        raise ValueError(f"data must hold {tensor_bytes(kind, count)} bytes, got {data.size}")
    block = FORMATS[kind]
    integers = np.empty((count // block.values, block.values), dtype=np.uint8)
    scales, offsets = _INT4_DECODERS[kind](data.reshape(-1, block.size), integers)
    return integers.reshape(-1), scales.reshape(-1), offsets.reshape(-1)


def int8_groups(data: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The integers of a ``Q8_0`` tensor and, per group of 32, its scale: the values are
    ``q * d``, ``d`` the file's float16 (exact in float32).

    Parameters
    ----------
    data : numpy.ndarray
        The bytes of a ``Q8_0`` tensor (1-D uint8, :func:`tensor_bytes` long).
    count : int
        Its number of values, a multiple of 32.

    Returns
    -------
    tuple of numpy.ndarray
        ``(integers, scales)``: ``[count]`` int8 and ``[count // 32]`` float32.

    Raises
    ------
    ValueError
        ``data`` does not hold ``count`` values.

    Examples
    --------
    >>> scale = np.array([0.5], np.float16).view(np.uint8)
    >>> block = np.concatenate([scale, np.arange(32, dtype=np.uint8)])
    >>> q, scale = int8_groups(block, 32)
    >>> q[:3].tolist(), scale.tolist()
    ([0, 1, 2], [0.5])
    """
    if tensor_bytes("Q8_0", count) != data.size:
        raise ValueError(f"data must hold {tensor_bytes('Q8_0', count)} bytes, got {data.size}")
    blocks = data.reshape(-1, FORMATS["Q8_0"].size)
    return blocks[:, 2:].view(np.int8).reshape(-1).copy(), _half(blocks, 0).reshape(-1)


def tensor_bytes(kind: str, count: int) -> int:
    """Bytes that ``count`` values of type ``kind`` take.

    Raises
    ------
    ValueError
        ``kind`` is not in :data:`FORMATS`, or ``count`` is not a whole number of blocks.

    Examples
    --------
    >>> tensor_bytes("Q4_1", 64), tensor_bytes("F16", 3)
    (40, 6)
    """
    if kind not in FORMATS:
        raise ValueError(f"kind must be one of {', '.join(FORMATS)}, got {kind!r}")
    block = FORMATS[kind]
    if count % block.values:
        raise ValueError(f"count must be a multiple of {block.values} for {kind}, got {count}")
    return count // block.values * block.size


def dequantize(kind: str, data: np.ndarray, out: np.ndarray) -> None:
    """Decode the bytes of a tensor of type ``kind`` into ``out``, in place.

    Parameters
    ----------
    kind : str
        The tensor's type, a key of :data:`FORMATS` (``"Q4_1"``, ...).
    data : numpy.ndarray
        The tensor's bytes: 1-D, uint8, :func:`tensor_bytes` long.
    out : numpy.ndarray
        Where its values go: contiguous float32, as many elements as the tensor has.

    Raises
    ------
    ValueError
        ``kind`` is not a key of :data:`FORMATS`, or the sizes of ``data`` and ``out`` do
        not match.

    Examples
    --------
    >>> import numpy as np
    >>> scale_and_offset = np.array([0.5, -1.0], dtype=np.float16).view(np.uint8)
    >>> block = np.concatenate([scale_and_offset, np.arange(16, dtype=np.uint8)])
    >>> out = np.empty(32, dtype=np.float32)
    >>> dequantize("Q4_1", block, out)
    >>> out[[0, 1, 16, 17]].tolist()
    [-1.0, -0.5, -1.0, -1.0]
    """
    if tensor_bytes(kind, out.size) != data.size:
        raise ValueError(f"data must hold {tensor_bytes(kind, out.size)} bytes, got {data.size}")
    if out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("out must be a contiguous float32 array")
    block = FORMATS[kind]
    blocks, values = data.reshape(-1, block.size), out.reshape(-1, block.values)
    step = max(1, _CHUNK_VALUES // block.values)
    for start in range(0, len(blocks), step):
        block.decode(blocks[start : start + step], values[start : start + step])
