"""Random numbers for verification and drafting, drawn without any host synchronisation.

Three sources are offered, chosen per row:

* a counter-based stream keyed by a per-row seed and a counter, so that a row's numbers
  depend on nothing but its seed and counter: not on its index in the batch, not on the
  other rows, not on how many numbers anybody drew before;
* a :class:`torch.Generator` of the row's own (vLLM's ``seeded_seqs`` / ``generators``);
* the batch's shared generator (``generator=``, or torch's default one), which only the rows
  that have neither consume, in row order: an unseeded row gets the same numbers alone or
  beside seeded rows.

The counter-based stream hashes ``(seed, stream, counter)`` with integer tensor arithmetic
(a chain of 32-bit "lowbias32" mixers, computed in int64 without overflow), so it runs on
any device, composes with :func:`torch.compile`, and needs no state. Its uniforms lie on a
grid of step ``2**-32``. On CPU tensors the CPU backend gives the hash operator a kernel
that runs the same integer chain as one compiled loop once the kernels are compiled
(:mod:`specsample.backends.cpu`, :mod:`specsample.kernels.cpu.hashing`): the same numbers,
bit for bit, in a fifth of the time.

Streams and counters. Every consumer of counter-based numbers owns one member of
:class:`Stream`, and every stream has its own key, so two consumers never share a number.
Within a stream, a step of a sequence whose first draft sits at absolute position ``pos``
(the number of tokens before it) reads only the stripe ``[pos * stride, (pos + 1) * stride)``
of its stream (:mod:`specsample.uniforms` lays out a chain or block step's); a sequence's
position strictly increases from step to step (every step emits at least one token), so no
counter is ever read twice, whatever draft count each step uses.

:func:`inverse_cdf` is the one inverse-CDF primitive of the library.
"""

from __future__ import annotations

import enum

import torch

_MASK32 = 0xFFFFFFFF


@enum.unique
class Stream(enum.IntEnum):
    """The counter-based streams, one per consumer (a duplicate value is an import error).

    Attributes
    ----------
    ACCEPT
        The accept tests of chain and block verification.
    FINAL
        Their final draw (residual or bonus token).
    TREE_ACCEPT
        The child tests of tree verification.
    TREE_FINAL
        Its final draw.
    DRAFT
        The draft model's samples in the generation loop.
    TRAVERSAL
        The node tests and the final draw of traversal verification.
    GUMBEL
        The keyed Gumbel noise of ``method="gumbel"`` (:mod:`specsample.noise`).
    """

    ACCEPT = 0
    FINAL = 1
    TREE_ACCEPT = 2
    TREE_FINAL = 3
    DRAFT = 4
    TRAVERSAL = 5
    GUMBEL = 6


_STREAM_KEYS = {
    Stream.ACCEPT: 0x68E31DA4,
    Stream.FINAL: 0xB5297A4D,
    Stream.TREE_ACCEPT: 0x1B56C4E9,
    Stream.TREE_FINAL: 0x3C6EF372,
    Stream.DRAFT: 0x5851F42D,
    Stream.TRAVERSAL: 0x2F6B1C87,
    Stream.GUMBEL: 0x7A3B9C15,
}
if set(_STREAM_KEYS) != set(Stream) or len(set(_STREAM_KEYS.values())) != len(Stream):
    raise ImportError("every Stream needs a key of its own")

STEP_STRIDE = 1 << 8
"""Counters a chain step may use per position (so at most ``STEP_STRIDE - 1`` drafts)."""


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, never overflowing int64.

    ``c`` is taken as the signed 32-bit integer with the same low bits (``c - 2**32`` when
    ``c >= 2**31``), which changes nothing modulo ``2**32`` and keeps ``|x * c| < 2**63``;
    the mask then reads the two's-complement low bits.
    """
    signed = c - (1 << 32) if c >= 1 << 31 else c
    return (x * signed) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash with strong avalanche (lowbias32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_key(seeds: torch.Tensor, stream: Stream | int = Stream.ACCEPT) -> torch.Tensor:
    """``[batch]`` int64 the key of each seed's ``stream``: what :func:`counter_uniform` hashes.

    A row's key depends only on its seed and the stream, so a caller drawing many steps of
    the same rows may compute it once and pass it to :func:`counter_uniform`.

    Examples
    --------
    >>> import torch
    >>> seeds, counters = torch.tensor([7, 8]), torch.arange(3).expand(2, 3)
    >>> key = stream_key(seeds, Stream.FINAL)
    >>> bool(torch.equal(counter_uniform(seeds, counters, Stream.FINAL, key=key),
    ...                  counter_uniform(seeds, counters, Stream.FINAL)))
    True
    """
    if isinstance(stream, bool) or stream not in _STREAM_KEYS:
        raise ValueError(f"stream must be one of {[int(s) for s in Stream]}, got {stream}")
    seeds = seeds.to(torch.int64)
    return mix32(
        mix32((seeds & _MASK32) ^ _STREAM_KEYS[Stream(stream)]) ^ ((seeds >> 32) & _MASK32)
    )


def counter_uniform(
    seeds: torch.Tensor,
    counters: torch.Tensor,
    stream: Stream | int = Stream.ACCEPT,
    *,
    key: torch.Tensor | None = None,
) -> torch.Tensor:
    """Uniforms in ``[0, 1)`` that are a pure function of ``(seed, stream, counter)``.

    Parameters
    ----------
    seeds : torch.Tensor
        ``[batch]`` integer tensor; every 64-bit value is a valid seed.
    counters : torch.Tensor
        ``[batch, n]`` non-negative integer tensor, on the device of ``seeds``.
    stream : Stream
        Which stream to read (one per consumer, see :class:`Stream`).
    key : torch.Tensor, optional
        ``[batch]`` int64 ``stream_key(seeds, stream)``, when the caller has it already.

    Returns
    -------
    torch.Tensor
        ``[batch, n]`` float64 uniforms on the grid ``j * 2**-32``.

    Examples
    --------
    >>> import torch
    >>> seeds = torch.tensor([7, 7, 8])
    >>> u = counter_uniform(seeds, torch.arange(3).expand(3, 3))
    >>> bool((u[0] == u[1]).all()), bool((u[0] == u[2]).any())
    (True, False)
    """
    if key is None:
        key = stream_key(seeds, stream)
    return hash_uniform_op(key, counters.to(torch.int64))


@torch.library.custom_op("specsample::hash_uniform", mutates_args=())
def hash_uniform_op(key: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """``[batch, n]`` float64 hash of int64 ``key [batch]`` and ``counters [batch, n]``.

    An operator of its own, opaque to :func:`torch.compile`: every xor-shift reads its input
    twice, so inductor, inlining the chain of mixers into each consumer, would expand it into
    an expression tree of thousands of nodes and spend minutes generating code for it. The
    CPU backend registers its kernel on CPU tensors (:mod:`specsample.backends.cpu`).
    """
    return hash_chain(key, counters)


def hash_chain(key: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The hash of :func:`hash_uniform_op` as integer tensor operations (any device)."""
    return hash_bits(key, counters).to(torch.float64) * (1.0 / 4294967296.0)


def hash_bits(key: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """``[batch, n]`` int64 in ``[0, 2**32)``: the 32 bits :func:`counter_uniform` scales.

    ``key`` is ``[batch]`` int64 (a :func:`stream_key`), ``counters`` ``[batch, n]``
    non-negative int64.

    Examples
    --------
    >>> import torch
    >>> seeds, counters = torch.tensor([5]), torch.tensor([[0, 1]])
    >>> bits = hash_bits(stream_key(seeds), counters)
    >>> bool(torch.equal(bits.double() / 2**32, counter_uniform(seeds, counters)))
    True
    """
    inner = mix32(((counters >> 32) & _MASK32) ^ 0x9E3779B9)
    return mix32(key.unsqueeze(-1) ^ mix32((counters & _MASK32) ^ inner))


@hash_uniform_op.register_fake
def _hash_uniform_shape(key: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The output's shape and dtype, for tracing: ``counters``' shape, float64."""
    return counters.new_empty(counters.shape, dtype=torch.float64)


def inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF choice of a cell of non-negative ``weights`` by ``uniform``: the one primitive.

    Parameters
    ----------
    weights : torch.Tensor
        ``[batch, n]`` non-negative weights (need not sum to 1); prefix sums in float64.
    uniform : torch.Tensor
        ``[batch]`` float64 in ``[0, 1)``.

    Returns
    -------
    tuple of torch.Tensor
        ``[batch]`` int64 cell: the first ``i`` with ``cumsum(weights)[i] > uniform * total``,
        never a cell of zero weight when the row has positive mass, and in ``[0, n)``
        whatever the input (0 for a row without mass); and ``[batch]`` float64, the uniform
        rescaled to the inside of that cell, so that a hierarchy of cells can be descended
        with one uniform.

    Examples
    --------
    >>> w = torch.tensor([[0.25, 0.0, 0.75], [0.25, 0.0, 0.75]])
    >>> inverse_cdf(w, torch.tensor([0.1, 0.5], dtype=torch.float64))[0]
    tensor([0, 2])
    """
    n = weights.shape[-1]
    cum = torch.nn.functional.pad(weights.to(torch.float64).cumsum(dim=-1), (1, 0))
    total = cum[:, n:].contiguous()
    x = uniform.to(torch.float64).unsqueeze(-1) * total
    cell = (
        torch.minimum(
            torch.searchsorted(cum, x, right=True), torch.searchsorted(cum, total, right=False)
        )
        .sub_(1)
        .clamp_(0, n - 1)
    )
    bounds = cum.gather(1, torch.cat([cell, cell + 1], dim=1))
    inside = (x.squeeze(-1) - bounds[:, 0]) / (bounds[:, 1] - bounds[:, 0])
    return cell.squeeze(-1), inside.nan_to_num_(0.0).clamp_(0.0, 1.0)
