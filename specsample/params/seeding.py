"""Where a batch's random numbers come from: :class:`Seeding`, and the randomness arguments
of the entry points (seeds, generators, positions), validated.

A :class:`Seeding` says, row by row, which of the sources of :mod:`specsample.random` a row
reads: the counter-based stream of its seed, a generator of its own, or the shared one.
Every entry point (:func:`specsample.verify`, :class:`specsample.RejectionSampler`, the
generation loop) checks what the caller gives here and turns it into a :class:`Seeding`
(:func:`seeding_from`) and ``[batch]`` int64 positions;
the tree rules (:func:`specsample.rules.tree.tree_verify`) take a Seeding so built and check
it against their batch (:func:`check_seeding`). Seeds come with positions
(:func:`require_positions`): a seeded step without them would reuse position 0's numbers.
Host values are checked on the host; tensors only for dtype, shape and device (their values
in strict mode, :func:`check_position_values`), so nothing synchronises by default.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from specsample.random import STEP_STRIDE, Stream, counter_uniform, stream_key


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
            numbers = own[:n].roll(-1) if first_last else own[:n]
            out[i] = numbers.to(device)
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
    """``[rows, n]`` numbers as drawn, or with ``first_last`` each row's first one last (the
    others one column left), by a gather over a cached index: a third of a roll's time."""
    n = numbers.shape[1]
    if not first_last or n < 2:
        return numbers
    if torch.compiler.is_compiling():
        return numbers.roll(-1, dims=1)
    return numbers.index_select(1, _first_last_index(n, numbers.device))


@lru_cache(maxsize=64)
def _first_last_index(n: int, device: torch.device) -> torch.Tensor:
    """``[n]`` int64 ``1, 2, ..., n - 1, 0``: the columns :func:`_arranged` gathers."""
    return torch.arange(1, n + 1, device=device).remainder_(n)


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


MAX_POSITION = 1 << 40
"""Positions lie in ``[0, MAX_POSITION)``: every stripe's counters then fit in 61 bits."""


def _row_tensor(name: str, value: torch.Tensor, batch: int, device: torch.device | None) -> None:
    """Refuse a per-row tensor that is not int64/int32 ``[batch]`` on the CPU or ``device``."""
    if value.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an int64 or int32 tensor, got {value.dtype}")
    if value.shape != (batch,):
        raise ValueError(f"{name} must have shape ({batch},), got {tuple(value.shape)}")
    if device is not None and value.device not in (torch.device("cpu"), device):
        raise ValueError(
            f"{name} is on {value.device}: give it on the CPU or on the batch's device ({device})"
        )


def _host_ints(
    name: str, values: object, batch: int, high: int, *, seeds: bool = False
) -> list[int | None]:
    """Host entries, one per row: ints in ``[0, high)`` (seeds: also ``None`` and ``-1``)."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a tensor or a sequence, got {type(values).__name__}")
    if len(values) != batch:
        raise ValueError(f"{name} must have one entry per row ({batch}), got {len(values)}")
    out: list[int | None] = []
    for v in values:
        if seeds and (v is None or (isinstance(v, numbers.Integral) and v == -1)):
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} entries must be int, got {type(v).__name__}")
        if not 0 <= int(v) < high:
            unseeded = " (None or -1: unseeded)" if seeds else ""
            bound = f"2**{high.bit_length() - 1}"
            raise ValueError(f"{name} entries must lie in [0, {bound}){unseeded}, got {v}")
        out.append(int(v))
    return out


def check_seeds(
    seeds: torch.Tensor | Sequence[int | None] | None,
    batch: int,
    device: torch.device | None = None,
) -> torch.Tensor | list[int | None] | None:
    """Validate per-row seeds: an int64/int32 tensor ``[batch]`` as it is, or a host list.

    Host entries are ``None`` or ``-1`` (not counter-seeded) or integers in ``[0, 2**64)``
    (every 64-bit value the counter-based hash takes); a tensor's negative entries mean "not
    counter-seeded", so a tensor holds seeds in ``[0, 2**63)``. With ``device``, a tensor must be
    on the CPU or on ``device``.

    Examples
    --------
    >>> check_seeds([3, -1, None], 3)
    [3, None, None]
    """
    if seeds is None:
        return None
    if isinstance(seeds, torch.Tensor):
        _row_tensor("seeds", seeds, batch, device)
        return seeds
    return _host_ints("seeds", seeds, batch, 1 << 64, seeds=True)


def seeding_from(
    batch: int,
    device: torch.device,
    *,
    seeds: torch.Tensor | Sequence[int | None] | None = None,
    generators: Mapping[int, torch.Generator] | None = None,
    generator: torch.Generator | None = None,
    generators_name: str = "generators",
) -> Seeding:
    """Validate the randomness arguments of an entry point and combine them.

    ``generators_name`` names ``generators`` in the messages. The shared ``generator`` must
    draw on ``device``.

    Examples
    --------
    >>> seeding_from(2, torch.device("cpu"), seeds=[3, None]).seeds.tolist()
    [3, -1]
    """
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if not _same_device(generator.device, device):
            raise ValueError(f"generator draws on {generator.device} but the batch is on {device}")
    own = dict(check_generators(generators, batch, generators_name))
    return Seeding.build(
        batch, device, seeds=check_seeds(seeds, batch, device), generators=own, generator=generator
    )


def check_seeding(seeding: object, batch: int, device: torch.device) -> Seeding:
    """A caller's :class:`~specsample.params.seeding.Seeding` checked against the batch.

    ``None`` stands for every row on torch's default generator. A seeding is built by
    :func:`seeding_from` for ``batch`` rows on ``device`` (its seeds live there and its shared
    generator draws there).

    Raises
    ------
    TypeError
        ``seeding`` is neither ``None`` nor a Seeding.
    ValueError
        It has another number of rows, or was built for another device.

    Examples
    --------
    >>> check_seeding(seeding_from(2, torch.device("cpu")), 3, torch.device("cpu"))
    Traceback (most recent call last):
    ...
    ValueError: seeding has 2 rows but the batch has 3
    """
    if seeding is None:
        return Seeding.build(batch, device)
    if not isinstance(seeding, Seeding):
        raise TypeError(
            "seeding must be a specsample.params.seeding.Seeding or None, got "
            f"{type(seeding).__name__}"
        )
    if seeding.batch != batch:
        raise ValueError(f"seeding has {seeding.batch} rows but the batch has {batch}")
    for name, where in (("seeds", seeding.seeds), ("generator", seeding.generator)):
        if where is not None and not _same_device(where.device, device):
            raise ValueError(
                f"seeding was built for {where.device} (its {name}) but the batch is on {device}"
            )
    return seeding


def _same_device(a: torch.device, b: torch.device) -> bool:
    """The same device, an index left out standing for index 0."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def positions_from(
    positions: torch.Tensor | Sequence[int] | None, batch: int, device: torch.device
) -> torch.Tensor | None:
    """Validate absolute positions as ``[batch]`` int64 on ``device``.

    Host integers, or an int64/int32 tensor on the CPU or on ``device``, in
    ``[0, MAX_POSITION)``; the values of a tensor on an accelerator, or of any tensor under
    :func:`torch.compile`, are not read (see :func:`check_position_values`).

    Examples
    --------
    >>> positions_from([4, 0], 2, torch.device("cpu")).tolist()
    [4, 0]
    """
    if positions is None:
        return None
    if isinstance(positions, torch.Tensor):
        _row_tensor("positions", positions, batch, device)
        if positions.device.type == "cpu" and not torch.compiler.is_compiling():
            _host_ints("positions", positions.tolist(), batch, MAX_POSITION)
    else:
        host = _host_ints("positions", positions, batch, MAX_POSITION)
        positions = torch.tensor(host, dtype=torch.int64)
    return positions.to(device=device, dtype=torch.int64, non_blocking=True)


def require_positions(seeding: Seeding, positions: torch.Tensor | None) -> None:
    """Refuse counter-seeded rows without positions.

    A seeded row's numbers are keyed by its seed and its absolute position: without
    positions every step would read the counters of position 0 again, so the samples of
    successive steps would not be independent.

    Examples
    --------
    >>> require_positions(seeding_from(1, torch.device("cpu"), seeds=[3]), None)
    Traceback (most recent call last):
    ...
    ValueError: seeds need positions: a seeded request's random numbers are keyed by its ...
    >>> require_positions(seeding_from(1, torch.device("cpu"), seeds=[None]), None)
    """
    if seeding.seeds is not None and positions is None:
        raise ValueError(
            "seeds need positions: a seeded request's random numbers are keyed by its seed "
            "and its absolute position, so without positions every step would read the "
            "numbers of position 0 again and the samples of successive steps would not be "
            "independent; pass positions=[...] (the number of tokens before each request's "
            "first draft) with seeds"
        )


def check_position_values(positions: torch.Tensor | None) -> None:
    """Strict-mode check of ``[batch]`` positions on any device (synchronises).

    Examples
    --------
    >>> check_position_values(torch.tensor([-3]))
    Traceback (most recent call last):
    ...
    ValueError: positions must lie in [0, 2**40), got -3
    """
    if positions is None or not positions.numel():
        return
    bad = (positions < 0) | (positions >= MAX_POSITION)
    if bool(bad.any()):
        bound = f"2**{MAX_POSITION.bit_length() - 1}"
        raise ValueError(f"positions must lie in [0, {bound}), got {int(positions[bad][0])}")
