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
with ``i = sum q_j x8_j`` and no offset term (:func:`int8_int8_product`).

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


def group_intrinsics(vnni: bool) -> tuple[Any, Any]:
    """The numba intrinsics that add one group's terms to 16 float32 accumulators: for int4
    weights (:func:`int4_int8_product`) and for int8 ones (:func:`int8_int8_product`). Their
    integer dot products are made by ``vpdpbusd`` (``vnni``, on a CPU with AVX512-VNNI only)
    or by plain vector arithmetic; both give the same integers.

    In both, the weights are the unsigned bytes and the broadcast activations the signed
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

    address = types.int64

    @intrinsic
    def int4_terms(typingctx, weights, activations, scales, offsets, out, d, t, first):  # type: ignore[no-untyped-def]
        """``out[0:16] (+)= float(sum q x8 - 8 t) * (s * d) + z * (d * t)`` for one group
        of one block: ``weights`` (256 bytes), ``activations`` (32 int8), ``scales``,
        ``offsets`` and ``out`` (16 float32 each) by address."""
        signature = types.void(*[address] * 5, types.float32, types.int32, types.boolean)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            w_at, x_at, s_at, z_at, out_at, d, t, first_group = args
            packed = builder.inttoptr(w_at, bytes64.as_pointer())
            inputs = builder.inttoptr(x_at, word.as_pointer())
            low_mask, four = ir.Constant(bytes64, [15] * 64), ir.Constant(bytes64, [4] * 64)
            sums = zeros
            for part in range(4):
                block = builder.load(builder.gep(packed, [ir.Constant(word, part)]), align=1)
                nibbles = (builder.and_(block, low_mask), builder.lshr(block, four))
                for half, weights in enumerate(nibbles):
                    at = builder.gep(inputs, [ir.Constant(word, 2 * part + half)])
                    four_inputs = splat(builder, builder.load(at, align=1), words16)
                    sums = dot(builder, sums, builder.bitcast(weights, words16), four_inputs)
            exact = builder.sub(sums, splat(builder, builder.mul(t, ir.Constant(word, 8)), words16))
            d_t = builder.fmul(d, builder.sitofp(t, single))
            term = builder.fadd(
                scaled(builder, exact, vector(builder, s_at, floats16), d),
                builder.fmul(vector(builder, z_at, floats16), splat(builder, d_t, floats16)),
            )
            accumulate(builder, term, out_at, first_group)
            return context.get_dummy_value()

        return signature, codegen

    @intrinsic
    def int8_terms(typingctx, weights, activations, scales, out, d, t, first):  # type: ignore[no-untyped-def]
        """``out[0:16] (+)= float(sum (q + 128) x8 - 128 t) * (s * d)`` for one group of one
        block: ``weights`` (512 bytes ``q + 128``), ``activations`` (32 int8), ``scales``
        and ``out`` (16 float32 each) by address."""
        signature = types.void(*[address] * 4, types.float32, types.int32, types.boolean)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            w_at, x_at, s_at, out_at, d, t, first_group = args
            packed = builder.inttoptr(w_at, words16.as_pointer())
            inputs = builder.inttoptr(x_at, word.as_pointer())
            sums = zeros
            for part in range(8):
                weights = builder.load(builder.gep(packed, [ir.Constant(word, part)]), align=1)
                at = builder.gep(inputs, [ir.Constant(word, part)])
                sums = dot(
                    builder, sums, weights, splat(builder, builder.load(at, align=1), words16)
                )
            shift = splat(builder, builder.mul(t, ir.Constant(word, 128)), words16)
            term = scaled(builder, builder.sub(sums, shift), vector(builder, s_at, floats16), d)
            accumulate(builder, term, out_at, first_group)
            return context.get_dummy_value()

        return signature, codegen

    return int4_terms, int8_terms


_int4_terms, _int8_terms = group_intrinsics(fast())


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
def int4_int8_product(
    x: int,
    rows: int,
    inputs: int,
    weights: int,
    scales: int,
    offsets: int,
    blocks: int,
    out: int,
    codes: int,
) -> None:
    """``out [rows, blocks * 16] = x [rows, inputs] @ W^T`` (float32, both contiguous, by
    address) for int4 weights laid out by :func:`pack` at ``weights`` (uint8 ``[blocks,
    inputs // 32, 256]``), ``scales`` and ``offsets`` (float32 ``[blocks, inputs // 32,
    16]``); ``codes`` (``[rows * inputs]`` int8, by address) is room for the activations'
    codes, kept alive by the caller as every other tensor. Blocks of output channels in
    parallel."""
    groups = inputs // GROUP
    steps, totals = _quantize_rows(x, rows, inputs, codes)
    for b in prange(blocks):
        for r in range(rows):
            target = out + 4 * (r * blocks + b) * CHANNELS
            for g in range(groups):
                at = b * groups + g
                _int4_terms(
                    weights + at * _INT4_BYTES,
                    codes + r * inputs + g * GROUP,
                    scales + 4 * CHANNELS * at,
                    offsets + 4 * CHANNELS * at,
                    target,
                    steps[r * groups + g],
                    totals[r * groups + g],
                    g == 0,
                )


int4_int8_product_serial = serial(int4_int8_product)
"""The serial twin of :func:`int4_int8_product`."""


@njit(parallel=True)
def int8_int8_product(
    x: int, rows: int, inputs: int, weights: int, scales: int, blocks: int, out: int, codes: int
) -> None:
    """``out [rows, blocks * 16] = x [rows, inputs] @ W^T`` (float32, both contiguous, by
    address) for int8 weights laid out by :func:`pack8` at ``weights`` (uint8 ``[blocks,
    inputs // 32, 512]``) and ``scales`` (float32 ``[blocks, inputs // 32, 16]``), ``codes``
    as for :func:`int4_int8_product`. Blocks of output channels in parallel."""
    groups = inputs // GROUP
    steps, totals = _quantize_rows(x, rows, inputs, codes)
    for b in prange(blocks):
        for r in range(rows):
            target = out + 4 * (r * blocks + b) * CHANNELS
            for g in range(groups):
                at = b * groups + g
                _int8_terms(
                    weights + at * _INT8_BYTES,
                    codes + r * inputs + g * GROUP,
                    scales + 4 * CHANNELS * at,
                    target,
                    steps[r * groups + g],
                    totals[r * groups + g],
                    g == 0,
                )


int8_int8_product_serial = serial(int8_int8_product)
"""The serial twin of :func:`int8_int8_product`."""


def pack8(integers: np.ndarray) -> np.ndarray:
    """Lay out ``[out, inputs]`` int8 integers (``out`` a multiple of 16, ``inputs`` of 32)
    as :func:`int8_int8_product` reads them: ``[out // 16, inputs // 32, 512]`` uint8, each
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
    ``inputs`` of 32) as :func:`int4_int8_product` reads them: ``[out // 16, inputs // 32,
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
