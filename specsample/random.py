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
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

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


def check_generators(
    generators: object, batch: int, name: str = "generators"
) -> tuple[tuple[int, torch.Generator], ...]:
    """Per-row generators as ``(row, generator)`` pairs in row order, validated.

    ``generators`` maps row indices in ``[0, batch)`` to :class:`torch.Generator`;
    ``name`` is the argument's name in the messages (``"seeded_seqs"`` for the samplers).

    Examples
    --------
    >>> check_generators({1: torch.Generator()}, 2)[0][0]
    1
    """
    if generators is None:
        return ()
    if not isinstance(generators, Mapping):
        raise TypeError(
            f"{name} must be a dict of row -> torch.Generator, got {type(generators).__name__}"
        )
    for i, g in generators.items():
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"{name} keys must be row indices (int), got {type(i).__name__}")
        if not 0 <= int(i) < batch:
            raise ValueError(f"{name} has row {i}, outside [0, {batch})")
        if not isinstance(g, torch.Generator):
            raise TypeError(f"{name}[{i}] must be a torch.Generator, got {type(g).__name__}")
    return tuple(sorted((int(i), g) for i, g in generators.items()))


@dataclass(frozen=True)
class Seeding:
    """Where each row of a batch takes its random numbers from (see the module docstring).

    Attributes
    ----------
    batch : int
        Rows.
    seeds : torch.Tensor or None
        ``[batch]`` int64 on the batch's device; a row with a seed ``>= 0`` reads the
        counter-based streams; ``None`` when no row does.
    generators : tuple of (int, torch.Generator)
        Rows with a generator of their own, in increasing row order.
    shared_rows : torch.Tensor or None
        ``[n]`` int64 indices of the rows that read the shared generator, when known on the
        host; ``None`` when every row may (the seeds are a device tensor, or nothing is
        seeded), in which case ``batch`` rows are drawn and row ``i`` of them goes to the
        ``i``-th row that reads the shared generator.
    generator : torch.Generator or None
        The shared generator (torch's default one when ``None``).
    seeded : torch.Tensor or None
        ``[batch]`` bool: the counter-seeded rows, when the seeds came from the host (where
        seeds in ``[2**63, 2**64)`` are stored as the int64 of the same 64 bits, which is
        negative); ``None``: the rows whose seed is ``>= 0``.

    Examples
    --------
    >>> s = Seeding.build(3, torch.device("cpu"), seeds=[None, 5, -1])
    >>> s.seeds.tolist(), s.shared_rows.tolist()
    ([-1, 5, -1], [0, 2])
    """

    batch: int
    seeds: torch.Tensor | None
    generators: tuple[tuple[int, torch.Generator], ...]
    shared_rows: torch.Tensor | None
    generator: torch.Generator | None
    seeded: torch.Tensor | None = None
    _keys: dict[Stream, torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @staticmethod
    def build(
        batch: int,
        device: torch.device,
        *,
        seeds: list[int | None] | torch.Tensor | None = None,
        generators: Mapping[int, torch.Generator] | None = None,
        generator: torch.Generator | None = None,
    ) -> Seeding:
        """Combine per-row seeds (host list or device tensor) and per-row generators.

        ``seeds`` entries ``None`` or negative mean "not counter-seeded"; a row listed in
        ``generators`` must not also have a seed. Seed values are validated by the caller
        (:func:`check_seeds`), the generators here (:func:`check_generators`).
        """
        if seeds is None and not generators:  # every row on the shared generator
            return Seeding(batch, None, (), None, generator)
        own = check_generators(generators, batch)
        mine = {i for i, _ in own}
        if isinstance(seeds, torch.Tensor):
            tensor = seeds.to(device=device, dtype=torch.int64)
            return Seeding(batch, tensor, own, None, generator)
        values = [-1] * batch if seeds is None else [-1 if s is None else int(s) for s in seeds]
        clash = [i for i in mine if values[i] >= 0]
        if clash:
            raise ValueError(
                f"seeds and generators (seeded_seqs): row {clash[0]} has both a seed and a "
                "generator of its own; give it one or the other"
            )
        shared = [i for i, s in enumerate(values) if s < 0 and i not in mine]
        counter_seeds = seeded = None
        if any(s >= 0 for s in values):
            bits = [s - (1 << 64) if s >= 1 << 63 else s for s in values]
            counter_seeds = torch.tensor(bits, dtype=torch.int64).to(device, non_blocking=True)
            mask = torch.tensor([s >= 0 for s in values])
            seeded = mask.to(device, non_blocking=True)
        rows = None
        if len(shared) < batch:
            rows = torch.tensor(shared, dtype=torch.int64).to(device, non_blocking=True)
        return Seeding(batch, counter_seeds, own, rows, generator, seeded)

    def counter_rows(self) -> torch.Tensor | None:
        """``[batch]`` bool: the counter-seeded rows (``None`` when there is none)."""
        if self.seeds is None:
            return None
        return self.seeded if self.seeded is not None else self.seeds >= 0

    def unseeded(self, n: int, device: torch.device, *, first_last: bool = False) -> torch.Tensor:
        """``[batch, n]`` numbers of the rows that are not counter-seeded (others: filler):
        each row's own generator, or the shared one.

        A row with a generator of its own draws ``max(n, STEP_STRIDE)`` numbers and reads
        the first ``n``: a chain or block step advances it by ``STEP_STRIDE`` whatever the
        batch's padded width, so a seeded request gives the same tokens, step after step,
        alone or beside requests with more drafts. With ``first_last``, each row's first
        number goes to the last column and the others move one column left: a step's final
        draw, which lies last, is the first number drawn, so it does not depend on ``n``."""
        if self.shared_rows is not None:
            out = torch.zeros(self.batch, n, dtype=torch.float64, device=device)
            if self.shared_rows.shape[0]:
                drawn = _rand(self.shared_rows.shape[0], n, device, self.generator)
                out.index_copy_(0, self.shared_rows, _arranged(drawn, first_last))
        else:
            out = _arranged(_rand(self.batch, n, device, self.generator), first_last)
            if self.seeds is not None or self.generators:
                shared = torch.ones(self.batch, dtype=torch.bool, device=device)
                counted = self.counter_rows()
                if counted is not None:
                    shared = counted.logical_not()
                for i, _ in self.generators:
                    shared[i] = False
                out = out[(shared.to(torch.int64).cumsum(0) - 1).clamp_(min=0)]
        for i, g in self.generators:
            own = torch.rand(max(n, STEP_STRIDE), dtype=torch.float64, device=g.device, generator=g)
            out[i] = _arranged(own[:n].unsqueeze(0), first_last)[0].to(device)
        return out

    def draw(
        self,
        device: torch.device,
        parts: list[tuple[Stream, torch.Tensor]],
        *,
        first_last: bool = False,
    ) -> torch.Tensor:
        """The uniforms of one step, ``[batch, sum of n_i]`` float64 in ``[0, 1)``.

        ``parts`` lists, column block by column block, the stream and the ``[batch, n_i]``
        counters that counter-seeded rows read; the other rows read their own generator or
        the shared one, all columns in one draw (with ``first_last``, the first number drawn
        in the last column, see :meth:`unseeded`).
        """
        out = self.unseeded(sum(c.shape[1] for _, c in parts), device, first_last=first_last)
        seeds = self.seeds
        if seeds is None:
            return out
        drawn = [counter_uniform(seeds, c, s, key=self.key(s)) for s, c in parts if c.shape[1]]
        seeded = drawn[0] if len(drawn) == 1 else torch.cat(drawn, dim=1) if drawn else out
        counted = self.counter_rows()
        return out if counted is None else torch.where(counted.unsqueeze(-1), seeded, out)

    def key(self, stream: Stream) -> torch.Tensor:
        """``[batch]`` :func:`stream_key` of the rows' seeds, computed once per stream.

        Raises
        ------
        ValueError
            No row is counter-seeded.
        """
        if self.seeds is None:
            raise ValueError("no row of this batch is counter-seeded")
        key = self._keys.get(stream)
        if key is None:
            key = stream_key(self.seeds, stream)
            self._keys[stream] = key
        return key


def _arranged(numbers: torch.Tensor, first_last: bool) -> torch.Tensor:
    """``[rows, n]`` numbers as drawn, or with ``first_last`` each row's first one last."""
    return numbers.roll(-1, dims=1) if first_last else numbers


def _rand(
    rows: int, n: int, device: torch.device, generator: torch.Generator | None
) -> torch.Tensor:
    """``[rows, n]`` float64 ``torch.rand``, passing ``generator=`` only when there is one.

    :func:`torch.compile` refuses an explicit ``generator=None`` once the sizes are symbolic
    (a batch whose shape changes between calls).
    """
    if generator is None:
        return torch.rand(rows, n, dtype=torch.float64, device=device)
    return torch.rand(rows, n, dtype=torch.float64, device=device, generator=generator)


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
