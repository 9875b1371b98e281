"""A tensor's memory read and written by a kernel through its address and strides.

A kernel called with NumPy views of tensors builds those views at every call, and the first
``tensor.numpy()`` of a call made with cold caches costs tens of microseconds. A kernel
called with each tensor's address and strides instead (:func:`specsample.kernels.cpu.launch.memory`:
``(tensor.data_ptr(), *tensor.stride())``, strides in elements) gets ints and tuples of ints,
which numba's dispatcher types without touching NumPy. Inside the kernel, :func:`load` reads
one element, :func:`store` writes one, and :func:`row` makes an array of contiguous elements
to read (whose loops vectorise).

One unit for every kernel: an address is the bare address of a tensor's first element
(``tensor.data_ptr()``, ``array.ctypes.data``), never moved by arithmetic; a place in that
memory is an offset from it counted in elements of the memory's type, never in bytes.
Element ``i`` of a float32 tensor is ``(address, i)``, not ``address + 4 i``; a block of
elements is addressed by its first one. The intrinsics that read or write several elements
at once (:func:`specsample.adapter.int_products.group_intrinsic`) take the same pairs.

The caller keeps the tensors alive for the call and passes a ``marker``, a scalar of the
elements' type (``np.float32(0)``, ``np.int64(0)``, ``0.0`` for float64): it types the
memory.
"""

from __future__ import annotations

import numpy as np
from numba import carray, types
from numba.extending import intrinsic

from specsample.kernels.cpu.compiler import njit


def _element(context, builder, pointer, address, offset):  # type: ignore[no-untyped-def]
    """LLVM's pointer of type ``pointer`` to the element ``offset`` past ``address``."""
    base = builder.inttoptr(address, context.get_value_type(pointer))
    return builder.gep(base, [offset])


@intrinsic
def _pointer(typingctx, address, offset, marker):  # type: ignore[no-untyped-def]
    """``address`` as a pointer to ``marker``'s type, advanced by ``offset`` elements."""
    pointer = types.CPointer(marker)
    signature = pointer(types.int64, types.int64, marker)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _element(context, builder, pointer, args[0], args[1])

    return signature, codegen


@intrinsic
def _store(typingctx, address, offset, value):  # type: ignore[no-untyped-def]
    """``value`` written ``offset`` elements of its type past ``address``."""
    pointer = types.CPointer(value)
    signature = types.void(types.int64, types.int64, value)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        builder.store(args[2], _element(context, builder, pointer, args[0], args[1]))
        return context.get_dummy_value()

    return signature, codegen


@njit(inline="always")
def load(address: int, offset: int, marker: float) -> float:
    """The element ``offset`` elements past ``address``, of ``marker``'s type."""
    return _pointer(address, offset, marker)[0]  # type: ignore[call-arg, no-any-return]


@njit(inline="always")
def store(address: int, offset: int, value: float) -> None:
    """Write ``value`` ``offset`` elements of its type past ``address``. A kernel writes its
    outputs so, not through :func:`row`: numba's parallel loops drop writes into an array
    made inside the loop and read nowhere after it (``tests/test_native_workarounds.py``
    checks that they still do)."""
    _store(address, offset, value)  # type: ignore[call-arg]


@njit(inline="always")
def row(address: int, offset: int, length: int, marker: float) -> np.ndarray:
    """The ``length`` contiguous elements from ``offset`` elements past ``address``, of
    ``marker``'s type, as an array (no copy)."""
    return carray(_pointer(address, offset, marker), (length,))  # type: ignore[call-arg]
