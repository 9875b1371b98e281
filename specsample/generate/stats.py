"""What a generation run reports: throughput, acceptance, and target forwards saved.

Counting conventions. A *step* is one batched target forward; a *sequence forward* is one
sequence's share of it. Target-only decoding needs one sequence forward per generated token,
so speculative decoding saves ``tokens - sequence_forwards`` of them. Acceptance counts what
the verifier accepted, before truncation at EOS or at ``max_new_tokens``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class GenerationStats:
    """Counters of one generation run.

    Attributes
    ----------
    mode : str
        ``"speculative"`` or ``"target-only"``.
    drafter : str or None
        Description of the drafter (``None`` for target-only).
    method : str or None
        Verification rule (``"chain"`` or ``"block"``; ``None`` for target-only).
    k : int
        Drafts per step (0 for target-only).
    sequences : int
        Sequences generated.
    tokens : int
        Tokens generated over all sequences (prompts excluded; EOS included).
    wall_time_s : float
        Wall-clock time, from the first forward to the last token.
    steps : int
        Batched target forwards, prompt forwards excluded.
    sequence_forwards : int
        Sum over steps of the sequences in the batch.
    accepted_counts : tuple[int, ...]
        ``[k + 1]``: number of sequence forwards that accepted exactly ``j`` drafts.
    offered_by_position : tuple[int, ...]
        ``[k]``: number of sequence forwards that were offered draft ``j + 1`` (fewer than
        ``sequence_forwards`` when the draft length is adaptive); empty means every one.

    Examples
    --------
    >>> s = GenerationStats("speculative", "n-gram", "chain", 2, 1, 5, 0.5, 3, 3, (1, 1, 1))
    >>> s.acceptance_rate, s.acceptance_by_position, s.target_forwards_saved
    (0.5, [0.6666666666666666, 0.3333333333333333], 2)
    """

    mode: str
    drafter: str | None
    method: str | None
    k: int
    sequences: int
    tokens: int
    wall_time_s: float
    steps: int
    sequence_forwards: int
    accepted_counts: tuple[int, ...] = field(default=())
    offered_by_position: tuple[int, ...] = field(default=())

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of wall-clock time."""
        return self.tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")

    @property
    def steps_per_s(self) -> float:
        """Batched target forwards per second."""
        return self.steps / self.wall_time_s if self.wall_time_s > 0 else float("nan")

    @property
    def proposed(self) -> int:
        """Draft tokens proposed."""
        if self.offered_by_position:
            return sum(self.offered_by_position)
        return self.k * self.sequence_forwards

    @property
    def accepted(self) -> int:
        """Draft tokens accepted."""
        return sum(j * c for j, c in enumerate(self.accepted_counts))

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed drafts (NaN without drafts)."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def acceptance_by_position(self) -> list[float]:
        """``[k]``: fraction of the sequence forwards offered draft ``j + 1`` that accepted it."""
        total = sum(self.accepted_counts)
        offered = self.offered_by_position or (total,) * self.k
        return [
            sum(self.accepted_counts[j:]) / offered[j - 1] if offered[j - 1] else float("nan")
            for j in range(1, self.k + 1)
        ]

    @property
    def tokens_per_forward(self) -> float:
        """Mean tokens generated per sequence forward of the target."""
        return self.tokens / self.sequence_forwards if self.sequence_forwards else float("nan")

    @property
    def target_forwards_saved(self) -> int:
        """Sequence forwards of the target saved against target-only decoding."""
        return self.tokens - self.sequence_forwards

    def merge(self, other: GenerationStats) -> GenerationStats:
        """Add the counters of another run of the same configuration (batches of one call)."""
        counts = _add(self.accepted_counts, other.accepted_counts)
        offered = _add(self.offered_by_position, other.offered_by_position)
        return replace(
            self,
            sequences=self.sequences + other.sequences,
            tokens=self.tokens + other.tokens,
            wall_time_s=self.wall_time_s + other.wall_time_s,
            steps=self.steps + other.steps,
            sequence_forwards=self.sequence_forwards + other.sequence_forwards,
            accepted_counts=counts,
            offered_by_position=offered,
        )

    def as_dict(self) -> dict[str, Any]:
        """Every counter and derived metric, as plain Python values."""
        return {
            "mode": self.mode,
            "drafter": self.drafter,
            "method": self.method,
            "k": self.k,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "wall_time_s": self.wall_time_s,
            "tokens_per_s": self.tokens_per_s,
            "steps": self.steps,
            "steps_per_s": self.steps_per_s,
            "sequence_forwards": self.sequence_forwards,
            "tokens_per_forward": self.tokens_per_forward,
            "target_forwards_saved": self.target_forwards_saved,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
            "accepted_counts": list(self.accepted_counts),
            "offered_by_position": list(self.offered_by_position),
        }

    def format_table(self) -> str:
        """A two-column table of the run's statistics (``-`` where a rate is undefined, such
        as the acceptance of a position never drafted)."""
        rows: list[tuple[str, str]] = [("mode", self.mode)]
        if self.mode == "speculative":
            rows += [("drafter", str(self.drafter)), ("method", str(self.method))]
            rows.append(("drafts per step (k)", str(self.k)))
        rows += [
            ("sequences", str(self.sequences)),
            ("tokens generated", str(self.tokens)),
            ("wall time", f"{self.wall_time_s:.3f} s"),
            ("tokens/s", _shown(self.tokens_per_s, ".1f")),
            ("target steps (batched)", f"{self.steps} ({_shown(self.steps_per_s, '.1f')}/s)"),
            ("target forwards (per sequence)", str(self.sequence_forwards)),
            ("tokens per target forward", _shown(self.tokens_per_forward, ".3f")),
        ]
        if self.mode == "speculative":
            saved = self.target_forwards_saved
            share = saved / self.tokens if self.tokens else float("nan")
            rows += [
                ("target forwards saved", f"{saved} ({_shown(share, '.1%')} of target-only)"),
                (
                    "acceptance rate",
                    f"{self.accepted}/{self.proposed} = {_shown(self.acceptance_rate, '.3f')}",
                ),
                (
                    "acceptance by position",
                    " ".join(_shown(rate, ".3f") for rate in self.acceptance_by_position),
                ),
            ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


class GenerationInterrupted(KeyboardInterrupt):
    """A generation call stopped by Ctrl-C, with the counters of the steps that ran.

    A ``KeyboardInterrupt``, so that code catching that sees it as before; the decoding loop
    raises it from the interrupt it received.

    Parameters
    ----------
    stats : GenerationStats
        The counters of what ran (the step under way when the interrupt came may count in
        part).

    Examples
    --------
    >>> stats = GenerationStats("target-only", None, None, 0, 1, 3, 0.5, 3, 3)
    >>> isinstance(GenerationInterrupted(stats), KeyboardInterrupt)
    True
    """

    def __init__(self, stats: GenerationStats) -> None:
        super().__init__(f"interrupted after {stats.tokens} tokens")
        self.stats = stats


def _shown(value: float, spec: str) -> str:
    """``value`` formatted by ``spec``, or ``"-"`` when it is undefined (NaN)."""
    return "-" if math.isnan(value) else format(value, spec)


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Elementwise sum of two count tuples (the shorter padded with zeros)."""
    out = [0] * max(len(a), len(b))
    for source in (a, b):
        for j, c in enumerate(source):
            out[j] += c
    return tuple(out)
