"""Counters and metrics of verification.

:class:`VerificationStats` accumulates, on the device of the verifier and without any host
synchronisation, what each step drafted, accepted (in order: a draft accepted after a
rejection is never emitted and never counted) and emitted, and how often each draft
position was accepted. Reading a metric (``acceptance_rate`` and friends) copies the
counters to the host; do it between steps, not inside them.

:func:`expected_acceptance` gives the acceptance probability that theory predicts for a
draft position, ``sum_x min(q(x), p(x))``, to compare with what was realised.
"""

from __future__ import annotations

import torch

MAX_LENGTHS = 256
"""Accepted lengths the histogram holds: ``0..255``, as a step has at most 255 drafts."""

FOLD_EVERY = 32
"""Queued steps of :meth:`VerificationStats.update` folded into the counters at once."""


def expected_acceptance(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Acceptance probability of each draft position, ``sum_x min(q(x), p(x))``.

    This reads both tensors in full (one ``[batch, k, vocab]`` pass): call it for monitoring,
    not on every step of a latency-bound loop.

    Parameters
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[..., vocab]`` target ``q`` and draft ``p`` probabilities.

    Returns
    -------
    torch.Tensor
        ``[...]`` float32, each in ``[0, 1]`` for normalised rows.

    Examples
    --------
    >>> import torch
    >>> expected_acceptance(torch.tensor([0.2, 0.8]), torch.tensor([0.6, 0.4]))
    tensor(0.6000)
    """
    return torch.minimum(target_probs, draft_probs).sum(dim=-1, dtype=torch.float32)


class VerificationStats:
    """Running totals of verification steps, kept as device tensors.

    The state is one histogram of accepted lengths, the drafts offered and the largest draft
    count; every other count is derived from them. Eagerly, :meth:`update` only queues the
    step's accepted counts, and they are folded into the counters with one scatter-add for
    up to :data:`FOLD_EVERY` steps, or when a metric is read: a step pays no tensor
    operation for its statistics. Under :func:`torch.compile`, :meth:`update` adds to the
    counters in the graph, and nothing in it depends on a host value, so a compiled sampler
    traces it once, whatever the batch size, the draft count or the steps already recorded.

    Attributes
    ----------
    length_histogram : torch.Tensor
        ``[k + 1]`` int64: how many sequence-steps accepted exactly ``n`` drafts, ``n = 0..k``,
        for the largest ``k`` seen (reading it copies that ``k`` to the host).
    expected_accepted : torch.Tensor
        0-d float64: sum of ``sum_x min(q, p)`` over positions recorded by
        :meth:`record_expected`.
    expected_positions : int
        Draft positions recorded by :meth:`record_expected`.

    Examples
    --------
    >>> import torch
    >>> stats = VerificationStats()
    >>> stats.update(torch.tensor([2, 0]), k=3)
    >>> stats.acceptance_rate, stats.mean_tokens_per_step, stats.accepted_per_position.tolist()
    (0.3333333333333333, 2.0, [1, 1, 0])
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._zero(torch.device(device))

    def _zero(self, device: torch.device) -> None:
        self.expected_positions = 0
        self._queued: list[tuple[torch.Tensor, int]] = []
        self._histogram = torch.zeros(MAX_LENGTHS, dtype=torch.int64, device=device)
        self._drafted = torch.zeros((), dtype=torch.int64, device=device)
        self._max_k = torch.zeros((), dtype=torch.int64, device=device)
        self.expected_accepted = torch.zeros((), dtype=torch.float64, device=device)

    def reset(self) -> None:
        """Zero every counter, keeping the device."""
        self._zero(self._histogram.device)

    def to(self, device: torch.device | str) -> VerificationStats:
        """Move the counters to ``device`` (a host-to-device copy, no synchronisation)."""
        self._fold()
        self._histogram = self._histogram.to(device)
        self._drafted = self._drafted.to(device)
        self._max_k = self._max_k.to(device)
        self.expected_accepted = self.expected_accepted.to(device)
        return self

    def update(self, num_accepted: torch.Tensor, k: int) -> None:
        """Record one step from ``num_accepted [batch]`` (int64 in ``[0, k]``, ``k < 256``)."""
        if num_accepted.device != self._histogram.device:
            self.to(num_accepted.device)
        if torch.compiler.is_compiling():
            self._add(num_accepted, num_accepted.shape[0] * k, k)
            return
        self._queued.append((num_accepted, k))
        if len(self._queued) >= FOLD_EVERY:
            self._fold()

    def _add(self, lengths: torch.Tensor, drafted: int, max_k: int) -> None:
        """Count ``[n]`` accepted lengths, ``drafted`` drafts and a draft count of ``max_k``."""
        self._histogram.scatter_add_(0, lengths, torch.ones_like(lengths))
        self._drafted.add_(drafted)
        self._max_k.clamp_(min=max_k)

    def _fold(self) -> None:
        """Add the queued steps to the counters."""
        queued = self._queued
        if not queued:
            return
        lengths = torch.cat([n for n, _ in queued]) if len(queued) > 1 else queued[0][0]
        self._add(lengths, sum(n.shape[0] * k for n, k in queued), max(k for _, k in queued))
        queued.clear()

    @property
    def steps(self) -> int:
        """Sequences verified (one per row per step)."""
        self._fold()
        return int(self._histogram.sum())

    @property
    def drafted(self) -> int:
        """Draft tokens offered."""
        self._fold()
        return int(self._drafted)

    @property
    def length_histogram(self) -> torch.Tensor:
        """``[k + 1]`` int64 counts of accepted lengths, ``k`` the largest seen."""
        self._fold()
        return self._histogram[: int(self._max_k) + 1]

    @property
    def accepted(self) -> torch.Tensor:
        """0-d int64 tensor: drafts accepted in order."""
        self._fold()
        lengths = torch.arange(MAX_LENGTHS, device=self._histogram.device)
        return (self._histogram * lengths).sum()

    @property
    def emitted(self) -> torch.Tensor:
        """0-d int64 tensor: tokens emitted (accepted drafts plus one per sequence-step)."""
        return self.accepted + self._histogram.sum()

    @property
    def accepted_per_position(self) -> torch.Tensor:
        """``[k]`` int64 tensor: how often draft position ``i`` was accepted."""
        tail = self.length_histogram.flip(0).cumsum(0).flip(0)
        return tail[1:]

    def record_expected(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> None:
        """Add the theoretical acceptance of every position of ``[batch, k, vocab]`` rows."""
        expected = expected_acceptance(target_probs, draft_probs)
        self.expected_accepted = self.expected_accepted.to(expected.device) + expected.sum(
            dtype=torch.float64
        )
        self.expected_positions += expected.numel()

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafted tokens (``nan`` before any draft)."""
        return float(self.accepted) / self.drafted if self.drafted else float("nan")

    @property
    def mean_tokens_per_step(self) -> float:
        """Emitted tokens per sequence and verification step (``nan`` before any step)."""
        return float(self.emitted) / self.steps if self.steps else float("nan")

    @property
    def position_acceptance_rate(self) -> list[float]:
        """Per draft position, the fraction of sequence-steps in which it was accepted."""
        if not self.steps:
            return []
        return [float(c) / self.steps for c in self.accepted_per_position.tolist()]

    @property
    def expected_acceptance_rate(self) -> float:
        """Mean of ``sum_x min(q, p)`` over the recorded positions (``nan`` if none)."""
        if not self.expected_positions:
            return float("nan")
        return float(self.expected_accepted) / self.expected_positions

    def summary(self) -> dict[str, float | int | list[float] | list[int]]:
        """All metrics as plain Python values."""
        return {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": int(self.accepted),
            "emitted": int(self.emitted),
            "acceptance_rate": self.acceptance_rate,
            "mean_tokens_per_step": self.mean_tokens_per_step,
            "position_acceptance_rate": self.position_acceptance_rate,
            "expected_acceptance_rate": self.expected_acceptance_rate,
            "accepted_length_histogram": [int(c) for c in self.length_histogram.tolist()],
        }
