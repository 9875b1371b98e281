"""Atomic operations on one element of an int64 array, for threads of a parallel kernel
that share work (:func:`specsample.kernels.cpu.logits.chain_logits`).

numba offers no atomics of its own; these are LLVM's, sequentially consistent. A store or
read made before :func:`publish` on one thread is seen by another after it reads the published
value with :func:`read`.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from specsample.kernels.cpu.compiler import njit

_ORDER = "seq_cst"


def _element(context, builder, array_type, array, index_type, index):  # type: ignore[no-untyped-def]
    """The pointer to ``array[index]``."""
    view = context.make_array(array_type)(context, builder, array)
    index = context.cast(builder, index, index_type, types.intp)
    return cgutils.get_item_pointer(context, builder, array_type, view, [index])


def _int64(context, builder, value_type, value):  # type: ignore[no-untyped-def]
    """``value`` as an int64."""
    return context.cast(builder, value, value_type, types.int64)


@intrinsic
def _fetch_add(typingctx, array, index, value):  # type: ignore[no-untyped-def]
    """LLVM's ``atomicrmw add`` (:func:`fetch_add`)."""
    signature = types.int64(array, index, value)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        pointer = _element(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        delta = _int64(context, builder, sig.args[2], args[2])
        return builder.atomic_rmw("add", pointer, delta, _ORDER)

    return signature, codegen


@intrinsic
def _claim(typingctx, array, index, expected, desired):  # type: ignore[no-untyped-def]
    """LLVM's ``cmpxchg`` (:func:`claim`)."""
    signature = types.boolean(array, index, expected, desired)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        pointer = _element(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        old = _int64(context, builder, sig.args[2], args[2])
        new = _int64(context, builder, sig.args[3], args[3])
        result = builder.cmpxchg(pointer, old, new, _ORDER, _ORDER)
        return builder.extract_value(result, 1)

    return signature, codegen


@intrinsic
def _read(typingctx, array, index):  # type: ignore[no-untyped-def]
    """LLVM's atomic ``load`` (:func:`read`)."""
    signature = types.int64(array, index)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        pointer = _element(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.load_atomic(pointer, _ORDER, 8)

    return signature, codegen


@intrinsic
def _publish(typingctx, array, index, value):  # type: ignore[no-untyped-def]
    """LLVM's atomic ``store`` (:func:`publish`)."""
    signature = types.void(array, index, value)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        pointer = _element(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        builder.store_atomic(_int64(context, builder, sig.args[2], args[2]), pointer, _ORDER, 8)
        return context.get_dummy_value()

    return signature, codegen


@njit(inline="always")
def fetch_add(array: np.ndarray, index: int, value: int) -> int:
    """``array[index] += value`` (int64 ``array``) as one atomic step; returns the value
    before the addition."""
    return _fetch_add(array, index, value)  # type: ignore[no-any-return, call-arg]


@njit(inline="always")
def claim(array: np.ndarray, index: int, expected: int, desired: int) -> bool:
    """Set ``array[index]`` to ``desired`` if it holds ``expected``, as one atomic step;
    returns whether it did (of threads racing for the element, one wins)."""
    return _claim(array, index, expected, desired)  # type: ignore[no-any-return, call-arg]


@njit(inline="always")
def read(array: np.ndarray, index: int) -> int:
    """``array[index]`` read atomically (a load never hoisted out of a waiting loop)."""
    return _read(array, index)  # type: ignore[no-any-return, call-arg]


@njit(inline="always")
def publish(array: np.ndarray, index: int, value: int) -> None:
    """``array[index] = value``, stored atomically after every write before it."""
    _publish(array, index, value)  # type: ignore[call-arg]
