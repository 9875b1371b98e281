"""What the draft-length policy knows of cost: measured step times by batch size and width.

:class:`CostModel` keeps the time of the target's side of a step (its forward, verification
and commit) by batch size and slots scored, and of one draft forward by batch size; widths
not measured are read off the line through the measured ones.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Any

TIMINGS_KEPT = 3
"""How many recent timings of each width (or batch size) a cost estimate is the fastest of:
noise only ever adds time (a pause, a cold cache, the first step of a shape), so one slow
step does not move the estimate, and the next normal one undoes a slow start."""

TIMINGS_TO_TRUST = 2
"""How many timings a width needs at about a batch size before the policy stops trying it:
the first step of a width is often slow for reasons that do not recur."""

FRESH_FOR = 1000
"""After this many steps without a step of ``k_max`` at about a batch size, one is timed
again, since the machine's speed drifts (a width timed only while another process slowed
every step would otherwise look dear for good)."""


class CostModel:
    """Measured step times: the target's side by batch size and width, a draft forward by
    batch size.

    The target's side of a step is its forward, its verification and its commit: all that a
    step costs besides drafting. Each time is the fastest of its last :data:`TIMINGS_KEPT`
    timings, so a step that an unrelated pause made slow does not move it. A width not
    measured at a batch size is read off the line through that batch size's measured
    widths; a batch size with fewer than two takes the curve of the nearest one that has
    them, scaled to agree with its own measured width if it has one. :attr:`tried` holds
    the pairs ``(draft length, batch.bit_length())`` measured :data:`TIMINGS_TO_TRUST` times:
    which lengths were timed often enough at about which batch size; :meth:`fresh` says
    whether one was timed lately (:attr:`steps` counts the target timings).

    Examples
    --------
    >>> c = CostModel()
    >>> c.observe_target(8, 1, 0.010); c.observe_target(8, 5, 0.026)
    >>> round(c.target_time(8, 3), 4)
    0.018
    >>> c.observe_target(4, 1, 0.005); round(c.target_time(4, 3), 4)
    0.009
    >>> c.observe_draft(8, 0.001); round(c.draft_time(4), 4)
    0.001
    """

    def __init__(self) -> None:
        self.target: dict[int, dict[int, float]] = {}
        self.draft: dict[int, float] = {}
        self._target: dict[tuple[int, int], deque[tuple[int, float]]] = {}
        self._draft: dict[int, deque[tuple[int, float]]] = {}
        self._kept: Counter[tuple[int, int]] = Counter()
        self._latest: dict[tuple[int, int], int] = {}
        self.steps = 0

    @property
    def tried(self) -> set[tuple[int, int]]:
        """``(draft length, batch.bit_length())`` of the steps timed at least
        :data:`TIMINGS_TO_TRUST` times."""
        return {length for length, kept in self._kept.items() if kept >= TIMINGS_TO_TRUST}

    def fresh(self, batch: int, width: int) -> bool:
        """Whether ``width`` slots were timed at about ``batch`` sequences (within a factor
        of two) in the last :data:`FRESH_FOR` steps."""
        latest = self._latest.get((width - 1, batch.bit_length()))
        return latest is not None and latest > self.steps - FRESH_FOR

    def observe_target(self, batch: int, width: int, seconds: float) -> None:
        """The target's side of a step over ``width`` slots of ``batch`` sequences took
        ``seconds``."""
        self.steps += 1
        length = (width - 1, batch.bit_length())
        self._latest[length] = self.steps
        if len(self._target.get((batch, width), ())) < TIMINGS_KEPT:
            self._kept[length] += 1
        fastest = self._observe(self._target, (batch, width), seconds)
        self.target.setdefault(batch, {})[width] = fastest

    def observe_draft(self, batch: int, seconds_per_position: float) -> None:
        """One draft forward over ``batch`` sequences took ``seconds_per_position``."""
        self.draft[batch] = self._observe(self._draft, batch, seconds_per_position)

    def _observe(
        self, samples: dict[Any, deque[tuple[int, float]]], key: Any, seconds: float
    ) -> float:
        """Add a timing to ``samples[key]``; the fastest of the recent ones there."""
        recent = samples.setdefault(key, deque(maxlen=TIMINGS_KEPT))
        recent.append((self.steps, seconds))
        return min(seconds for _, seconds in recent)

    def target_time(self, batch: int, width: int) -> float:
        """Expected time of the target's side of a step over ``width`` slots of ``batch``
        sequences (NaN: nothing measured)."""
        own = self.target.get(batch, {})
        if width in own or len(own) >= 2:
            return _interpolate(own, width)
        curves = [b for b, widths in self.target.items() if len(widths) >= 2]
        if not curves:
            return _interpolate(own, width) if own else math.nan
        nearest = self.target[min(curves, key=lambda b: (abs(b - batch), -b))]
        if not own:
            return _interpolate(nearest, width)
        ((measured, seconds),) = own.items()
        scale = seconds / max(_interpolate(nearest, measured), 1e-12)
        return scale * _interpolate(nearest, width)

    def draft_time(self, batch: int) -> float:
        """Expected time of one draft forward over ``batch`` sequences (0: none measured)."""
        return _interpolate(self.draft, batch) if self.draft else 0.0


def _interpolate(table: dict[int, float], x: int) -> float:
    """``table`` at ``x``: measured, or on the line through the nearest measured points.

    Examples
    --------
    >>> _interpolate({1: 1.0, 3: 2.0}, 2), _interpolate({1: 1.0, 3: 2.0}, 5)
    (1.5, 3.0)
    """
    if x in table:
        return table[x]
    xs = sorted(table)
    if len(xs) < 2:
        return table[xs[0]] if xs else math.nan
    lo = max([w for w in xs if w < x], default=xs[0])
    hi = min([w for w in xs if w > x], default=xs[-1])
    if lo == hi:
        lo, hi = (xs[-2], xs[-1]) if hi == xs[-1] else (xs[0], xs[1])
    slope = (table[hi] - table[lo]) / (hi - lo)
    return max(table[lo] + slope * (x - lo), 0.0)
