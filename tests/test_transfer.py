"""Host tensors sent to a device in one copy (:mod:`specsample.params.transfer`).

The packing is run on the CPU (where :func:`~specsample.params.transfer.to_device` itself
gives the tensors back as they are): every tensor must come back with its dtype, length and
values, starting on a multiple of ``ALIGN`` bytes whatever the lengths before it.
"""

from __future__ import annotations

import pytest
import torch

from specsample.params import transfer

CPU = torch.device("cpu")


@pytest.mark.parametrize("lengths", [(3, 1, 5, 0, 2), (0,), (8, 8), (1, 2, 3, 4, 5, 6, 7)])
def test_packed_tensors_come_back_whole_and_aligned(lengths: tuple[int, ...]) -> None:
    dtypes = [torch.int64, torch.float32, torch.bool, torch.uint8, torch.float64, torch.int32]
    gen = torch.Generator().manual_seed(sum(lengths))
    tensors = [
        (torch.rand(n, generator=gen) * 100).to(dtypes[i % len(dtypes)])
        for i, n in enumerate(lengths)
    ]
    moved = transfer._packed(tensors, CPU)
    assert len(moved) == len(tensors)
    for given, got in zip(tensors, moved, strict=True):
        assert got.dtype == given.dtype and torch.equal(got, given)
        assert got.data_ptr() % transfer.ALIGN == 0


def test_on_the_cpu_the_tensors_are_given_back() -> None:
    tensors = [torch.arange(3), torch.ones(2)]
    assert all(a is b for a, b in zip(transfer.to_device(tensors, CPU), tensors, strict=True))


def test_another_device_gets_one_view_of_each() -> None:
    moved = transfer.to_device(
        [torch.arange(3), torch.ones(5, dtype=torch.bool)], torch.device("meta")
    )
    assert [(t.device.type, t.dtype, t.shape[0]) for t in moved] == [
        ("meta", torch.int64, 3),
        ("meta", torch.bool, 5),
    ]
