"""Attention whose result for a query does not depend on anything but that query's own slots.

:func:`attend` computes, for each sequence, head and query row, softmax attention over the
slots its additive mask allows, skipping the others, in one fixed order of operations:

- each allowed slot's score ``s_j = (q . k_j) * scale + mask_j``, the dot product over the
  head dimension in :data:`LANES` partial sums (lane ``l`` adds the products of dimensions
  ``l, l + 16, ...`` in order; a tail of fewer than 16 dimensions goes to the first lanes),
  then the lanes added pairwise in a fixed tree (lanes ``l`` and ``l + 8``, then ``l + 4``,
  ...);
- ``m`` the largest score, ``e_j = exp(s_j - m)`` by :func:`specsample.kernels.cpu.floats.exp32`;
- the sum of the ``e_j`` and the sum of the ``e_j v_j`` (each dimension apart), both in slot
  order, then their quotient.

A slot whose mask is below :data:`MASKED` adds nothing, not even a rounding: the result is
bit for bit the same whatever the cache's width, its masked slots (rejected drafts, left
padding), the other rows of the forward (how many queries it has, which sequences share the
batch) and the thread count (threads share out whole query rows, never a sum). A row that
sees no slot (a padding query) gets zeros.

Every operation is float32 and written out (no reassociation is allowed to the compiler), so
a loop the compiler vectorises computes what the same loop run one element at a time does.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from specsample.kernels.cpu.compiler import njit, prange, serial
from specsample.kernels.cpu.floats import exp32
from specsample.kernels.cpu.memory import load, row, store

LANES = 16
"""Partial sums of a dot product over the head dimension (one 512-bit vector of float32)."""

MASKED = np.float32(-1e30)
"""Mask values below this hide a slot (the loop's masks use float32's lowest value)."""

_NONE = np.float32(-np.inf)
"""The score of a hidden slot in the scratch row."""

_FLOATS = ir.VectorType(ir.FloatType(), LANES)


def _lanes(builder: ir.IRBuilder, address: ir.Value, at: ir.Value) -> ir.Value:
    """The 16 float32 elements from element ``at`` past ``address`` (``<16 x float>``)."""
    byte = builder.add(address, builder.mul(at, ir.Constant(at.type, 4)))
    return builder.load(builder.inttoptr(byte, _FLOATS.as_pointer()), align=4)


def _dot_codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
    """The code of :func:`_dot_lanes`: one vector of lanes, multiplied and added chunk by
    chunk, then halves added until one lane is left."""
    q_address, q_at, k_address, k_at, chunks = args
    sums = cgutils.alloca_once_value(builder, ir.Constant(_FLOATS, [0.0] * LANES))
    with cgutils.for_range(builder, chunks) as loop:
        step = builder.mul(loop.index, ir.Constant(chunks.type, LANES))
        q = _lanes(builder, q_address, builder.add(q_at, step))
        k = _lanes(builder, k_address, builder.add(k_at, step))
        builder.store(builder.fadd(builder.load(sums), builder.fmul(q, k)), sums)
    total = builder.load(sums)
    half = LANES // 2
    while half:
        total = builder.fadd(_part(builder, total, 0, half), _part(builder, total, half, half))
        half //= 2
    return builder.extract_element(total, ir.Constant(ir.IntType(32), 0))


def _part(builder: ir.IRBuilder, vector: ir.Value, start: int, length: int) -> ir.Value:
    """Lanes ``start .. start + length - 1`` of ``vector``, as a vector of ``length``."""
    lanes = ir.Constant(ir.VectorType(ir.IntType(32), length), list(range(start, start + length)))
    return builder.shuffle_vector(vector, vector, lanes)


@intrinsic
def _dot_lanes(typingctx, q_address, q_at, k_address, k_at, chunks):  # type: ignore[no-untyped-def]
    """``q . k`` over ``16 chunks`` float32 elements from element ``q_at`` past
    ``q_address`` and ``k_at`` past ``k_address``, in the order of :func:`_dot` (as
    vector operations)."""
    signature = types.float32(types.int64, types.int64, types.int64, types.int64, types.int64)
    return signature, _dot_codegen


@njit(inline="always")
def _dot(q: np.ndarray, k: np.ndarray, part: np.ndarray) -> np.float32:
    """``q . k`` (float32 ``[dim]`` each) in the fixed order of the module's docstring,
    ``part`` (``[LANES]`` float32) its scratch."""
    dim = q.shape[0]
    full = dim - dim % LANES
    for lane in range(LANES):
        part[lane] = np.float32(0.0)
    for start in range(0, full, LANES):
        for lane in range(LANES):
            part[lane] += q[start + lane] * k[start + lane]
    for d in range(full, dim):
        part[d - full] += q[d] * k[d]
    half = LANES // 2
    while half > 0:
        for lane in range(half):
            part[lane] += part[lane + half]
        half //= 2
    return part[0]  # type: ignore[no-any-return]


@njit(inline="always")
def _score(q: tuple[int, int], k: tuple[int, int], dim: int, part: np.ndarray) -> np.float32:
    """``q . k`` of the ``dim`` float32 elements at ``q`` and ``k`` (``(address, offset)``
    each): by vector operations where ``dim`` is a multiple of :data:`LANES`, else by
    :func:`_dot` (the same order)."""
    if dim % LANES == 0:
        return _dot_lanes(q[0], q[1], k[0], k[1], dim // LANES)  # type: ignore[call-arg]
    marker = np.float32(0)
    return _dot(row(q[0], q[1], dim, marker), row(k[0], k[1], dim, marker), part)


@njit(inline="always")
def _scores(
    q: tuple[int, int], keys: tuple[int, int], mask: tuple[int, int], shape: tuple[int, int],
    scale: np.float32, scores: np.ndarray, part: np.ndarray,
) -> np.float32:  # fmt: skip
    """Fill ``scores [width]`` with each slot's score (``-inf`` for a hidden slot) and return
    the largest (``-inf`` if every slot is hidden). ``q`` is ``(address, offset)`` of the
    query, ``keys`` of the first slot's key (slots ``dim`` elements apart), ``mask`` of its
    mask value (slots contiguous); ``shape`` is ``(width, dim)``."""
    width, dim = shape
    largest = _NONE
    for j in range(width):
        value = load(mask[0], mask[1] + j, np.float32(0))
        if value < MASKED:
            scores[j] = _NONE
            continue
        s = _score(q, (keys[0], keys[1] + j * dim), dim, part) * scale + value
        scores[j] = s
        largest = max(largest, s)
    return largest


@njit(inline="always")
def _weighted(
    scores: np.ndarray, largest: np.float32, values: tuple[int, int], out: tuple[int, int],
    scratch: tuple[np.ndarray, np.ndarray],
) -> None:  # fmt: skip
    """Write ``sum_j e_j v_j / sum_j e_j`` over the shown slots (``scores`` not ``-inf``),
    ``e_j = exp(s_j - largest)``, to the ``dim`` elements at ``out`` (``(address,
    offset)``; zeros where no slot shows); ``values`` as the keys of :func:`_scores`;
    ``scratch`` the room for the ``e_j`` (``[width]``) and the sums (``[dim]``)."""
    weights, acc = scratch
    width, dim = scores.shape[0], acc.shape[0]
    for j in range(width):  # vectorised: exp32 is the same function lane by lane
        s = scores[j]
        weights[j] = exp32(s - largest if s != _NONE else np.float32(-104.0))
    for d in range(dim):
        acc[d] = np.float32(0.0)
    total = np.float32(0.0)
    for j in range(width):
        if scores[j] == _NONE:
            continue
        e = weights[j]
        total += e
        v = row(values[0], values[1] + j * dim, dim, np.float32(0))
        for d in range(dim):
            acc[d] += e * v[d]
    for d in range(dim):
        store(out[0], out[1] + d, acc[d] / total if total > 0 else np.float32(0.0))


@njit(parallel=True)
def attend(
    query: tuple[int, int, int, int],
    keys: tuple[int, int, int, int],
    values: tuple[int, int, int, int],
    mask: tuple[int, int, int, int],
    out: int,
    shape: tuple[int, int, int, int, int, int],
    scale: float,
    chunks: int,
) -> None:
    """Attention of every query row alone over the slots its mask shows, query rows shared
    out among ``chunks`` threads.

    ``shape`` is ``(batch, heads, kv_heads, n, width, dim)``. ``query`` is ``(address,
    batch stride, head stride, row stride)`` of float32 ``[batch, heads, n, dim]``; ``keys``
    and ``values`` the same of ``[batch, kv_heads, width, dim]``; ``mask`` of the additive
    mask ``[batch, 1, n, width]`` (its head stride unused); each with contiguous last
    dimensions. ``out`` is the address of the contiguous float32 ``[batch, n, heads, dim]``
    it writes (head ``h`` attends with key head ``h // (heads // kv_heads)``)."""
    batch, heads, kv_heads, n, width, dim = shape
    group = heads // kv_heads
    units = batch * heads * n
    for chunk in prange(chunks):
        scores, weights = np.empty(width, np.float32), np.empty(width, np.float32)
        part, acc = np.empty(LANES, np.float32), np.empty(dim, np.float32)
        for unit in range(chunk, units, chunks):
            b, rest = divmod(unit, heads * n)
            h, r = divmod(rest, n)
            q = (query[0], b * query[1] + h * query[2] + r * query[3])
            k = (keys[0], b * keys[1] + (h // group) * keys[2])
            m = (mask[0], b * mask[1] + r * mask[3])
            largest = _scores(q, k, m, (width, dim), np.float32(scale), scores, part)
            v = (values[0], b * values[1] + (h // group) * values[2])
            o = (out, ((b * n + r) * heads + h) * dim)
            _weighted(scores, largest, v, o, (weights, acc))


attend_serial = serial(attend)
"""The serial twin of :func:`attend` (``chunks`` 1)."""


def warm() -> None:
    """Compile :func:`attend` and its serial twin, then freeze them (every call passes the
    same types)."""
    q = np.ones((1, 1, 1, LANES + 1), np.float32)
    mask = np.zeros((1, 1, 1, 1), np.float32)
    out = np.zeros_like(q)
    shape = (1, 1, 1, 1, 1, LANES + 1)
    address = (q.ctypes.data, 0, 0, 0)
    masked = (mask.ctypes.data, 0, 0, 0)
    for kernel in (attend, attend_serial):
        kernel(address, address, address, masked, out.ctypes.data, shape, 1.0, 1)
        kernel.disable_compile()
