"""Host tensors to a device in one copy: what a parameter object built on the host sends.

A step's parameters are small host tensors (counts, offsets, each row's request, sampling
parameters); a copy of each to an accelerator is one transfer, and computing them there one
kernel or more. :func:`to_device` packs them as bytes into one host buffer, copies it once,
and gives each back as a view of the copy, starting on a multiple of :data:`ALIGN` bytes as
a tensor of its own would (a kernel compiled for aligned pointers then serves every batch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ALIGN = 16
"""Bytes to which each tensor :func:`to_device` gives back is aligned."""


def to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """``tensors`` (1-D host tensors, any dtypes) on ``device``, moved in one copy.

    Parameters
    ----------
    tensors : sequence of torch.Tensor
        1-D host tensors; each comes back with its length and dtype.
    device : torch.device
        Where they go. On the CPU the tensors are given back as they are.

    Returns
    -------
    list of torch.Tensor
        Views of one buffer on ``device``, in the order given, each starting on a multiple
        of :data:`ALIGN` bytes.

    Examples
    --------
    >>> ints, flags = to_device([torch.arange(3), torch.tensor([True])], torch.device("meta"))
    >>> ints.shape, ints.dtype, flags.shape, flags.dtype
    (torch.Size([3]), torch.int64, torch.Size([1]), torch.bool)
    """
    return list(tensors) if device.type == "cpu" else _packed(tensors, device)


def _packed(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """:func:`to_device`'s one copy, on any device: the tensors' bytes packed, copied, viewed."""
    parts, offsets, offset = [], [], 0
    for tensor in tensors:
        data = tensor.contiguous().view(torch.uint8)
        padding = -data.numel() % ALIGN
        parts += [data, torch.zeros(padding, dtype=torch.uint8)]
        offsets.append(offset)
        offset += data.numel() + padding
    packed = torch.cat(parts).to(device, non_blocking=True)
    return [
        packed[start : start + t.numel() * t.element_size()].view(t.dtype)
        for t, start in zip(tensors, offsets, strict=True)
    ]
