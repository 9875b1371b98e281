"""Atomic operations on int64 array elements (:mod:`specsample.kernels.cpu.atomics`).

On one thread they behave as the plain operations they replace (``fetch_add`` returns the
value before its addition; ``claim`` succeeds once, for the thread that finds the expected
value; ``publish`` then ``read`` round-trips). On several, threads that take items by
``fetch_add`` take each exactly once, and a value written before ``publish`` is seen after
``read`` gives the published value. Skipped without numba.
"""

from __future__ import annotations

import numpy as np
import pytest

from specsample.kernels.cpu import compiler

pytestmark = pytest.mark.skipif(not compiler.available(), reason="the atomics need numba")


@pytest.fixture(scope="module")
def kernels() -> dict[str, object]:
    """Small kernels over the atomics, compiled once for this module."""
    from specsample.kernels.cpu import atomics
    from specsample.kernels.cpu.compiler import njit, prange

    @njit
    def one_thread(cells: np.ndarray) -> tuple[int, int, bool, bool, int]:
        first = atomics.fetch_add(cells, 0, 5)
        second = atomics.fetch_add(cells, 0, 1)
        won = atomics.claim(cells, 1, 0, 7)
        lost = atomics.claim(cells, 1, 0, 9)
        atomics.publish(cells, 2, 11)
        return first, second, won, lost, atomics.read(cells, 2)

    @njit(parallel=True)
    def take_all(items: int, workers: int, takers: np.ndarray, seen: np.ndarray) -> None:
        counter = np.zeros(1, np.int64)
        for w in prange(workers):
            item = atomics.fetch_add(counter, 0, 1)
            while item < items:
                takers[item] = w
                item = atomics.fetch_add(counter, 0, 1)
            for i in range(items):
                if atomics.claim(seen, i, 0, w + 1):
                    break

    @njit(parallel=True)
    def hand_over(rounds: int, values: np.ndarray, flags: np.ndarray) -> int:
        mismatches = 0
        for w in prange(2):
            for r in range(rounds):
                if w == 0:
                    values[r] = r * 3 + 1
                    atomics.publish(flags, r, 1)
                else:
                    while atomics.read(flags, r) == 0:
                        pass
                    mismatches += values[r] != r * 3 + 1
        return mismatches

    return {"one_thread": one_thread, "take_all": take_all, "hand_over": hand_over}


def test_on_one_thread_they_act_as_the_plain_operations(kernels: dict) -> None:
    cells = np.zeros(3, np.int64)
    assert kernels["one_thread"](cells) == (0, 5, True, False, 11)
    assert cells.tolist() == [6, 7, 11]


def test_threads_take_each_item_once(kernels: dict) -> None:
    items, workers = 20000, 4
    takers = np.full(items, -1, np.int64)
    seen = np.zeros(items, np.int64)
    kernels["take_all"](items, workers, takers, seen)
    assert (takers >= 0).all() and (takers < workers).all()
    claimed = seen[seen > 0]
    assert len(claimed) == workers
    assert sorted(claimed.tolist()) == list(range(1, workers + 1))


def test_a_published_value_follows_the_writes_before_it(kernels: dict) -> None:
    rounds = 20000
    values = np.zeros(rounds, np.int64)
    flags = np.zeros(rounds, np.int64)
    assert kernels["hand_over"](rounds, values, flags) == 0
