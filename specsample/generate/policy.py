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
  shared by the runs of a process with the same models and drafter, greedy or sampled);
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

import itertools
import math
import weakref
from collections import Counter, deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

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


class History:
    """How drafts have fared over every sequence: decayed counts of first drafts accepted
    (each past observation weighs :data:`HISTORY_DECAY` times the next one), and when to
    explore a longer draft next.

    Its :attr:`rate` is the prior of a sequence's first position; the runs of a process
    with the same models and drafter share one (:func:`remembered_history`), so a run
    starts from what the drafts of earlier runs showed rather than from
    :data:`PRIOR_ACCEPTANCE` (which the counts never forget: it weighs
    :data:`PRIOR_WEIGHT` observations, so a few good drafts can lift a low rate again).
    The exploration schedule of :class:`DraftLengthPolicy` lives here too
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


T = TypeVar("T")

_REMEMBERED: weakref.WeakKeyDictionary[Any, dict[Hashable, CostModel]] = weakref.WeakKeyDictionary()
_HISTORIES: weakref.WeakKeyDictionary[Any, dict[Hashable, History]] = weakref.WeakKeyDictionary()


def _remembered(
    table: weakref.WeakKeyDictionary[Any, dict[Hashable, T]],
    target: Any,
    key: Hashable,
    new: Callable[[], T],
) -> T:
    """``table[target][key]``, made by ``new()`` the first time (and every time where
    ``target`` cannot be held weakly)."""
    try:
        entries = table.setdefault(target, {})
    except TypeError:
        return new()
    if key not in entries:
        entries[key] = new()
    return entries[key]


def remembered_costs(target: Any, key: Hashable) -> CostModel:
    """The :class:`CostModel` that runs with the same ``target`` model and ``key`` share.

    Step times depend on the models, the drafter, the machine and its threads, not on the
    prompts, so a run starts from what earlier runs in this process measured (and keeps
    refining it) instead of trying every draft length again.

    Parameters
    ----------
    target : object
        The target model (held weakly: its timings go with it).
    key : hashable
        What else the timings depend on (the drafter, the thread count).

    Examples
    --------
    >>> class Model: ...
    >>> model = Model()
    >>> remembered_costs(model, "ngram") is remembered_costs(model, "ngram")
    True
    >>> remembered_costs(model, "ngram") is remembered_costs(model, "draft")
    False
    """
    return _remembered(_REMEMBERED, target, key, CostModel)


def remembered_history(target: Any, key: Hashable) -> History:
    """The :class:`History` that runs with the same ``target`` model and ``key`` share.

    How often first drafts pass depends on the models, the drafter and how the target's
    tokens are drawn (greedy drafts from prompt lookup pass far more often than sampled
    ones), so ``key`` names those; a run then starts from what earlier runs showed, and
    sequences whose drafts seldom pass do not each pay a few drafting steps to show it
    again.

    Parameters
    ----------
    target : object
        The target model (held weakly).
    key : hashable
        What else acceptance depends on (the drafter, greedy or sampled).

    Examples
    --------
    >>> class Model: ...
    >>> model = Model()
    >>> remembered_history(model, ("ngram", True)) is remembered_history(model, ("ngram", True))
    True
    >>> remembered_history(model, ("ngram", True)) is remembered_history(model, ("ngram", False))
    False
    """
    return _remembered(_HISTORIES, target, key, History)


def forget_remembered() -> None:
    """Drop every timing :func:`remembered_costs` holds, and every :func:`remembered_history`:
    the next runs measure and learn afresh.

    Examples
    --------
    >>> class Model: ...
    >>> model = Model()
    >>> before = remembered_costs(model, "ngram")
    >>> forget_remembered()
    >>> remembered_costs(model, "ngram") is before
    False
    """
    _REMEMBERED.clear()
    _HISTORIES.clear()


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


class DraftLengthPolicy:
    """Choose each step's draft length ``m`` in ``0..k_max`` (see the module docstring).

    A step tries a length that the cost model has not timed :data:`TIMINGS_TO_TRUST` times
    at about its batch size yet (within a factor of two), ``k_max`` first, then a plain
    step, then the lengths between, longest first: forward times do not grow along a line
    with the slots scored (matrix products are cheaper per row for some row counts than for
    others), so each width is measured rather than guessed. One :class:`CostModel` serves
    the whole run, whatever the batch size, and may come from earlier runs
    (:func:`remembered_costs`).

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
