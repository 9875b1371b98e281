"""Adaptive draft length: how many tokens to draft next step, to maximise tokens per second.

A step of the loop drafts ``m`` tokens for every active sequence (the drafter runs ``m``
forwards over the batch), then scores ``m + 1`` slots per sequence in one target forward. In
a padded batch the target's cost depends on ``m``, not on how many of the ``m`` drafts each
sequence keeps, and a draft can only add accepted tokens, so the one decision per step is
``m`` in ``0..k_max`` (``m = 0``: a plain decoding step). :class:`DraftLengthPolicy` picks the
``m`` that maximises the expected tokens of the step over its expected time:

* **acceptance** (:class:`AcceptanceTracker`): per sequence and draft position ``j``, an
  exponential moving average of ``a_j = P(draft j accepted | drafts before it accepted)``;
  a sequence drafting ``m`` tokens then emits ``1 + sum_{i <= m} prod_{j <= i} a_j`` in
  expectation;
* **cost** (:class:`CostModel`): the measured time of a target forward as a function of the
  slots it scores (a line through the widths seen so far), and of one draft forward.

The policy reads only what is known before the target scores the step (past acceptance, past
timings), never the step's own random numbers, so verification stays exact whatever it
chooses.

Examples
--------
>>> policy = DraftLengthPolicy(k_max=4, batch=2)
>>> policy.choose()  # nothing measured yet: explore the widest step first
4
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PRIOR_ACCEPTANCE = 0.7
"""Acceptance assumed at a position before anything was observed there."""

DECAY = 0.8
"""Weight of the past in the acceptance averages (per observation)."""

HISTORY_DECAY = 0.95
"""Weight of the past in the run-wide averages new sequences start from."""

TIME_DECAY = 0.7
"""Weight of the past in the timing averages (per observation)."""

EXPLORE_EVERY = 16
"""After this many steps in a row shorter than ``k_max``, one step drafts ``k_max`` again: its
timing and the acceptance of the later positions are measured afresh (a step measured once,
say while caches were cold, or a sequence whose first drafts failed, would otherwise keep
the policy from ever drafting again)."""

MARGIN = 0.05
"""A shorter draft length is chosen over ``k_max`` only if it is expected to be this much faster
(noisy timings and acceptance averages would otherwise make it drift away from ``k_max``)."""


class AcceptanceTracker:
    """Per-sequence, per-position acceptance averages ``a [batch][k_max]`` (host floats).

    Parameters
    ----------
    batch : int
        Sequences tracked.
    k_max : int
        Draft positions tracked.

    Examples
    --------
    >>> t = AcceptanceTracker(1, 2)
    >>> t.update([2], [0])  # offered 2, the first was rejected
    >>> [round(a, 3) for a in t.rates[0]]
    [0.56, 0.7]
    >>> t.add(1); [round(a, 3) for a in t.rates[1]]
    [0.665, 0.7]
    """

    def __init__(self, batch: int, k_max: int) -> None:
        self.k_max = k_max
        self.history = [PRIOR_ACCEPTANCE] * k_max
        self.rates = [list(self.history) for _ in range(batch)]

    def update(self, offered: Sequence[int], accepted: Sequence[int]) -> None:
        """Record a step: sequence ``b`` was offered ``offered[b]`` drafts, kept ``accepted[b]``.

        Positions up to the first rejected one are observed; later ones are not.
        """
        for rates, n, kept in zip(self.rates, offered, accepted, strict=True):
            for j in range(min(n, kept + 1)):
                seen = 1.0 if j < kept else 0.0
                rates[j] = DECAY * rates[j] + (1.0 - DECAY) * seen
                self.history[j] = HISTORY_DECAY * self.history[j] + (1.0 - HISTORY_DECAY) * seen

    def expected_tokens(self, m: int) -> float:
        """Tokens the batch emits in expectation when every sequence drafts ``m``."""
        total = 0.0
        for rates in self.rates:
            reach = 1.0
            total += 1.0
            for j in range(m):
                reach *= rates[j]
                total += reach
        return total

    def keep(self, rows: Sequence[int]) -> None:
        """Keep the sequences at ``rows`` (in that order)."""
        self.rates = [self.rates[r] for r in rows]

    def add(self, count: int) -> None:
        """Track ``count`` new sequences, starting from what every sequence showed so far."""
        self.rates.extend(list(self.history) for _ in range(count))



class CostModel:
    """Measured step times: target forward by scored width, draft forward per position.

    Examples
    --------
    >>> c = CostModel()
    >>> c.observe_target(1, 0.010); c.observe_target(5, 0.018)
    >>> round(c.target_time(3), 4)
    0.014
    """

    def __init__(self) -> None:
        self.target: dict[int, float] = {}
        self.draft: float | None = None

    def observe_target(self, width: int, seconds: float) -> None:
        """A target forward over ``width`` slots per sequence took ``seconds``."""
        seen = self.target.get(width)
        self.target[width] = (
            seconds if seen is None else TIME_DECAY * seen + (1 - TIME_DECAY) * seconds
        )

    def observe_draft(self, seconds_per_position: float) -> None:
        """One draft forward over the batch took ``seconds_per_position``."""
        seen = self.draft
        value = seconds_per_position
        self.draft = value if seen is None else TIME_DECAY * seen + (1 - TIME_DECAY) * value

    def target_time(self, width: int) -> float:
        """Expected target time at ``width``: measured, or on the line through the widths seen."""
        if width in self.target:
            return self.target[width]
        widths = sorted(self.target)
        if len(widths) < 2:
            return self.target[widths[0]] if widths else math.nan
        lo = max([w for w in widths if w < width], default=widths[0])
        hi = min([w for w in widths if w > width], default=widths[-1])
        if lo == hi:
            lo, hi = widths[-2], widths[-1]
        slope = (self.target[hi] - self.target[lo]) / (hi - lo)
        return max(self.target[lo] + slope * (width - lo), 0.0)


class DraftLengthPolicy:
    """Choose each step's draft length ``m`` in ``0..k_max`` (see the module docstring).

    Step times depend on how many sequences share the step, so timings are kept per batch
    size; a batch size not anchored yet (both ends measured) borrows the timings of the
    nearest one that is, so a batch that shrinks or grows does not explore again.

    Parameters
    ----------
    k_max : int
        The largest draft length.
    batch : int
        Sequences at the start (more join with :meth:`AcceptanceTracker.add`).
    """

    def __init__(self, k_max: int, batch: int) -> None:
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        self.k_max = k_max
        self.acceptance = AcceptanceTracker(batch, k_max)
        self.costs: dict[int, CostModel] = {}
        self.shorter = 0

    def _anchored(self, cost: CostModel) -> bool:
        return {1, self.k_max + 1} <= cost.target.keys() and cost.draft is not None

    def _cost(self, batch: int) -> CostModel | None:
        """The timings to choose by at ``batch``: its own, or the nearest anchored ones."""
        anchored = [size for size, cost in self.costs.items() if self._anchored(cost)]
        if not anchored:
            return None
        return self.costs[min(anchored, key=lambda size: (abs(size - batch), -size))]

    def choose(self) -> int:
        """The draft length of the next step.

        Until some batch size has timings at both ends, the first steps explore them
        (``k_max``, then 0, a plain step that is progress too); after that, the best ratio
        of expected tokens to expected time (``k_max`` unless another length is
        :data:`MARGIN` better), and ``k_max`` again after :data:`EXPLORE_EVERY` shorter
        steps in a row.

        Examples
        --------
        >>> policy = DraftLengthPolicy(k_max=2, batch=1)
        >>> policy.record(2, [0], 0.05, 0.01); policy.record(0, [0], 0.01, 0.0)
        >>> [policy.choose() for _ in range(EXPLORE_EVERY + 1)][-2:]
        [0, 2]
        """
        if self.k_max == 0:
            return 0
        batch = len(self.acceptance.rates)
        cost = self._cost(batch)
        if cost is None:
            own = self.costs.get(batch)
            explored = own is not None and self.k_max + 1 in own.target and own.draft is not None
            return 0 if explored else self.k_max
        draft = cost.draft or 0.0
        rates = [
            self.acceptance.expected_tokens(m) / max(cost.target_time(m + 1) + m * draft, 1e-12)
            for m in range(self.k_max + 1)
        ]
        best = max(range(self.k_max + 1), key=rates.__getitem__)
        if rates[best] <= (1.0 + MARGIN) * rates[self.k_max] or self.shorter >= EXPLORE_EVERY:
            best = self.k_max
        self.shorter = 0 if best == self.k_max else self.shorter + 1
        return best

    def record(
        self,
        m: int,
        accepted: Sequence[int],
        target_seconds: float,
        draft_seconds: float,
    ) -> None:
        """Record a step of draft length ``m``: per-sequence accepted counts and timings."""
        cost = self.costs.setdefault(len(accepted), CostModel())
        cost.observe_target(m + 1, target_seconds)
        if m:
            cost.observe_draft(draft_seconds / m)
            self.acceptance.update([m] * len(accepted), accepted)
