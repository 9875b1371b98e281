"""What the draft-length policy knows of acceptance: per-sequence estimates and the history
of first drafts over every sequence, with the exploration schedule.

:class:`AcceptanceTracker` estimates, per sequence and draft position ``j``,
``a_j = P(draft j accepted | drafts before it accepted)`` from decayed counts, drawn towards
the acceptance of first drafts over every sequence (:class:`History`, which runs with the
same models and drafter may share through a
:class:`~specsample.generate.policy.memory.PolicyMemory`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

PRIOR_ACCEPTANCE = 0.7
"""Acceptance assumed at the first position before anything was observed there (a later
position is assumed like the one before it, see :class:`AcceptanceTracker`)."""

DECAY = 0.9
"""Weight of the past in the acceptance counts (per observation)."""

PRIOR_WEIGHT = 4.0
"""How many observations a prior counts for in an acceptance estimate (a sequence's, and
that of :class:`History`): a sequence's first rejections are partly luck, and a policy that believed
them at once would stop drafting for a sequence whose drafts are accepted as often as any
other's."""

HISTORY_DECAY = 0.95
"""Weight of the past in the counts of :class:`History` (per observation)."""

EXPLORE_EVERY = 16
"""After this many steps in a row shorter than ``k_max``, one step drafts one token more than
the best length: the acceptance of the next position is measured afresh (a sequence whose
first drafts failed would otherwise keep the policy from ever drafting again; a position
never reached is taken for the one before it, so a good one lifts every longer length too,
while a step one longer costs far less than one of ``k_max`` when drafts do not pay). Each
exploration that the policy does not follow up doubles the interval (up to
:data:`EXPLORE_AT_MOST`), so that drafts that never pay cost ever less; choosing ``k_max``
on its own resets it."""

EXPLORE_AT_MOST = 256
"""The longest interval between two explorations."""


class History:
    """How drafts have fared over every sequence: decayed counts of first drafts accepted
    (each past observation weighs :data:`HISTORY_DECAY` times the next one), and when to
    explore a longer draft next.

    Its :attr:`rate` is the prior of a sequence's first position; runs with the same models
    and drafter may share one (:meth:`PolicyMemory.history
    <specsample.generate.policy.memory.PolicyMemory.history>`), so a run
    starts from what the drafts of earlier runs showed rather than from
    :data:`PRIOR_ACCEPTANCE` (which the counts never forget: it weighs
    :data:`PRIOR_WEIGHT` observations, so a few good drafts can lift a low rate again).
    The exploration schedule of
    :class:`~specsample.generate.policy.chooser.DraftLengthPolicy` lives here too
    (:meth:`explore_now`): where drafts do not pay, the interval between explorations keeps
    growing from one run to the next, instead of every run paying its first few
    explorations again.

    Examples
    --------
    >>> h = History()
    >>> h.rate == PRIOR_ACCEPTANCE
    True
    >>> for _ in range(40): h.observe(False)
    >>> round(h.rate, 3)
    0.131
    """

    def __init__(self) -> None:
        self.hits = self.seen = 0.0
        self.shorter = 0
        """Steps in a row shorter than ``k_max`` since the last exploration."""
        self.explore_after = EXPLORE_EVERY
        """How many such steps the next exploration waits for."""

    @property
    def rate(self) -> float:
        """The acceptance estimate of a first draft."""
        prior = PRIOR_WEIGHT * PRIOR_ACCEPTANCE
        return (self.hits + prior) / (self.seen + PRIOR_WEIGHT)

    def observe(self, accepted: bool) -> None:
        """Count a first draft, ``accepted`` or not."""
        self.hits = HISTORY_DECAY * self.hits + float(accepted)
        self.seen = HISTORY_DECAY * self.seen + 1.0

    def explore_now(self, longest: bool) -> bool:
        """Count a step whose best length is ``longest`` (the longest useful one) or
        shorter; whether this step should explore one token more instead.

        A step of the longest length resets the schedule; after :attr:`explore_after`
        shorter steps in a row one explores, and the next waits twice as long (up to
        :data:`EXPLORE_AT_MOST`).

        Examples
        --------
        >>> h = History()
        >>> [h.explore_now(False) for _ in range(EXPLORE_EVERY + 1)][-2:]
        [False, True]
        >>> h.explore_after == 2 * EXPLORE_EVERY
        True
        """
        if longest:
            self.explore_after, self.shorter = EXPLORE_EVERY, 0
            return False
        if self.shorter >= self.explore_after:
            self.explore_after = min(2 * self.explore_after, EXPLORE_AT_MOST)
            self.shorter = 0
            return True
        self.shorter += 1
        return False


class AcceptanceTracker:
    """Per-sequence, per-position acceptance estimates ``a [batch][k_max]`` (host floats).

    Each sequence keeps, per draft position, decayed counts of the times the position was
    reached and of the times its draft was accepted (each past observation weighs
    :data:`DECAY` times the next one). Its estimate is ``(accepted + w * prior) / (reached +
    w)`` with ``w`` = :data:`PRIOR_WEIGHT`: a handful of observations move it away from the
    prior, many make the prior negligible. The prior of the first position is the estimate
    there over every sequence (:attr:`history`, the rate of a :class:`History`); that of a
    later position is the sequence's own estimate at
    the position before, so a position seldom reached is taken for neither better nor worse
    than the one that guards it (a fixed prior there would keep a policy that stopped
    drafting that deep from ever finding out that it pays). With a costless drafter, each
    sequence also keeps how often it had drafts to propose (:attr:`found`).

    Parameters
    ----------
    batch : int
        Sequences tracked.
    k_max : int
        Draft positions tracked.
    history : History, optional
        The counts of first drafts to read and update (default: new ones).

    Examples
    --------
    >>> t = AcceptanceTracker(1, 2)
    >>> t.update([2], [0])  # offered 2, the first was rejected
    >>> [round(a, 3) for a in t.rates[0]]
    [0.448, 0.448]
    >>> t.add(1); [round(a, 3) for a in t.rates[1]]
    [0.56, 0.56]
    """

    def __init__(self, batch: int, k_max: int, history: History | None = None) -> None:
        self.k_max = k_max
        self.first = History() if history is None else history
        self.accepted = [[0.0] * k_max for _ in range(batch)]
        self.reached = [[0.0] * k_max for _ in range(batch)]
        self.found = [1.0] * batch

    @property
    def history(self) -> float:
        """Acceptance at the first position over every sequence (:attr:`first`'s rate)."""
        return self.first.rate

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
                passed = j < kept
                hits[j] = DECAY * hits[j] + float(passed)
                reached[j] = DECAY * reached[j] + 1.0
                if not j:
                    self.first.observe(passed)

    def observe_drafting(self, drafting: Sequence[bool]) -> None:
        """Record which sequences found drafts to propose this step (a costless drafter's
        :attr:`~specsample.generate.drafters.Proposal.drafting`)."""
        for b, wants in enumerate(drafting):
            self.found[b] = DECAY * self.found[b] + (1.0 - DECAY) * float(wants)

    def expected_tokens(
        self, limits: Sequence[int] | None = None, found: Sequence[float] | None = None
    ) -> list[float]:
        """``[k_max + 1]``: tokens the batch emits in expectation when every sequence drafts
        ``m`` (entry ``m``).

        ``limits[b]`` caps the drafts that can count for sequence ``b`` (default ``k_max``):
        those its remaining budget leaves room for, 0 when its drafter has nothing to
        propose. ``found[b]`` is the chance that it has drafts to propose at all (default 1).
        """
        gains = [0.0] * (self.k_max + 1)
        for b, rates in enumerate(self.rates):
            reach = 1.0 if found is None else found[b]
            gains[0] += 1.0
            for j in range(self.k_max if limits is None else min(limits[b], self.k_max)):
                reach *= rates[j]
                gains[j + 1] += reach
        return list(itertools.accumulate(gains))

    def keep(self, rows: Sequence[int]) -> None:
        """Keep the sequences at ``rows`` (in that order)."""
        self.accepted = [self.accepted[r] for r in rows]
        self.reached = [self.reached[r] for r in rows]
        self.found = [self.found[r] for r in rows]

    def add(self, count: int) -> None:
        """Track ``count`` new sequences, starting from what every sequence showed so far."""
        self.accepted.extend([0.0] * self.k_max for _ in range(count))
        self.reached.extend([0.0] * self.k_max for _ in range(count))
        self.found.extend([1.0] * count)

    def __len__(self) -> int:
        """Sequences tracked."""
        return len(self.accepted)
