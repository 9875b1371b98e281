"""The chain rule on ``[batch, k, vocab]`` probabilities as one fused pass per sequence.

:func:`chain_rule` computes what :data:`specsample.rules.chain.chain_verify` computes, with the
same arithmetic (see :mod:`specsample.rules.residual`): the accept tests in float64, the
residual terms ``max(q - p, 0)`` in the rows' precision (float32, or float64 for float64
rows) and every sum in float64, the segment of the chosen block in float32, and the same
inverse-CDF cell rule at each level. For each sequence it reads the ``q(x)`` and ``p(x)`` of
its drafts until the first rejection, then the two rows at that position once (per-block
residual masses; the target's own only where the residual has none), then one block of them
again (the draw); sequences run in parallel, and nothing of size ``[batch, k, vocab]`` or
``[batch, vocab]`` is allocated.

Sums in another order than PyTorch's differ by about ``1e-16`` relative, so both draw the
same token unless a uniform falls that close to a cell boundary.
"""

from __future__ import annotations

import numpy as np

from specsample.kernels.cpu.compiler import njit, prange, serial
from specsample.kernels.cpu.memory import load, row, store
from specsample.rules.residual import BLOCK

SUB = 32
"""Tokens per part of a block (the middle level of the hierarchy)."""


@njit(inline="always")
def search(cum: np.ndarray, value: float, right: bool) -> int:
    """``torch.searchsorted(cum, value, right=right)``, by the same binary search (so NaN and
    infinities land where PyTorch puts them)."""
    start, end = 0, cum.shape[0]
    while start < end:
        mid = start + ((end - start) >> 1)
        if not (cum[mid] > value if right else cum[mid] >= value):
            start = mid + 1
        else:
            end = mid
    return start


@njit(inline="always")
def inverse_cdf(weights: np.ndarray, u: float) -> tuple[int, float]:
    """The cell ``weights`` (non-negative) gives ``u``, and ``u`` rescaled inside it.

    As :func:`specsample.random.inverse_cdf`: float64 prefix sums added in order, the first
    cell whose prefix sum exceeds ``u * total`` but never past the last cell of positive
    weight, and ``(x - low) / (high - low)`` clamped to ``[0, 1]`` (0 when undefined).
    """
    n = weights.shape[0]
    cum = np.zeros(n + 1)
    for i in range(n):
        cum[i + 1] = cum[i] + np.float64(weights[i])
    total = cum[n]
    x = u * total
    cell = min(search(cum, x, True), search(cum, total, False)) - 1
    cell = min(max(cell, 0), n - 1)
    inside = (x - cum[cell]) / (cum[cell + 1] - cum[cell])
    if np.isnan(inside):
        inside = 0.0
    return cell, min(max(inside, 0.0), 1.0)


@njit(fastmath={"reassoc"})
def residual_sum(q: np.ndarray, p: np.ndarray) -> float:
    """``sum max(q - p, 0)`` of one block (``q``, ``p``: its columns), in float64.

    Each term is rounded as the rule rounds it (``q - p`` in the rows' precision, NaN kept as
    ``torch.clamp`` keeps it); only the order of the float64 additions is left to the
    compiler (``reassoc``), which vectorises them.
    """
    total = 0.0
    for i in range(q.shape[0]):
        d = q[i] - p[i]
        total += np.float64(d) if not d < 0 else 0.0
    return total


@njit(fastmath={"reassoc"})
def target_sum(q: np.ndarray) -> float:
    """``sum q`` of one block, in float64 (any order of additions)."""
    total = 0.0
    for i in range(q.shape[0]):
        total += np.float64(q[i])
    return total


@njit(inline="always")
def draw_residual(q: np.ndarray, p: np.ndarray, u: float) -> int:
    """One token from ``normalize(max(q - p, 0))`` (or ``q`` when that has no mass)."""
    vocab = q.shape[0]
    masses = np.empty((vocab + BLOCK - 1) // BLOCK)
    for block in range(masses.shape[0]):
        start = block * BLOCK
        masses[block] = residual_sum(q[start : start + BLOCK], p[start : start + BLOCK])
    use_target = not masses.sum() > 0.0
    if use_target:  # no residual mass: the target row itself (its masses read only now)
        for block in range(masses.shape[0]):
            masses[block] = target_sum(q[block * BLOCK : block * BLOCK + BLOCK])
    block, u = inverse_cdf(masses, u)
    width = min(BLOCK, vocab)
    first = block * BLOCK
    start = min(first, vocab - width)
    segment = np.zeros(width, np.float32)
    for i in range(max(first - start, 0), width):
        q_i = np.float32(q[start + i])
        d = q_i - np.float32(p[start + i])
        segment[i] = q_i if use_target else (d if not d < 0 else np.float32(0.0))
    offset = 0
    if width == BLOCK:
        parts = np.zeros(SUB)
        for i in range(BLOCK):
            parts[i // (BLOCK // SUB)] += np.float64(segment[i])
        part, u = inverse_cdf(parts, u)
        offset = part * (BLOCK // SUB)
        segment = segment[offset : offset + BLOCK // SUB]
    token, _ = inverse_cdf(segment, u)
    return min(max(start + offset + token, 0), vocab - 1)


@njit(inline="always")
def _verify_one(target: tuple, draft: tuple, ids: tuple, bonus: tuple, uniforms: tuple,
                out: tuple, shape: tuple, b: int, marker: float) -> None:  # fmt: skip
    """Verify sequence ``b`` (see :func:`chain_rule`)."""
    _, k, vocab = shape
    at_q, at_p = b * target[1], b * draft[1]
    n = 0
    while n < k:
        x = load(ids[0], b * ids[1] + n * ids[2], np.int64(0))
        if x < 0 or x >= vocab:
            break
        u = load(uniforms[0], b * uniforms[1] + n * uniforms[2], 0.0)
        p_x = load(draft[0], at_p + n * draft[2] + x, marker)
        if not u * np.float64(p_x) < np.float64(load(target[0], at_q + n * target[2] + x, marker)):
            break
        n += 1
    tokens, at = out[0], b * (k + 1)
    for j in range(k + 1):
        store(tokens, at + j, load(ids[0], b * ids[1] + j * ids[2], np.int64(0)) if j < n else -1)
    store(out[1], b, np.int64(n))
    if n == k:
        store(tokens, at + k, load(bonus[0], b * bonus[1], np.int64(0)))
    else:
        q = row(target[0], at_q + n * target[2], vocab, marker)
        p = row(draft[0], at_p + n * draft[2], vocab, marker)
        u = load(uniforms[0], b * uniforms[1] + k * uniforms[2], 0.0)
        store(tokens, at + n, np.int64(draw_residual(q, p, u)))


@njit(parallel=True)
def chain_rule(
    target: tuple,
    draft: tuple,
    ids: tuple,
    bonus: tuple,
    uniforms: tuple,
    out: tuple,
    shape: tuple,
    marker: float,
) -> None:
    """Verify ``[batch, k]`` drafts, sequences in parallel; the tensors are given by their
    memory (:mod:`specsample.kernels.cpu.memory`: an address and strides in elements).

    ``shape`` is ``(batch, k, vocab)``. ``target`` and ``draft`` are ``[batch, k, vocab]``
    probabilities of ``marker``'s type (float32 or float64) whose rows are contiguous,
    ``ids`` ``[batch, k]`` int64 drafts, ``bonus`` ``[batch]`` int64, ``uniforms``
    ``[batch, k + 1]`` float64: the accept tests then the final draw
    (:func:`specsample.uniforms.step_uniforms`). ``out`` holds the addresses of the outputs:
    contiguous int64 ``[batch, k + 1]`` tokens and ``[batch]`` accepted counts.
    """
    for b in prange(shape[0]):
        _verify_one(target, draft, ids, bonus, uniforms, out, shape, b, marker)


chain_rule_serial = serial(chain_rule)
"""The serial twin of :func:`chain_rule`."""


def _memory(array: np.ndarray) -> tuple[int, ...]:
    """``(address, *strides)`` of an array, strides in elements, as :func:`chain_rule` takes
    a tensor's memory."""
    return (array.ctypes.data, *(stride // array.itemsize for stride in array.strides))


def warm() -> None:
    """Compile :func:`chain_rule` and its serial twin for float32 and float64 rows, then
    freeze them: a call never starts a compilation (every layout is the same addresses and
    strides to them)."""
    ids, bonus = np.zeros((2, 1), np.int64), np.zeros(2, np.int64)
    uniforms = np.full((2, 2), 0.5)
    token_ids, num_accepted = np.empty((2, 2), np.int64), np.empty(2, np.int64)
    out = (token_ids.ctypes.data, num_accepted.ctypes.data)
    for rule in (chain_rule, chain_rule_serial):
        for marker in (np.float32(0), np.float64(0)):
            rows = np.full((2, 1, 4), 0.25, type(marker))
            rule(_memory(rows), _memory(rows), _memory(ids), _memory(bonus), _memory(uniforms),
                 out, (2, 1, 4), marker)  # fmt: skip
        rule.disable_compile()
