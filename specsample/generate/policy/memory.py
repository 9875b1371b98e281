"""What the draft-length policy carries from one run to the next: an object its caller owns.

Step times depend on the models, the drafter, the machine and its threads, not on the
prompts; how often first drafts pass depends on the models, the drafter and how the
target's tokens are drawn (greedy drafts from prompt lookup pass far more often than
sampled ones). A :class:`PolicyMemory` keeps both, by target model and by what else they
depend on, so runs given the same memory start from what earlier ones measured and saw
(and keep refining it) instead of trying every draft length again. A run given no memory
starts fresh.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from specsample.generate.policy.acceptance import History
from specsample.generate.policy.costs import CostModel

T = TypeVar("T")

Table = weakref.WeakKeyDictionary[Any, dict[Hashable, T]]
"""Entries by target model (held weakly: they go with it), then by key."""


def _entry(table: Table[T], target: Any, key: Hashable, new: Callable[[], T]) -> T:
    """``table[target][key]``, made by ``new()`` the first time (and every time where
    ``target`` cannot be held weakly)."""
    try:
        entries = table.setdefault(target, {})
    except TypeError:
        return new()
    if key not in entries:
        entries[key] = new()
    return entries[key]


class PolicyMemory:
    """The step timings and first-draft acceptance that runs given this object share.

    Attributes
    ----------
    costs : weakref.WeakKeyDictionary
        ``costs[target][key]``: the :class:`CostModel` of the runs with that target model
        and key.
    histories : weakref.WeakKeyDictionary
        ``histories[target][key]``: their :class:`History`.

    Examples
    --------
    >>> class Model: ...
    >>> model, memory = Model(), PolicyMemory()
    >>> memory.cost_model(model, "ngram") is memory.cost_model(model, "ngram")
    True
    >>> memory.cost_model(model, "ngram") is PolicyMemory().cost_model(model, "ngram")
    False
    >>> memory.cost_model(model, "ngram") is memory.cost_model(model, "draft")
    False
    >>> memory.history(model, ("ngram", True)) is memory.history(model, ("ngram", False))
    False
    """

    def __init__(self) -> None:
        self.costs: Table[CostModel] = weakref.WeakKeyDictionary()
        self.histories: Table[History] = weakref.WeakKeyDictionary()

    def cost_model(self, target: Any, key: Hashable) -> CostModel:
        """The :class:`CostModel` of the runs with the ``target`` model and ``key``.

        Parameters
        ----------
        target : object
            The target model (held weakly: its timings go with it).
        key : hashable
            What else the timings depend on (the drafter, the thread count).
        """
        return _entry(self.costs, target, key, CostModel)

    def history(self, target: Any, key: Hashable) -> History:
        """The :class:`History` of the runs with the ``target`` model and ``key`` (what else
        acceptance depends on: the drafter, greedy or sampled), as :meth:`cost_model`."""
        return _entry(self.histories, target, key, History)
