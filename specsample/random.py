"""Random numbers for verification, drawn without any host synchronisation.

Two sources are offered:

* a :class:`torch.Generator` (or torch's default one), through :func:`torch.rand`;
* a counter-based stream keyed by a per-row seed and a counter, so that a row's
  numbers depend on nothing but its seed and counter: not on its index in the batch,
  not on the other rows, not on how many numbers anybody drew before.

The counter-based stream hashes ``(seed, stream, counter)`` with integer tensor
arithmetic (a chain of 32-bit "lowbias32" mixers, computed in int64 without overflow),
so it runs on any device, composes with :func:`torch.compile`, and needs no state.
Its uniforms lie on a grid of step ``2**-32``.
"""

from __future__ import annotations

import torch

__all__ = ["STEP_STRIDE", "counter_uniform", "row_uniforms", "step_uniforms"]

_MASK32 = 0xFFFFFFFF
_STREAM_KEYS = (0x68E31DA4, 0xB5297A4D, 0x1B56C4E9, 0x3C6EF372)

STEP_STRIDE = 1 << 8
"""Counters a verification step may use per position (so at most ``STEP_STRIDE - 1`` drafts)."""


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, never overflowing int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash with strong avalanche (lowbias32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """Uniforms in ``[0, 1)`` that are a pure function of ``(seed, stream, counter)``.

    Parameters
    ----------
    seeds : torch.Tensor
        ``[batch]`` integer tensor; every 64-bit value is a valid seed.
    counters : torch.Tensor
        ``[batch, n]`` non-negative integer tensor, on the device of ``seeds``.
    stream : int
        Which of four independent streams to read (``0 <= stream < 4``).

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
    if not 0 <= stream < len(_STREAM_KEYS):
        raise ValueError(f"stream must be in [0, {len(_STREAM_KEYS)}), got {stream}")
    seeds = seeds.to(torch.int64)
    counters = counters.to(torch.int64)
    key = _mix32(_mix32((seeds & _MASK32) ^ _STREAM_KEYS[stream]) ^ ((seeds >> 32) & _MASK32))
    inner = _mix32(((counters >> 32) & _MASK32) ^ 0x9E3779B9)
    h = _mix32(key.unsqueeze(-1) ^ _mix32((counters & _MASK32) ^ inner))
    return h.to(torch.float64) * (1.0 / 4294967296.0)


def row_uniforms(
    batch: int,
    n: int,
    *,
    device: torch.device,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    stream: int = 0,
) -> torch.Tensor:
    """Draw ``n`` uniforms per row, seeded rows from their own counter-based stream.

    Parameters
    ----------
    batch, n : int
        Output shape ``[batch, n]``.
    device : torch.device
        Where the uniforms live.
    generator : torch.Generator, optional
        Used for unseeded rows; torch's default generator when ``None``.
    seeds : torch.Tensor, optional
        ``[batch]`` int64. A row with a seed ``>= 0`` reads the counters
        ``offset .. offset + n - 1`` of its own stream; a negative seed marks a row that
        uses ``generator``.
    offsets : torch.Tensor, optional
        ``[batch]`` int64 counter offsets (for example the sequence position), default 0.
    stream : int
        Which independent counter stream seeded rows read (see :func:`counter_uniform`).

    Returns
    -------
    torch.Tensor
        ``[batch, n]`` float64 in ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> a = row_uniforms(2, 3, device=torch.device("cpu"), seeds=torch.tensor([5, -1]))
    >>> b = row_uniforms(1, 3, device=torch.device("cpu"), seeds=torch.tensor([5]))
    >>> bool(torch.equal(a[0], b[0]))
    True
    """
    drawn = torch.rand(batch, n, dtype=torch.float64, device=device, generator=generator)
    if seeds is None:
        return drawn
    counters = torch.arange(n, device=device, dtype=torch.int64).expand(batch, n)
    if offsets is not None:
        counters = counters + offsets.to(device=device, dtype=torch.int64).unsqueeze(-1)
    seeded = counter_uniform(seeds, counters, stream)
    return torch.where(seeds.unsqueeze(-1) >= 0, seeded, drawn)


def step_uniforms(
    batch: int,
    k: int,
    device: torch.device,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The uniforms of one verification step: ``k`` accept tests, then the final draw.

    Seeded rows key their accept tests by ``(seed, position * STEP_STRIDE + j)`` on stream 0
    and the final draw by ``(seed, position)`` on stream 1, where ``position`` is the
    position of the row's first draft. Each step owns a stripe of counters that no other
    position touches, so a decoding loop whose positions increase from step to step never
    reuses a number: not even one that only influenced a decision indirectly, as every
    ``eta_i`` does in block verification.

    Parameters
    ----------
    batch, k : int
        Rows and drafts per row (``k < STEP_STRIDE``).
    device : torch.device
        Where the uniforms live.
    generator : torch.Generator, optional
        For unseeded rows.
    seeds : torch.Tensor, optional
        ``[batch]`` int64; negative entries are unseeded.
    positions : torch.Tensor, optional
        ``[batch]`` int64 position of each row's first draft (default 0).

    Returns
    -------
    torch.Tensor
        ``[batch, k + 1]`` float64 in ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> u = step_uniforms(2, 3, torch.device("cpu"), seeds=torch.tensor([1, 1]))
    >>> u.shape, bool(torch.equal(u[0], u[1]))
    (torch.Size([2, 4]), True)
    """
    if not 0 <= k < STEP_STRIDE:
        raise ValueError(f"k must lie in [0, {STEP_STRIDE}), got {k}")
    if seeds is None:
        return torch.rand(batch, k + 1, dtype=torch.float64, device=device, generator=generator)
    start = torch.zeros(batch, dtype=torch.int64, device=device)
    if positions is not None:
        start = positions.to(device=device, dtype=torch.int64)
    draw = {"device": device, "generator": generator, "seeds": seeds}
    accept = row_uniforms(batch, k, offsets=start * STEP_STRIDE, stream=0, **draw)  # type: ignore[arg-type]
    final = row_uniforms(batch, 1, offsets=start, stream=1, **draw)  # type: ignore[arg-type]
    return torch.cat([accept, final], dim=1)
