"""Adaptive draft length: how many tokens to draft next step, to maximise tokens per second.

A step of the loop drafts ``m`` tokens for every active sequence (the drafter runs ``m``
forwards over the batch), then scores ``m + 1`` slots per sequence in one target forward. In
a padded batch the target's cost depends on ``m``, not on how many of the ``m`` drafts each
sequence keeps, and a draft can only add accepted tokens, so the one decision per step is
``m`` in ``0..k_max`` (``m = 0``: a plain decoding step). :class:`DraftLengthPolicy` picks the
``m`` that maximises the expected tokens of the step over its expected time:

* **acceptance** (:class:`AcceptanceTracker`): per sequence and draft position ``j``, an
  estimate from decayed counts of ``a_j = P(draft j accepted | drafts before it accepted)``;
  a sequence drafting ``m`` tokens then emits ``1 + sum_{i <= m} prod_{j <= i} a_j`` in
  expectation;
* **cost** (:class:`CostModel`): the measured time of the rest of a step (the target forward,
  verification and commit) as a function of the slots it scores (a line through the widths
  seen so far), and of one draft forward. Leaving out what a step costs besides its
  forwards would make drafting look dearer than it is.

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

import itertools
import math
from collections.abc import Sequence

PRIOR_ACCEPTANCE = 0.7
"""Acceptance assumed at the first position before anything was observed there (a later
position is assumed like the one before it, see :class:`AcceptanceTracker`)."""

DECAY = 0.8
"""Weight of the past in the acceptance counts (per observation)."""

PRIOR_WEIGHT = 1.0
"""How many observations the prior of a position counts for in its acceptance estimate."""

HISTORY_DECAY = 0.95
"""Weight of the past in the run-wide average at the first position (per observation)."""

TIME_DECAY = 0.7
"""Weight of the past in the timing averages (per observation)."""

EXPLORE_EVERY = 16
"""After this many steps in a row shorter than ``k_max``, one step drafts ``k_max`` again: its
timing and the acceptance of the later positions are measured afresh (a step measured once,
say while caches were cold, or a sequence whose first drafts failed, would otherwise keep
the policy from ever drafting again). Each exploration that the policy does not follow up
doubles the interval (up to :data:`EXPLORE_AT_MOST`), so that drafts that never pay cost
ever less; choosing ``k_max`` on its own resets it."""

EXPLORE_AT_MOST = 256
"""The longest interval between two explorations."""

MARGIN = 0.05
"""A shorter draft length is chosen over ``k_max`` only if it is expected to be this much faster
(noisy timings and acceptance averages would otherwise make it drift away from ``k_max``)."""


class AcceptanceTracker:
    """Per-sequence, per-position acceptance estimates ``a [batch][k_max]`` (host floats).

    Each sequence keeps, per draft position, decayed counts of the times the position was
    reached and of the times its draft was accepted (each past observation weighs
    :data:`DECAY` times the next one). Its estimate is ``(accepted + w * prior) / (reached +
    w)`` with ``w`` = :data:`PRIOR_WEIGHT`: a few observations move it quickly away from the
    prior, many make the prior negligible. The prior of the first position is the run-wide
    average there (what every sequence showed so far, :data:`PRIOR_ACCEPTANCE` at first);
    that of a later position is the sequence's own estimate at the position before, so a
    position seldom reached is taken for neither better nor worse than the one that guards
    it (a fixed prior there would keep a policy that stopped drafting that deep from ever
    finding out that it pays).

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
    [0.332, 0.332]
    >>> t.add(1); [round(a, 3) for a in t.rates[1]]
    [0.665, 0.665]
    """

    def __init__(self, batch: int, k_max: int) -> None:
        self.k_max = k_max
        self.history = PRIOR_ACCEPTANCE
        self.accepted = [[0.0] * k_max for _ in range(batch)]
        self.reached = [[0.0] * k_max for _ in range(batch)]

    @property
    def rates(self) -> list[list[float]]:
        """``[batch][k_max]`` the estimates, ``a_j = P(draft j accepted | drafts before it
        accepted)``."""
        out = []
        for accepted, reached in zip(self.accepted, self.reached, strict=True):
            rates, prior = [], self.history
            for j in range(self.k_max):
                prior = (accepted[j] + PRIOR_WEIGHT * prior) / (reached[j] + PRIOR_WEIGHT)
                rates.append(prior)
            out.append(rates)
        return out

    def update(self, offered: Sequence[int], accepted: Sequence[int]) -> None:
        """Record a step: sequence ``b`` was offered ``offered[b]`` drafts, kept ``accepted[b]``.

        Positions up to the first rejected one are observed; later ones are not.
        """
        rows = zip(self.accepted, self.reached, offered, accepted, strict=True)
        for hits, reached, n, kept in rows:
            for j in range(min(n, kept + 1)):
                seen = 1.0 if j < kept else 0.0
                hits[j] = DECAY * hits[j] + seen
                reached[j] = DECAY * reached[j] + 1.0
                if not j:
                    self.history = HISTORY_DECAY * self.history + (1.0 - HISTORY_DECAY) * seen

    def expected_tokens(self) -> list[float]:
        """``[k_max + 1]``: tokens the batch emits in expectation when every sequence drafts
        ``m`` (entry ``m``)."""
        gains = [0.0] * (self.k_max + 1)
        for rates in self.rates:
            reach = 1.0
            gains[0] += 1.0
            for j in range(self.k_max):
                reach *= rates[j]
                gains[j + 1] += reach
        return list(itertools.accumulate(gains))

    def keep(self, rows: Sequence[int]) -> None:
        """Keep the sequences at ``rows`` (in that order)."""
        self.accepted = [self.accepted[r] for r in rows]
        self.reached = [self.reached[r] for r in rows]

    def add(self, count: int) -> None:
        """Track ``count`` new sequences, starting from what every sequence showed so far."""
        self.accepted.extend([0.0] * self.k_max for _ in range(count))
        self.reached.extend([0.0] * self.k_max for _ in range(count))

    def __len__(self) -> int:
        """Sequences tracked."""
        return len(self.accepted)


class CostModel:
    """Measured step times: the target's side by scored width, draft forward per position.

    The target's side of a step is its forward, its verification and its commit: all that a
    step costs besides drafting.

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
        """The target's side of a step over ``width`` slots per sequence took ``seconds``."""
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
        self.explore_after = EXPLORE_EVERY

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
        steps in a row (then after twice as many, and so on, while drafting does not pay).

        Examples
        --------
        >>> policy = DraftLengthPolicy(k_max=2, batch=1)
        >>> policy.record(2, [0], 0.05, 0.01); policy.record(0, [0], 0.01, 0.0)
        >>> [policy.choose() for _ in range(EXPLORE_EVERY + 1)][-2:]
        [0, 2]
        """
        if self.k_max == 0:
            return 0
        batch = len(self.acceptance)
        cost = self._cost(batch)
        if cost is None:
            own = self.costs.get(batch)
            explored = own is not None and self.k_max + 1 in own.target and own.draft is not None
            return 0 if explored else self.k_max
        draft = cost.draft or 0.0
        tokens = self.acceptance.expected_tokens()
        rates = [
            tokens[m] / max(cost.target_time(m + 1) + m * draft, 1e-12)
            for m in range(self.k_max + 1)
        ]
        best = max(range(self.k_max + 1), key=rates.__getitem__)
        if rates[best] <= (1.0 + MARGIN) * rates[self.k_max]:
            best, self.explore_after = self.k_max, EXPLORE_EVERY
        elif self.shorter >= self.explore_after:
            best = self.k_max
            self.explore_after = min(2 * self.explore_after, EXPLORE_AT_MOST)
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
