"""Adaptive draft length: how many tokens to draft next step, to maximise tokens per second.

A step of the loop drafts ``m`` tokens for every active sequence (the drafter runs ``m``
forwards over the batch), then scores ``m + 1`` slots per sequence in one target forward. In
a padded batch the target's cost depends on ``m``, not on how many of the ``m`` drafts each
sequence keeps, and a draft can only add accepted tokens, so the one decision per step is
``m`` in ``0..k_max`` (``m = 0``: a plain decoding step). :class:`DraftLengthPolicy` picks the
``m`` that maximises the expected tokens of the step over its expected time:

* **acceptance** (:class:`AcceptanceTracker`): per sequence and draft position ``j``, an
  estimate from decayed counts of ``a_j = P(draft j accepted | drafts before it accepted)``,
  drawn towards the acceptance of first drafts over every sequence (:class:`History`,
  which the runs given the same :class:`PolicyMemory` share, apart for greedy and sampled
  runs);
  a sequence drafting ``m`` tokens then emits ``1 + sum_{i <= m} prod_{j <= i} a_j`` in
  expectation, no more than its remaining budget allows, and just one when its drafter
  found nothing to propose this step (a prompt-lookup drafter tells before the length is
  chosen);
* **cost** (:class:`CostModel`): the measured time of the rest of a step (the target forward,
  verification and commit) by batch size and slots scored (every width is tried twice at
  about each batch size; widths not measured are read off the line through the measured
  ones), and of one draft forward by batch size. Leaving out what a step costs besides its
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

from collections.abc import Sequence

from specsample.generate.policy.acceptance import AcceptanceTracker, History
from specsample.generate.policy.costs import CostModel

MARGIN = 0.1
"""A draft length between 0 and ``k_max`` is chosen over ``k_max`` only if it is expected to be
this much faster (noisy timings and acceptance averages would otherwise make it drift away
from ``k_max``); a plain step is chosen whenever it is expected to be faster at all."""

DRAFT_MARGIN = 0.03
"""A step that drafts is chosen over a plain step only if it is expected to be this much
faster: drafts that barely pay for themselves cost more than they seem to. Both estimates
are fastest-case timings, and a step that drafts varies more; its widths are timed less
often than the plain step where drafts seldom pay, so their fastest timings may come from
a spell when the whole machine ran faster; and the acceptance of a sequence with few
drafts observed leans on its prior."""


class DraftLengthPolicy:
    """Choose each step's draft length ``m`` in ``0..k_max`` (see the module docstring).

    A step tries a length that the cost model has not timed :data:`TIMINGS_TO_TRUST` times
    at about its batch size yet (within a factor of two), ``k_max`` first, then a plain
    step, then the lengths between, longest first: forward times do not grow along a line
    with the slots scored (matrix products are cheaper per row for some row counts than for
    others), so each width is measured rather than guessed. One :class:`CostModel` serves
    the whole run, whatever the batch size, and may come from earlier runs
    (:meth:`PolicyMemory.cost_model`).

    Parameters
    ----------
    k_max : int
        The largest draft length.
    batch : int
        Sequences at the start (more join with :meth:`AcceptanceTracker.add`).
    cost : CostModel, optional
        The timings to start from (default: none).
    history : History, optional
        The acceptance of first drafts and the exploration schedule to start from and
        keep up to date (default: none seen).
    """

    def __init__(
        self,
        k_max: int,
        batch: int,
        cost: CostModel | None = None,
        history: History | None = None,
    ) -> None:
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        self.k_max = k_max
        self.acceptance = AcceptanceTracker(batch, k_max, history)
        self.cost = CostModel() if cost is None else cost
        self.order = [k_max, 0, *range(k_max - 1, 0, -1)] if k_max else []
        self.exploring: int | None = None

    def choose(
        self, room: Sequence[int] | None = None, drafting: Sequence[bool] | None = None
    ) -> int:
        """The draft length of the next step.

        A step tries a length not timed often enough yet at this scale (see the class
        docstring); otherwise the best ratio of expected tokens to expected time: a plain
        step unless a length beats it by :data:`DRAFT_MARGIN`, else ``k_max`` unless another
        length is :data:`MARGIN` better (or ``k_max`` is not :data:`DRAFT_MARGIN` better than
        a plain step); and one token more than that after :data:`EXPLORE_EVERY` shorter
        steps in a row (then after twice as many, and so on, while drafting does not pay;
        counted over the runs that share the policy's :class:`History`).

        Parameters
        ----------
        room : sequence of int, optional
            ``[batch]`` tokens each sequence may still emit (its budget left; default: no
            limit). Drafts beyond ``room - 1`` cannot be kept, so the length chosen never
            exceeds what the roomiest sequence can use, and ``k_max`` stands for that.
        drafting : sequence of bool, optional
            ``[batch]`` which sequences have drafts to offer this step; the others emit
            one token whatever the length. By default each is taken to have drafts as
            often as it had so far (:attr:`AcceptanceTracker.found`; always, for a
            drafter that never says).

        Examples
        --------
        >>> from specsample.generate.policy.acceptance import EXPLORE_EVERY
        >>> policy = DraftLengthPolicy(k_max=2, batch=1)
        >>> [policy.choose() for _ in range(2)]  # nothing recorded: the widest step
        [2, 2]
        >>> for m in (2, 2): policy.record(m, [0], 0.05, 0.01)
        >>> policy.choose()
        0
        >>> for m in (0, 0, 1, 1): policy.record(m, [0], 0.01 + 0.02 * m, 0.01 * m)
        >>> [policy.choose() for _ in range(EXPLORE_EVERY + 1)][-2:]
        [0, 1]
        """
        limits = self._limits(room, drafting)
        top = max(limits, default=0)
        self.exploring = None
        if not top:
            return 0
        untimed = self._untimed()
        if untimed is not None:
            self.exploring = min(untimed, top)
            return self.exploring
        best = self._best(limits, None if drafting is not None else self.acceptance.found)
        if self.acceptance.first.explore_now(best == top):
            best = self.exploring = best + 1
        return best

    def refine(self, room: Sequence[int] | None, drafting: Sequence[bool]) -> int:
        """The length of a step whose drafts were proposed after :meth:`choose`, now that
        ``drafting`` tells which sequences found some (a costless drafter's): the best one
        for them, or the length :meth:`choose` explores (no longer than they can use)."""
        self.acceptance.observe_drafting(drafting)
        limits = self._limits(room, drafting)
        if self.exploring is not None:
            return min(self.exploring, max(limits, default=0))
        return self._best(limits)

    def _untimed(self) -> int | None:
        """The first length of :attr:`order` not timed often enough at about this batch
        size, or ``k_max`` when it was not timed lately (:data:`FRESH_FOR`), if any."""
        batch = len(self.acceptance)
        tried = self.cost.tried
        untimed = next((m for m in self.order if (m, batch.bit_length()) not in tried), None)
        if untimed is None and not self.cost.fresh(batch, self.k_max + 1):
            return self.k_max
        return untimed

    def _limits(self, room: Sequence[int] | None, drafting: Sequence[bool] | None) -> list[int]:
        """``[batch]`` the drafts each sequence can use (see :meth:`choose`)."""
        batch = len(self.acceptance)
        limits = [self.k_max] * batch if room is None else [max(r - 1, 0) for r in room]
        if drafting is not None:
            limits = [n if wants else 0 for n, wants in zip(limits, drafting, strict=True)]
        return [min(n, self.k_max) for n in limits]

    def _best(self, limits: Sequence[int], found: Sequence[float] | None = None) -> int:
        """The length with the best expected rate (see :meth:`choose`), the longest useful one
        being ``max(limits)``; no side effect. ``found``: see
        :meth:`AcceptanceTracker.expected_tokens`."""
        top = max(limits, default=0)
        if not top:
            return 0
        batch = len(self.acceptance)
        draft = self.cost.draft_time(batch)
        tokens = self.acceptance.expected_tokens(limits, found)
        rates = [
            tokens[m] / max(self.cost.target_time(batch, m + 1) + m * draft, 1e-12)
            for m in range(top + 1)
        ]
        best = max(range(top + 1), key=rates.__getitem__)
        plain = (1.0 + DRAFT_MARGIN) * rates[0]
        if rates[best] <= plain:
            return 0
        return top if rates[best] <= (1.0 + MARGIN) * rates[top] and rates[top] > plain else best

    def record(
        self,
        m: int,
        accepted: Sequence[int],
        target_seconds: float,
        draft_seconds: float,
        offered: Sequence[int] | None = None,
    ) -> None:
        """Record a step of draft length ``m``: per-sequence accepted counts and timings.

        ``offered[b]`` is how many of the ``m`` drafts sequence ``b`` really offered (default
        ``m``; 0 for a sequence whose drafter found nothing, whose acceptance is then not
        observed).
        """
        batch = len(accepted)
        self.cost.observe_target(batch, m + 1, target_seconds)
        if m:
            self.cost.observe_draft(batch, draft_seconds / m)
            self.acceptance.update([m] * batch if offered is None else offered, accepted)
