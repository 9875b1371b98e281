"""The committed tokens of the active sequences (:mod:`specsample.generate.state`).

:class:`DecodeState` against a plain list of rows kept by hand: the last committed token of
each row, the rows kept by :meth:`~DecodeState.select` (in the order given), and the finished
sequences :meth:`~DecodeState.archive` keeps (the last :data:`FINISHED_KEPT`, oldest first,
with a host bound on their lengths).
"""

from __future__ import annotations

import torch

from specsample.generate.state import FINISHED_KEPT, DecodeState

CAPACITY = 12


def _state(rows: list[list[int]]) -> DecodeState:
    """A state holding ``rows`` (stale columns filled with -7)."""
    tokens = torch.full((len(rows), CAPACITY), -7, dtype=torch.int64)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.int64)
    return DecodeState(tokens, lengths, max(len(row) for row in rows), 100)


def _rows(tokens: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    return [tokens[i, : int(n)].tolist() for i, n in enumerate(lengths)]


def _random_rows(generator: torch.Generator, count: int) -> list[list[int]]:
    lengths = torch.randint(1, CAPACITY + 1, (count,), generator=generator).tolist()
    return [torch.randint(0, 100, (n,), generator=generator).tolist() for n in lengths]


def test_last_tokens_and_select_follow_the_rows() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        rows = _random_rows(generator, 6)
        state = _state(rows)
        assert state.batch == 6
        assert state.last_tokens().tolist() == [row[-1] for row in rows]
        index = torch.randperm(6, generator=generator)[: int(torch.randint(0, 7, (1,)))]
        state.select(index)
        kept = [rows[i] for i in index.tolist()]
        assert state.batch == len(kept)
        assert _rows(state.tokens, state.lengths) == kept
        if kept:
            assert state.last_tokens().tolist() == [row[-1] for row in kept]


def test_archive_keeps_the_last_finished_sequences_oldest_first() -> None:
    generator = torch.Generator().manual_seed(1)
    state = _state([[1, 2]])
    assert state.finished is None and state.finished_lengths is None
    finished: list[list[int]] = []
    widest = 0
    for batch in (1, 3, FINISHED_KEPT, 2, FINISHED_KEPT + 5, 1):
        rows = _random_rows(generator, batch)
        done = _state(rows)
        longest = max(len(row) for row in rows) + 1  # an upper bound, not the maximum
        state.archive(done.tokens, done.lengths, longest)
        finished = (finished + rows)[-FINISHED_KEPT:]
        widest = max(widest, longest)
        assert state.finished is not None and state.finished_lengths is not None
        assert _rows(state.finished, state.finished_lengths) == finished
        assert state.finished_width == widest
    assert _rows(state.tokens, state.lengths) == [[1, 2]]
