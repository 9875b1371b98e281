"""Keyed Gumbel-max verification (``method="gumbel"``) on flattened float32 logits, one walk
per request.

:func:`gumbel_logits` verifies a ragged batch as :func:`specsample.backends.eager.verify_gumbel`
does: each request walks its target rows in order, computes each row's token (the argmax of a
greedy request; of a sampled one, the keyed Gumbel-max token of
:func:`specsample.rules.gumbel.gumbel_argmax` over the tokens its processing keeps), and stops
at the first draft that differs from it: the rows after it are never read. A sampled row that
:func:`specsample.kernels.cpu.logits.row_norms` left to the walk (``lazy``) gets its largest
logit here, in the same pass that finds the largest logit of each block of
:data:`~specsample.kernels.cpu.floats.BLOCK` tokens.

The noise of :mod:`specsample.noise` lies below :data:`~specsample.noise.GUMBEL_MAX`, and
below a bound computed from a token's bits without a logarithm (:func:`noise_bound`). The scan
skips every block of :data:`~specsample.kernels.cpu.floats.BLOCK` tokens whose largest ``z`` plus
``GUMBEL_MAX`` is at most the best score found so far, then every block whose tokens' float32
bounds ``z + noise_bound`` (one vectorised pass: ``z``, the bits and the bound of each token)
all are; only the few tokens whose bound beats the best compute the two logarithms of their
noise. A skipped token cannot win: the winner beats every token before it strictly (ties keep
the first index), and its bound is at least its score (its ``z`` is at least
``-GUMBEL_MAX - 3.2``, as the row's largest token, ``z = 0``, scores at least ``-3.2``; so its
bound, rounded to float32, errs by less than ``1e-5``, and every bound has a margin of
``1e-4``). So the skips change no result, and each row's token depends on that row alone,
whatever the thread.

The noise is ``-log(-log(u))`` with the C library's logarithm, which may differ from PyTorch's
vectorised one by a unit in the last place: the tokens differ only where two tokens' scores
lie within about ``1e-15`` of each other.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from specsample.kernels.cpu import atomics
from specsample.kernels.cpu.compiler import njit, prange, serial
from specsample.kernels.cpu.floats import BLOCK, block_largest, scaled
from specsample.kernels.cpu.logits import _largest, emit
from specsample.noise import GUMBEL_MAX

_MUL_1 = np.uint32(0x7FEB352D)
_MUL_2 = np.uint32(0x846CA68B)
_GRID = 1.0 / 4294967296.0
_LN2 = np.float32(0.6931472)
"""``log 2`` rounded up to float32."""
_MARGIN = np.float32(1e-4)
"""Added to every bound of the noise (:func:`noise_bound`): more than the float32 roundings of
a bound that matters (see the module docstring) and than any logarithm's."""


@intrinsic
def _leading_zeros(typingctx, x):  # type: ignore[no-untyped-def]
    """The number of leading zero bits of a uint32 (32 for 0): the ``llvm.ctlz`` intrinsic,
    which vectorises into the processor's count where it has one."""
    signature = types.uint32(types.uint32)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        ctlz = builder.module.declare_intrinsic(
            "llvm.ctlz", [i32], ir.FunctionType(i32, [i32, ir.IntType(1)])
        )
        return builder.call(ctlz, [args[0], ir.Constant(ir.IntType(1), 0)])

    return signature, codegen


@njit(inline="always")
def _mix32(x: np.uint32) -> np.uint32:
    """The lowbias32 mixer of :func:`specsample.random.mix32` in 32-bit arithmetic (each
    product wraps modulo ``2**32``), which vectorises in twice as many lanes as 64-bit."""
    x = np.uint32(x ^ (x >> np.uint32(16)))
    x = np.uint32(x * _MUL_1)
    x = np.uint32(x ^ (x >> np.uint32(15)))
    x = np.uint32(x * _MUL_2)
    return np.uint32(x ^ (x >> np.uint32(16)))


@njit(inline="always")
def token_bits(token: int, key: np.uint32) -> np.uint32:
    """The bits ``h = mix32((mix32(token ^ key) + key) mod 2**32)`` of ``token`` in the row of
    ``key``, as :func:`specsample.noise.gumbel_bits` computes them."""
    return _mix32(np.uint32(_mix32(np.uint32(np.uint32(token) ^ key)) + key))


@njit(inline="always")
def noise(bits: np.uint32) -> np.float64:
    """The float64 noise ``-log(-log(u))``, ``u = (bits + 0.5) * 2**-32``, of a token's bits."""
    u = (np.float64(bits) + 0.5) * _GRID
    return -np.log(-np.log(u))  # type: ignore[no-any-return]


@njit(inline="always")
def noise_bound(bits: np.uint32) -> np.float32:
    """A float32 upper bound of :func:`noise` of ``bits``, without a logarithm:
    ``(c + 1) log 2`` plus :data:`_MARGIN`, ``c`` the leading zero bits of ``2**32 - 1 - bits``.

    With ``t = 1 - u = (2**32 - 1 - bits + 0.5) * 2**-32``, ``-log(u) >= t``, so the noise is at
    most ``-log(t)``, and ``2**32 - 1 - bits + 0.5 >= 2**(31 - c)`` makes that at most
    ``(c + 1) log 2``: tight within ``log 2`` for the large noise a token needs to win.
    """
    zeros: np.uint32 = _leading_zeros(np.uint32(~bits))  # type: ignore[call-arg]
    return np.float32(zeros + np.uint32(1)) * _LN2 + _MARGIN


@njit(inline="always")
def _bounds_into(row: np.ndarray, start: int, stop: int,
                 head: tuple[np.float32, np.float32, np.float32], key: np.uint32,
                 bounds: np.ndarray) -> None:  # fmt: skip
    """The float32 bound ``z + bound`` of the score of each token of ``row[start:stop]``
    (``-inf`` where ``z`` is below the cutoff; ``head``: the row's shift, inverse temperature
    and cutoff) into ``bounds`` ``[BLOCK]`` (``-inf`` past ``stop - start``): a loop without
    branches, which the compiler vectorises."""
    shift, scale, cut = head
    plain = np.isfinite(shift) and np.isfinite(scale)  # then z is this, exactly as scaled()
    for j in range(stop - start):
        z = (row[start + j] - shift) * scale if plain else scaled(row[start + j], shift, scale)
        bound = z + noise_bound(token_bits(start + j, key))
        bounds[j] = bound if z >= cut else np.float32(-np.inf)
    bounds[stop - start :] = -np.inf


@njit(inline="always")
def _span(row: np.ndarray, start: int, stop: int,
          head: tuple[np.float32, np.float32, np.float32], key: np.uint32, best: float,
          index: int, bounds: np.ndarray) -> tuple[float, int]:  # fmt: skip
    """The best score and its token after the tokens of ``row[start:stop]`` (at most
    :data:`BLOCK` of them): the noise of a token computed only where its bound
    (:func:`_bounds_into`) beats ``best``."""
    _bounds_into(row, start, stop, head, key, bounds)
    if not np.float64(block_largest(bounds.view(np.int32), 0)[0]) > best:
        return best, index
    shift, scale, _ = head
    for j in range(stop - start):
        if np.float64(bounds[j]) > best:
            z = scaled(row[start + j], shift, scale)
            score = np.float64(z) + noise(token_bits(start + j, key))
            if score > best:
                best, index = score, start + j
    return best, index


@njit
def gumbel_token(row: np.ndarray, head: tuple[np.float32, np.float32, np.float32],
                 key: np.uint32, maxima: np.ndarray) -> int:  # fmt: skip
    """The keyed Gumbel-max token of a row with a distribution.

    Parameters
    ----------
    row : np.ndarray
        ``[vocab]`` float32 logits.
    head : tuple of np.float32
        The row's shift (its largest logit), inverse temperature and cutoff.
    key : np.uint32
        The row's key.
    maxima : np.ndarray
        ``[vocab // BLOCK]`` float32 the largest logit of each whole block of the row.

    Returns
    -------
    int
        ``argmax (z + g)`` over the tokens with ``z >= cutoff``, the first on ties.
    """
    shift, scale, cut = head
    bounds = np.empty(BLOCK, np.float32)
    best, index = -np.inf, 0
    whole = row.shape[0] - row.shape[0] % BLOCK
    for start in range(0, whole, BLOCK):
        top = scaled(maxima[start // BLOCK], shift, scale)  # no z of the block is larger
        if top >= cut and np.float64(top) + GUMBEL_MAX > best:
            best, index = _span(row, start, start + BLOCK, head, key, best, index, bounds)
    return _span(row, whole, row.shape[0], head, key, best, index, bounds)[1]


@njit(inline="always")
def _row_token(target: np.ndarray, norms: np.ndarray, argmax: np.ndarray, lazy: np.ndarray,
               keys: np.ndarray, greedy: bool, r: int, maxima: np.ndarray
               ) -> tuple[int, bool]:  # fmt: skip
    """Row ``r``'s token and whether the row has a distribution (token 0 where not): its
    argmax when ``greedy``, else its keyed Gumbel-max token. A row ``lazy`` marks gets its
    largest logit here; a sampled row its blocks' largest logits, in ``maxima`` (a scratch
    ``[vocab // BLOCK]`` float32)."""
    row = target[r]
    shift, cut, index = norms[0, r], norms[2, r], argmax[r]
    left = lazy.shape[0] > 0 and lazy[r]
    if left or not greedy:
        top, first, nan = _largest(row, maxima)
        if left:
            shift, index = top, first
            cut = np.float32(np.nan) if nan or np.isnan(top) or top == -np.inf else cut
    if np.isnan(cut):
        return 0, False
    if greedy:
        return index, True
    return gumbel_token(row, (shift, norms[1, r], cut), np.uint32(keys[r]), maxima), True


@njit
def _walk(target: np.ndarray, norms: np.ndarray, argmax: np.ndarray, lazy: np.ndarray,
          layout: np.ndarray,
          ids: np.ndarray, keys: np.ndarray, token_ids: np.ndarray, num_accepted: np.ndarray,
          maxima: np.ndarray, b: int) -> None:  # fmt: skip
    """Verify request ``b`` (see :func:`gumbel_logits`)."""
    drafts, first, start, bonus = layout[0, b], layout[1, b], layout[2, b], layout[4, b]
    n, final = 0, bonus
    while n < drafts or bonus < 0:
        r = min(start + n, target.shape[0] - 1)
        greedy = layout[3, b] != 0
        token, usable = _row_token(target, norms, argmax, lazy, keys, greedy, r, maxima)
        if n == drafts or not usable or ids[first + n] != token:
            final = token
            break
        n += 1
    emit(token_ids, num_accepted, ids, b, first, n, final)


@njit(parallel=True)
def gumbel_logits(
    step: tuple,
    keys: np.ndarray,
    token_ids: np.ndarray,
    num_accepted: np.ndarray,
    threads: int,
) -> None:
    """Verify a ragged ``method="gumbel"`` batch into ``token_ids`` and ``num_accepted``.

    - ``step``: the target logits, their statistics, argmaxes and rows left to the walk,
      the layout and the drafts, as :func:`specsample.kernels.cpu.logits.chain_logits` takes
      them (the log-norms are not read; a row left to the walk gets its shift and argmax
      here);
    - ``keys``: ``[rows]`` int64 row keys in ``[0, 2**32)`` (:attr:`specsample.plan.Plan.keys`;
      empty when every request is greedy);
    - ``token_ids``: ``[batch, max_drafts + 1]`` int64, filled with -1 by the caller;
    - ``num_accepted``: ``[batch]`` int64;
    - ``threads``: how many threads share the requests
    (:func:`specsample.kernels.cpu.compiler.threads`).

    Each thread takes the next request not yet taken until none is left. A request accepts
    its drafts while they equal its rows' tokens (at rows with a distribution); the first
    that differs, or its bonus row, emits the row's token (0 at a row without a
    distribution), unless its bonus token is given and every draft is accepted. Nothing is
    written but the outputs.
    """
    target, norms, argmax, lazy, layout, ids = step
    batch = layout.shape[1]
    taken = np.zeros(1, np.int64)
    for _ in prange(min(threads, batch)):
        maxima = np.empty(target.shape[1] // BLOCK, np.float32)
        b = atomics.fetch_add(taken, 0, 1)
        while b < batch:
            _walk(target, norms, argmax, lazy, layout, ids, keys, token_ids, num_accepted,
                  maxima, b)  # fmt: skip
            b = atomics.fetch_add(taken, 0, 1)


gumbel_logits_serial = serial(gumbel_logits)
"""The serial twin of :func:`gumbel_logits`."""


def warm() -> None:
    """Compile :func:`gumbel_logits` and its serial twin for contiguous float32 logits, then
    freeze them."""
    logits = np.zeros((2, 4), np.float32)
    norms = np.zeros((4, 2), np.float32)
    layout = np.array([[1], [0], [0], [0], [-1]], np.int64)
    for kernel in (gumbel_logits, gumbel_logits_serial):
        step = (logits, norms, np.zeros(2, np.int64), np.zeros(0, np.bool_), layout,
                np.zeros(1, np.int64))  # fmt: skip
        kernel(
            step,
            np.zeros(2, np.int64), np.full((1, 2), -1, np.int64), np.zeros(1, np.int64), 1,
        )  # fmt: skip
        kernel.disable_compile()
