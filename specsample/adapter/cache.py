"""The KV cache the decoding loop owns: rectangular, one mask bit and one position per slot.

A :class:`KVCache` holds, per model layer, the keys and values of every cached slot as
``[batch, heads, slots, dim]`` tensors inside buffers with room to spare (a forward copies
only its new slots; a full buffer is replaced by one twice the size needed). Every forward
appends the same number of slots to every row (:meth:`KVCache.add_slots` reserves them, then
each layer writes its keys and values with :meth:`KVCache.update`); each slot carries a mask
bit (whether later tokens may attend to it) and the position of its token, so each row
advances by its own accepted length while the cache stays rectangular. The operations the
loop needs keep the keys, values, mask and positions in step: mark the tail's rejected slots
(:meth:`~KVCache.set_tail_valid`), drop the tail (:meth:`~KVCache.drop_tail`), keep some rows
(:meth:`~KVCache.select`), append the rows of another cache (:meth:`~KVCache.join`) and drop
every masked slot (:meth:`~KVCache.compact`).

Examples
--------
>>> cache = KVCache(2)
>>> cache.add_slots(3)
>>> keys, values = cache.update(0, torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4))
>>> tuple(keys.shape), cache.width
((2, 1, 3, 4), 3)
>>> cache.set_tail_valid(torch.tensor([[1, 0], [1, 1]]))
>>> cache.compact()
True
>>> cache.width, cache.mask.tolist()
(3, [[0, 1, 1], [1, 1, 1]])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SPARE = 64
"""Slots every buffer starts with, and spare mask slots after a rebuild."""


class KVCache:
    """Per-layer keys and values ``[batch, heads, slots, dim]``, one mask bit and position per slot.

    Parameters
    ----------
    batch : int
        Rows.
    device : torch.device or str
        Where the mask and positions live (the keys and values live where the model writes
        them).

    Attributes
    ----------
    width : int
        Slots per row, including those reserved for the forward under way.
    """

    def __init__(self, batch: int, device: torch.device | str = "cpu") -> None:
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._lengths: list[int] = []
        self._mask = torch.zeros(batch, SPARE, dtype=torch.int64, device=device)
        self._positions = torch.zeros_like(self._mask)
        self.width = 0

    @property
    def batch(self) -> int:
        """Rows."""
        return self._mask.shape[0]

    @property
    def layers(self) -> int:
        """Layers written so far."""
        return len(self._keys)

    @property
    def mask(self) -> torch.Tensor:
        """``[batch, width]`` int64: 1 where later tokens may attend to a slot."""
        return self._mask[:, : self.width]

    @property
    def positions(self) -> torch.Tensor:
        """``[batch, width]`` int64: each slot's position (as recorded by :meth:`add_slots`)."""
        return self._positions[:, : self.width]

    def length(self, layer: int = 0) -> int:
        """Slots the keys and values of ``layer`` hold (0 for a layer not written yet)."""
        return self._lengths[layer] if layer < len(self._lengths) else 0

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of ``layer``: ``[batch, heads, length, dim]`` views."""
        length = self._lengths[layer]
        return self._keys[layer][:, :, :length], self._values[layer][:, :, :length]

    def add_slots(
        self, n: int, valid: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> None:
        """Reserve ``n`` slots in every row, before a forward writes their keys and values.

        Parameters
        ----------
        n : int
            Slots per row.
        valid : torch.Tensor, optional
            ``[batch, n]`` which new slots later tokens may attend to (default: all).
        positions : torch.Tensor, optional
            ``[batch, n]`` int64 the new slots' positions (recorded only when given).
        """
        capacity = self._mask.shape[1]
        if self.width + n > capacity:
            size = max(2 * capacity, self.width + n)
            self._mask, self._positions = (
                F.pad(slots[:, : self.width], (0, size - self.width))
                for slots in (self._mask, self._positions)
            )
        new = self._mask[:, self.width : self.width + n]
        if valid is None:
            new.fill_(1)
        else:
            new.copy_(valid)
        if positions is not None:
            self._positions[:, self.width : self.width + n].copy_(positions)
        self.width += n

    def update(
        self, layer: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key`` and ``value`` ``[batch, heads, n, dim]`` to ``layer``; return all of its.

        Layers are created in order, on their first update. Only the new slots are copied,
        unless the layer's buffer is full: it is then replaced by one twice the size needed.

        Raises
        ------
        ValueError
            ``key`` or ``value`` is not a 4-D tensor.
        """
        if key.dim() != 4 or value.dim() != 4:
            raise ValueError(
                "key and value must be [batch, heads, slots, dim] tensors, got shapes "
                f"{tuple(key.shape)} and {tuple(value.shape)}"
            )
        if layer == len(self._keys):
            self._keys.append(key[:, :, :0])
            self._values.append(value[:, :, :0])
            self._lengths.append(0)
        length = self._lengths[layer]
        total = length + key.shape[2]
        self._keys[layer] = _with_room(self._keys[layer], length, total)
        self._values[layer] = _with_room(self._values[layer], length, total)
        self._keys[layer][:, :, length:total].copy_(key)
        self._values[layer][:, :, length:total].copy_(value)
        self._lengths[layer] = total
        return self.layer(layer)

    def set_tail_valid(self, valid: torch.Tensor) -> None:
        """Set the mask of the last ``n`` slots to ``valid [batch, n]`` (rejected drafts: 0)."""
        n = valid.shape[1]
        self._mask[:, self.width - n : self.width].copy_(valid)

    def drop_tail(self, n: int) -> None:
        """Drop the last ``n`` slots of every row (their buffers are written over next)."""
        if n <= 0:
            return
        self._lengths = [length - n for length in self._lengths]
        self._mask[:, self.width - n : self.width] = 0
        self.width -= n

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows at ``index`` (``[kept]`` int64), in that order."""
        for tensors in (self._keys, self._values):
            for i, tensor in enumerate(tensors):
                tensors[i] = tensor[index, :, : self._lengths[i]]
        self._mask = self._mask[index]
        self._positions = self._positions[index]

    def compact(self) -> bool:
        """Drop every masked slot (each row's valid slots gathered to the right, in order).

        Returns
        -------
        bool
            Whether the cache was compacted (one with no layer written yet never is).
        """
        if not self._keys:
            return False
        mask = self.mask
        longest = int(mask.sum(dim=1).max()) if mask.shape[0] else 0
        slots = torch.arange(self.width, device=mask.device)
        order = torch.where(mask.bool(), slots, -1).sort(dim=1).values
        kept = order[:, self.width - longest :]
        index = kept.clamp(min=0)
        for tensors in (self._keys, self._values):
            for i, tensor in enumerate(tensors):
                batch, heads, _, dim = tensor.shape
                gather = index[:, None, :, None].expand(batch, heads, -1, dim)
                tensors[i] = tensor[:, :, : self.width].gather(2, gather)
        self._lengths = [kept.shape[1]] * len(self._keys)
        positions = self.positions.gather(1, index)
        self._rebuild_slots([((kept >= 0).to(torch.int64), positions)], kept.shape[1])
        return True

    def join(self, other: KVCache) -> None:
        """Append the rows of ``other`` (a cache of the same model) after this cache's rows.

        The narrower of the two is left-padded with masked slots, so every row keeps its
        slots in order and the cache stays rectangular (positions are explicit, so the
        padding changes nothing a model computes).
        """
        width = max(self.width, other.width)
        if width:
            self._join_layers(other, width)
        self._rebuild_slots([(self.mask, self.positions), (other.mask, other.positions)], width)

    def _join_layers(self, other: KVCache, width: int) -> None:
        """Stack this cache's keys and values and ``other``'s, left-padded to ``width`` slots."""
        mine = [self.layer(i) for i in range(self.layers)]
        theirs = [other.layer(i) for i in range(other.layers)]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for index, pair in enumerate(mine or theirs):
            for kind, joined in enumerate((keys, values)):
                parts = [
                    _left_padded(layers[index][kind] if layers else None, pair[kind], rows, width)
                    for layers, rows in ((mine, self.batch), (theirs, other.batch))
                ]
                joined.append(torch.cat(parts))
        self._keys, self._values = keys, values
        self._lengths = [width] * len(keys)

    def _rebuild_slots(self, rows: list[tuple[torch.Tensor, torch.Tensor]], width: int) -> None:
        """New mask and positions: the ``(mask, positions)`` blocks of ``rows`` stacked, each
        right-aligned in ``width`` slots, with :data:`SPARE` slots to spare."""
        batch = sum(mask.shape[0] for mask, _ in rows)
        device = self._mask.device
        self._mask, self._positions = (
            torch.zeros(batch, width + SPARE, dtype=torch.int64, device=device) for _ in range(2)
        )
        start = 0
        for mask, positions in rows:
            end = start + mask.shape[0]
            self._mask[start:end, width - mask.shape[1] : width] = mask
            self._positions[start:end, width - positions.shape[1] : width] = positions
            start = end
        self.width = width


def _left_padded(
    tensor: torch.Tensor | None, like: torch.Tensor, rows: int, width: int
) -> torch.Tensor:
    """``tensor [rows, heads, n, dim]`` behind ``width - n`` zero slots; all zeros (``like``'s
    heads, dim and dtype) when ``None``."""
    if tensor is None:
        return like.new_zeros(rows, like.shape[1], width, like.shape[3])
    pad = width - tensor.shape[2]
    return F.pad(tensor, (0, 0, pad, 0)) if pad else tensor


def _with_room(buffer: torch.Tensor, length: int, total: int) -> torch.Tensor:
    """``buffer`` if it holds ``total`` slots, else a buffer of twice that with its first
    ``length`` slots copied over."""
    if buffer.shape[2] >= total:
        return buffer
    batch, heads, _, dim = buffer.shape
    fresh = buffer.new_empty(batch, heads, max(2 * total, SPARE), dim)
    if length:
        fresh[:, :, :length].copy_(buffer[:, :, :length])
    return fresh
