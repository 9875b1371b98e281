"""Products of 4-bit and 8-bit weights with 8-bit activations, by integer dot products.

This is how llama.cpp multiplies a GGUF file's 4-bit blocks: each group of 32 inputs of an
activation row is quantized to int8 with a float scale, each group of 32 weights holds
integers ``q`` in ``0..15`` with a float scale ``s`` and offset ``z`` (``w = (q - 8) s +
z``, :func:`~specsample.adapter.gguf_quants.int4_groups`), and the group's product is one
integer dot product ``sum q x`` turned into a float at the end. On a CPU with AVX512-VNNI
the dot product of 64 byte pairs is one instruction (``vpdpbusd``); elsewhere the same
integers are computed by plain vector arithmetic (slower than PyTorch's int4 product,
:func:`fast` says which).

The arithmetic, for a row ``x`` and output channel ``c``, group by group in order:

- ``m = max |x_j|`` over the group, ``d = m / 127`` (float32), ``x8_j = rint(x_j * (1 /
  d))`` (0 where ``d = 0``), ``t = sum x8_j`` (int);
- ``i = sum q_j x8_j - 8 t`` (int32, exact);
- ``acc = acc + (float(i) * (s * d) + z * (d * float(t)))``, each operation rounded to
  float32 (no fused multiply-add), ``acc`` starting at the first group's term.

Every row is computed alone, the same way whatever other rows share the call, and the
threads split output channels, not sums: the result is bit for bit the same for any batch
and any thread count. ``tests/test_native_dots.py`` checks it against a NumPy replica of
these steps.

Int8 weights (GGUF's ``Q8_0``: ``w = q s``, ``q`` in ``-128..127``) take the same steps
with ``i = sum q_j x8_j`` and no offset term (:func:`int_product` without offsets).

The weights are laid out for the instruction: 16 output channels by 32 inputs take 256
bytes, in four parts of eight inputs; in a part, channel ``c`` holds four bytes whose low
nibbles are inputs 0-3 of the part and high nibbles inputs 4-7 (:func:`pack`). Int8
weights take 512 bytes, in eight parts of four inputs (:func:`pack8`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from specsample.native.jit import njit, prange, serial
from specsample.native.memory import load, store

CHANNELS = 16
"""Output channels per block of the layout (one 512-bit vector of int32 sums)."""

GROUP = 32
"""Inputs per group: one scale and offset of the weights, one scale of the activations."""

_INT4_BYTES = CHANNELS * GROUP // 2
_INT8_BYTES = CHANNELS * GROUP


@functools.cache
def fast() -> bool:
    """Whether this CPU computes the dot products with one instruction each (AVX512-VNNI).

    Examples
    --------
    >>> isinstance(fast(), bool)
    True
    """
    import llvmlite.binding

    return bool(llvmlite.binding.get_host_cpu_features().get("avx512vnni", False))


def group_intrinsic(vnni: bool) -> Any:
    """The numba intrinsic that adds one group's terms to 16 float32 accumulators, for int4
    weights (given their offsets) or int8 ones (offsets ``None``; numba compiles each case
    apart). Its integer dot products are made by ``vpdpbusd`` (``vnni``, on a CPU with
    AVX512-VNNI only) or by plain vector arithmetic; both give the same integers.

    In both cases the weights are the unsigned bytes and the broadcast activations the signed
    ones (int8 weights are stored plus 128, and ``128 t`` taken off the sum): with the
    broadcast in the unsigned operand, LLVM 20 gave wrong sums for all but the first
    channel, and spent minutes on a ``xor`` of it."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    byte, word, single = ir.IntType(8), ir.IntType(32), ir.FloatType()
    bytes64, words16, floats16 = (
        ir.VectorType(byte, 64),
        ir.VectorType(word, 16),
        ir.VectorType(single, 16),
    )
    zeros = ir.Constant(words16, [0] * CHANNELS)

    def splat(builder, value, vector):  # type: ignore[no-untyped-def]
        one = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(word, 0))
        return builder.shuffle_vector(one, ir.Constant(vector, None), zeros)

    def dot(builder, sums, unsigned, signed):  # type: ignore[no-untyped-def]
        """``sums[c] += sum_t unsigned[4c + t] * signed[4c + t]`` over bytes (``<16 x i32>``
        each)."""
        if vnni:
            kind = ir.FunctionType(words16, [words16] * 3)
            vpdpbusd = cgutils.get_or_insert_function(
                builder.module, kind, "llvm.x86.avx512.vpdpbusd.512"
            )
            return builder.call(vpdpbusd, [sums, unsigned, signed])
        wide = ir.VectorType(word, 64)
        products = builder.mul(
            builder.zext(builder.bitcast(unsigned, bytes64), wide),
            builder.sext(builder.bitcast(signed, bytes64), wide),
        )
        for t in range(4):
            lanes = ir.Constant(words16, [4 * c + t for c in range(CHANNELS)])
            sums = builder.add(sums, builder.shuffle_vector(products, products, lanes))
        return sums

    def vector(builder, address, kind):  # type: ignore[no-untyped-def]
        return builder.load(builder.inttoptr(address, kind.as_pointer()), align=1)

    def accumulate(builder, term, out_at, first):  # type: ignore[no-untyped-def]
        """``out[0:16] = term`` for the first group, else ``out[0:16] += term``."""
        target = builder.inttoptr(out_at, floats16.as_pointer())
        with builder.if_else(first) as (then, otherwise):
            with then:
                builder.store(term, target, align=1)
            with otherwise:
                builder.store(builder.fadd(builder.load(target, align=1), term), target, align=1)

    def scaled(builder, exact, scale, d):  # type: ignore[no-untyped-def]
        """``float(exact) * (scale * d)``, 16 lanes."""
        return builder.fmul(
            builder.sitofp(exact, floats16), builder.fmul(scale, splat(builder, d, floats16))
        )

    address, index = types.int64, types.int64

    @intrinsic
    def group_terms(typingctx, weights, activations, scales, offsets, at, out, d, t, first):  # type: ignore[no-untyped-def]
        """``out[0:16] (+)= float(sum q x8 - 8 t) * (s * d) + z * (d * t)`` (int4 weights,
        256 bytes a group) or ``float(sum (q + 128) x8 - 128 t) * (s * d)`` (int8 weights
        stored plus 128, 512 bytes; ``offsets`` ``None``) for group ``at`` of the weights,
        scales and offsets (16 float32 a group) from their addresses; ``activations`` (32
        int8) and ``out`` (16 float32) by address."""
        four_bit = not isinstance(offsets, types.NoneType)
        signature = types.void(
            address, address, address, offsets, index, address, types.float32, types.int32,
            types.boolean,
        )  # fmt: skip
        size, shift = (_INT4_BYTES, 8) if four_bit else (_INT8_BYTES, 128)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            w_base, x_at, s_base, z_base, group, out_at, d, t, first_group = args

            def element(base, bytes_per_group):  # type: ignore[no-untyped-def]
                return builder.add(
                    base, builder.mul(group, ir.Constant(base.type, bytes_per_group))
                )

            packed = builder.inttoptr(element(w_base, size), bytes64.as_pointer())
            blocks = [
                builder.load(builder.gep(packed, [ir.Constant(word, part)]), align=1)
                for part in range(size // 64)
            ]
            if four_bit:
                low_mask, four = ir.Constant(bytes64, [15] * 64), ir.Constant(bytes64, [4] * 64)
                blocks = [
                    half
                    for block in blocks
                    for half in (builder.and_(block, low_mask), builder.lshr(block, four))
                ]
            inputs = builder.inttoptr(x_at, word.as_pointer())
            sums = zeros
            for part, block in enumerate(blocks):
                at = builder.gep(inputs, [ir.Constant(word, part)])
                four_inputs = splat(builder, builder.load(at, align=1), words16)
                sums = dot(builder, sums, builder.bitcast(block, words16), four_inputs)
            shifted = splat(builder, builder.mul(t, ir.Constant(word, shift)), words16)
            scale = vector(builder, element(s_base, 4 * CHANNELS), floats16)
            term = scaled(builder, builder.sub(sums, shifted), scale, d)
            if four_bit:
                d_t = builder.fmul(d, builder.sitofp(t, single))
                offset = vector(builder, element(z_base, 4 * CHANNELS), floats16)
                term = builder.fadd(term, builder.fmul(offset, splat(builder, d_t, floats16)))
            accumulate(builder, term, out_at, first_group)
            return context.get_dummy_value()

        return signature, codegen

    return group_terms


_group_terms = group_intrinsic(fast())


@njit(inline="always")
def _quantize_group(x: int, at: int, codes: int) -> tuple[np.float32, int]:
    """Quantize the 32 float32 inputs from element ``at`` past address ``x`` into the int8
    elements ``at .. at + 31`` past address ``codes``: their scale ``d`` and the sum of the
    codes."""
    largest = np.float32(0)
    for j in range(GROUP):
        largest = max(largest, abs(load(x, at + j, np.float32(0))))
    d = largest / np.float32(127)
    inverse = np.float32(1) / d if d > 0 else np.float32(0)
    total = 0
    for j in range(GROUP):
        code = int(np.rint(load(x, at + j, np.float32(0)) * inverse))
        store(codes, at + j, np.int8(code))
        total += code
    return d, total


@njit(inline="always")
def _quantize_rows(x: int, rows: int, inputs: int, codes: int) -> tuple[np.ndarray, np.ndarray]:
    """Write the int8 codes of ``x [rows, inputs]`` (float32 by address) to ``codes``
    (``[rows * inputs]`` int8 by address); per group (``[rows * inputs // 32]`` each) their
    scale and the sum of their codes."""
    groups = inputs // GROUP
    steps = np.empty(rows * groups, np.float32)
    totals = np.empty(rows * groups, np.int32)
    for r in range(rows):
        for g in range(groups):
            at = r * inputs + g * GROUP
            steps[r * groups + g], totals[r * groups + g] = _quantize_group(x, at, codes)
    return steps, totals


@njit(parallel=True)
def int_product(
    x: int,
    rows: int,
    inputs: int,
    weights: int,
    scales: int,
    offsets: int | None,
    blocks: int,
    out: int,
    codes: int,
) -> None:
    """``out [rows, blocks * 16] = x [rows, inputs] @ W^T`` (float32, both contiguous, by
    address), blocks of output channels in parallel, for

    - int4 weights laid out by :func:`pack` at ``weights`` (uint8 ``[blocks, inputs // 32,
      256]``), their ``scales`` and ``offsets`` (float32 ``[blocks, inputs // 32, 16]``);
    - or int8 weights laid out by :func:`pack8` (uint8 ``[blocks, inputs // 32, 512]``) and
      their ``scales``, ``offsets`` ``None``.

    ``codes`` (``[rows * inputs]`` int8, by address) is room for the activations' codes,
    kept alive by the caller as every other tensor."""
    groups = inputs // GROUP
    steps, totals = _quantize_rows(x, rows, inputs, codes)
    for b in prange(blocks):
        for r in range(rows):
            target = out + 4 * (r * blocks + b) * CHANNELS
            for g in range(groups):
                _group_terms(
                    weights,
                    codes + r * inputs + g * GROUP,
                    scales,
                    offsets,
                    b * groups + g,
                    target,
                    steps[r * groups + g],
                    totals[r * groups + g],
                    g == 0,
                )


int_product_serial = serial(int_product)
"""The serial twin of :func:`int_product`."""


def pack8(integers: np.ndarray) -> np.ndarray:
    """Lay out ``[out, inputs]`` int8 integers (``out`` a multiple of 16, ``inputs`` of 32)
    as :func:`int_product` reads them: ``[out // 16, inputs // 32, 512]`` uint8, each
    ``q + 128``; in a group, channel ``c`` holds inputs ``4p .. 4p + 3`` at bytes ``64 p +
    4 c``.

    Examples
    --------
    >>> q = np.arange(32, dtype=np.int8).reshape(1, 32).repeat(16, 0)
    >>> packed = pack8(q)
    >>> packed.shape, packed[0, 0, :6].tolist()
    ((1, 1, 512), [128, 129, 130, 131, 128, 129])
    """
    out, inputs = integers.shape
    if out % CHANNELS or inputs % GROUP:
        raise ValueError(f"integers must be [16 m, 32 n], got {tuple(integers.shape)}")
    shifted = (integers.astype(np.int16) + 128).astype(np.uint8)
    grouped = shifted.reshape(out // CHANNELS, CHANNELS, inputs // GROUP, 8, 4)
    return np.ascontiguousarray(grouped.transpose(0, 2, 3, 1, 4)).reshape(
        out // CHANNELS, inputs // GROUP, _INT8_BYTES
    )


def unpack8(packed: np.ndarray) -> np.ndarray:
    """The integers :func:`pack8` laid out, ``[out, inputs]`` int8.

    Examples
    --------
    >>> q = np.random.default_rng(0).integers(-128, 128, (32, 64), dtype=np.int8)
    >>> bool((unpack8(pack8(q)) == q).all())
    True
    """
    blocks, groups, _ = packed.shape
    parts = packed.reshape(blocks, groups, 8, CHANNELS, 4)
    both = np.ascontiguousarray(parts.transpose(0, 3, 1, 2, 4)).reshape(
        blocks * CHANNELS, groups * GROUP
    )
    return (both.astype(np.int16) - 128).astype(np.int8)


def pack(integers: np.ndarray) -> np.ndarray:
    """Lay out ``[out, inputs]`` integers in ``0..15`` (``out`` a multiple of 16,
    ``inputs`` of 32) as :func:`int_product` reads them: ``[out // 16, inputs // 32,
    256]`` uint8.

    Examples
    --------
    >>> q = np.arange(32, dtype=np.uint8).reshape(1, 32).repeat(16, 0) % 16
    >>> packed = pack(q)
    >>> packed.shape, hex(packed[0, 0, 0]), hex(packed[0, 0, 4])
    ((1, 1, 256), '0x40', '0x40')
    """
    out, inputs = integers.shape
    if out % CHANNELS or inputs % GROUP:
        raise ValueError(f"integers must be [16 m, 32 n], got {tuple(integers.shape)}")
    parts = integers.astype(np.uint8).reshape(out // CHANNELS, CHANNELS, inputs // GROUP, 4, 2, 4)
    parts = parts.transpose(0, 2, 3, 1, 5, 4)
    return np.ascontiguousarray(parts[..., 0] | (parts[..., 1] << 4)).reshape(
        out // CHANNELS, inputs // GROUP, _INT4_BYTES
    )


def unpack(packed: np.ndarray) -> np.ndarray:
    """The integers :func:`pack` laid out, ``[out, inputs]`` uint8.

    Examples
    --------
    >>> q = np.random.default_rng(0).integers(0, 16, (32, 64), dtype=np.uint8)
    >>> bool((unpack(pack(q)) == q).all())
    True
    """
    blocks, groups, _ = packed.shape
    parts = packed.reshape(blocks, groups, 4, CHANNELS, 4)
    both = np.stack([parts & 15, parts >> 4], axis=-1)
    return np.ascontiguousarray(both.transpose(0, 3, 1, 2, 5, 4)).reshape(
        blocks * CHANNELS, groups * GROUP
    )
