"""What a batch asks for (:mod:`specsample.params.metadata`): its ragged layout and sampling
parameters.

:class:`BatchLayout` is checked against a direct computation of the flattened rows (request by
request: its draft rows, then its bonus row), from host counts, CPU tensors and counts treated
as resident on the batch's device; :class:`SamplingMetadata` against the parameters it was
built from, row by row. Refusals name the argument.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsample.params import layout as layout_module
from specsample.params import metadata, transfer
from specsample.params.layout import BatchLayout
from specsample.params.metadata import GREEDY_BELOW, SamplingMetadata

CPU = torch.device("cpu")
COUNTS = st.lists(st.integers(0, 6), max_size=8)


def _direct(counts: list[int], bonus_rows: bool) -> tuple[list[int], list[int], list[int]]:
    """First draft row, first target row and the request of every target row, by walking."""
    draft_start, target_start, owner = [], [], []
    draft_row = target_row = 0
    for i, n in enumerate(counts):
        draft_start.append(draft_row)
        target_start.append(target_row)
        rows = n + (1 if bonus_rows else 0)
        owner += [i] * rows
        draft_row += n
        target_row += rows
    return draft_start, target_start, owner


def _check(layout: BatchLayout, counts: list[int], bonus_rows: bool, widest: int) -> None:
    draft_start, target_start, owner = _direct(counts, bonus_rows)
    assert (layout.batch, layout.total_drafts, layout.max_drafts) == (
        len(counts),
        sum(counts),
        widest,
    )
    assert layout.bonus_rows == bonus_rows
    assert layout.num_drafts.dtype == torch.int64 and layout.num_drafts.tolist() == counts
    assert layout.draft_start.tolist() == draft_start
    assert layout.target_start.tolist() == target_start
    assert layout.target_rows == len(owner)
    assert layout.target_request.tolist() == owner
    tensors = (layout.num_drafts, layout.draft_start, layout.target_start, layout.target_request)
    assert all(t.data_ptr() % 16 == 0 for t in tensors), "a kernel sees aligned pointers"


@given(counts=COUNTS, bonus_rows=st.booleans(), extra=st.integers(0, 2))
def test_layout_offsets_equal_a_direct_computation(
    counts: list[int], bonus_rows: bool, extra: int
) -> None:
    """Host counts, as a list or a CPU tensor, give the direct computation's offsets, sent
    to the device in the one aligned copy an accelerator gets (run on the CPU here)."""
    widest = max([0, *counts])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layout_module, "to_device", transfer._packed)
        build = partial(BatchLayout.build, device=CPU, bonus_rows=bonus_rows)
        _check(build(counts), counts, bonus_rows, widest)
        _check(build(torch.tensor(counts, dtype=torch.int32)), counts, bonus_rows, widest)
        _check(build(counts, max_drafts=widest + extra), counts, bonus_rows, widest + extra)


@given(counts=COUNTS, bonus_rows=st.booleans())
def test_device_counts_give_the_host_layout(counts: list[int], bonus_rows: bool) -> None:
    """Counts resident on the batch's device are never read: their sum and maximum are given."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metadata, "_on_host", lambda _tensor: False)
        device_counts = torch.tensor(counts, dtype=torch.int64)
        widest = max([0, *counts])
        layout = BatchLayout.build(
            device_counts, CPU, total_drafts=sum(counts), max_drafts=widest, bonus_rows=bonus_rows
        )
        _check(layout, counts, bonus_rows, widest)
        with pytest.raises(ValueError, match="max_draft_tokens"):
            BatchLayout.build(device_counts, CPU, bonus_rows=bonus_rows)


def test_layout_refuses_bad_counts_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="max_draft_tokens is 1 but a request has 2"):
        BatchLayout.build([2, 0], CPU, max_drafts=1)
    with pytest.raises(ValueError, match="max_draft_tokens must be >= 0"):
        BatchLayout.build([0], CPU, max_drafts=-1)
    with pytest.raises(TypeError, match="max_draft_tokens must be an int"):
        BatchLayout.build([0], CPU, max_drafts=True)
    with pytest.raises(ValueError, match=r"num_draft_tokens entries must lie in \[0, 2\*\*63\)"):
        BatchLayout.build([1, -1], CPU)
    with pytest.raises(TypeError, match="num_draft_tokens entries must be int"):
        BatchLayout.build([1.0], CPU)
    with pytest.raises(TypeError, match="num_draft_tokens must be a sequence"):
        BatchLayout.build("12", CPU)
    with pytest.raises(TypeError, match="num_draft_tokens must be an integer tensor"):
        BatchLayout.build(torch.tensor([1.0]), CPU)
    with pytest.raises(ValueError, match=r"num_draft_tokens must have shape \[batch\]"):
        BatchLayout.build(torch.tensor([[1]]), CPU)


def test_sampling_metadata_matches_its_parameters_row_by_row() -> None:
    """Greedy rows get ``1 / T = 1`` and every filter off; a filter off everywhere is ``None``;
    the host hints follow the rows; selected rows equal the metadata built for them alone."""
    temperature = [0.0, 0.5, 2.0, GREEDY_BELOW / 2, 1.0]
    top_k = [3, 0, 5, 4, 0]
    top_p = [0.5, 0.9, 1.0, 0.2, 1.0]
    meta = SamplingMetadata.build(
        5, CPU, temperature=temperature, top_k=top_k, top_p=top_p, min_p=0.0
    )
    greedy = [t < GREEDY_BELOW for t in temperature]
    assert meta.batch == 5 and meta.greedy.tolist() == greedy
    expected_inv = [1.0 if g else 1.0 / t for g, t in zip(greedy, temperature, strict=True)]
    assert meta.inv_temperature.tolist() == pytest.approx(expected_inv)
    assert meta.top_k is not None and meta.top_p is not None and meta.min_p is None
    assert meta.top_k.tolist() == [0 if g else k for g, k in zip(greedy, top_k, strict=True)]
    want_p = [1.0 if g else p for g, p in zip(greedy, top_p, strict=True)]
    assert meta.top_p.tolist() == pytest.approx(want_p)
    assert (meta.all_greedy, meta.any_greedy, meta.max_top_k) == (False, True, 5)
    for rows in ([1, 2], [0, 3], [4, 1, 0]):
        alone = SamplingMetadata.build(
            len(rows),
            CPU,
            temperature=[temperature[i] for i in rows],
            top_k=[top_k[i] for i in rows],
            top_p=[top_p[i] for i in rows],
        )
        kept = meta.rows(torch.tensor(rows))
        assert torch.equal(kept.greedy, alone.greedy)
        assert torch.equal(kept.inv_temperature, alone.inv_temperature)
        for name, off in (("top_k", 0), ("top_p", 1.0)):
            mine, theirs = getattr(kept, name), getattr(alone, name)
            if theirs is None:  # off in every selected row
                theirs = torch.full_like(mine, off)
            assert torch.equal(mine, theirs), (rows, name)
    greedy_only = SamplingMetadata.build(2, CPU, temperature=0.0, top_k=7, top_p=0.5)
    assert greedy_only.all_greedy and greedy_only.top_k is None and greedy_only.top_p is None


def test_sampling_metadata_refuses_bad_values_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingMetadata.build(2, CPU, top_p=[0.5, 0.0])
    with pytest.raises(ValueError, match="temperature"):
        SamplingMetadata.build(1, CPU, temperature=-1.0)
    with pytest.raises(TypeError, match="top_k"):
        SamplingMetadata.build(1, CPU, top_k="3")
    with pytest.raises(ValueError, match="min_p"):
        SamplingMetadata.build(3, CPU, min_p=[0.1, 0.2])


FIELDS = ("inv_temperature", "greedy", "top_k", "top_p", "min_p")
HINTS = ("all_greedy", "any_greedy", "max_top_k")
MOVED_CASES = [
    (3, {}),
    (4, {"temperature": [0.0, 0.7, 1.0, 2.5], "top_k": [0, 5, 3, 2], "top_p": 0.9}),
    (2, {"temperature": 0.8, "top_k": 40, "top_p": [0.5, 1.0], "min_p": [0.0, 0.1]}),
    (3, {"temperature": torch.tensor([0.0, 0.0, 0.0]), "top_k": torch.tensor([1, 2, 3])}),
    (0, {"temperature": [], "min_p": 0.2}),
]


@pytest.mark.parametrize(("batch", "params"), MOVED_CASES)
def test_parameters_moved_in_one_copy_equal_those_built_in_place(
    batch: int, params: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host parameters are built on the host and packed into one copy for the device (the
    packing run on the CPU here, where it is otherwise skipped): each tensor comes out with
    its dtype, shape and values, 16-byte aligned, the host hints unchanged."""
    monkeypatch.setattr(metadata, "to_device", transfer._packed)
    built = SamplingMetadata.build(batch, CPU, **params)
    moved = metadata._moved(built, CPU)
    for name in FIELDS:
        expected, got = getattr(built, name), getattr(moved, name)
        assert (expected is None) == (got is None), name
        if expected is not None:
            assert got.dtype == expected.dtype and torch.equal(got, expected), name
            assert got.data_ptr() % transfer.ALIGN == 0, name
    assert [getattr(moved, h) for h in HINTS] == [getattr(built, h) for h in HINTS]


@pytest.mark.parametrize(("batch", "params"), MOVED_CASES)
def test_host_parameters_for_another_device_arrive_there_whole(
    batch: int, params: dict[str, object]
) -> None:
    """For a device other than the CPU (the meta device here), host parameters take the
    packed copy: every tensor lands on the device with the dtype and shape of a CPU build."""
    meta_device = torch.device("meta")
    on_meta = SamplingMetadata.build(batch, meta_device, **params)
    built = SamplingMetadata.build(batch, CPU, **params)
    for name in FIELDS:
        expected, got = getattr(built, name), getattr(on_meta, name)
        assert (expected is None) == (got is None), name
        if expected is not None:
            assert got.device == meta_device, name
            assert (got.dtype, got.shape) == (expected.dtype, expected.shape), name
