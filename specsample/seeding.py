"""The randomness arguments of the entry points, validated: seeds, generators, positions.

Every entry point (:func:`specsample.verify`, :class:`specsample.RejectionSampler`, the
generation loop) checks what the caller gives here and turns it into a
:class:`specsample.random.Seeding` (:func:`seeding_from`) and ``[batch]`` int64 positions;
the tree rules (:func:`specsample.rules.tree.tree_verify`) take a Seeding so built and check
it against their batch (:func:`check_seeding`). Seeds come with positions
(:func:`require_positions`): a seeded step without them would reuse position 0's numbers.
Host values are checked on the host; tensors only for dtype, shape and device (their values
in strict mode, :func:`check_position_values`), so nothing synchronises by default.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import torch

from specsample.random import Seeding, check_generators

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
    """A caller's :class:`~specsample.random.Seeding` checked against the batch.

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
            f"seeding must be a specsample.random.Seeding or None, got {type(seeding).__name__}"
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
