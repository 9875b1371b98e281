"""What a batch asks for: its ragged layout and per-request sampling parameters.

This is host-side metadata, built once per step from Python values (or CPU tensors) and
turned into a few small device tensors; the kernels in :mod:`specsample.probs` and
:mod:`specsample.rules` only read those. Keeping the flags (all greedy? any top-p?) on the
host is what lets the device work run without ever synchronising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["BatchLayout", "SamplingMetadata"]

Scalars = float | int | Sequence[float] | Sequence[int] | torch.Tensor | None


def _host_list(name: str, value: Scalars, batch: int, default: float) -> list[float]:
    if value is None:
        return [default] * batch
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return [float(value)] * batch
        if value.dim() != 1:
            raise ValueError(
                f"{name} must be a scalar or have shape ({batch},), got {tuple(value.shape)}"
            )
        value = value.tolist()
    if isinstance(value, (int, float)):
        return [float(value)] * batch
    values = [float(v) for v in value]
    if len(values) != batch:
        raise ValueError(f"{name} must have one value per request ({batch}), got {len(values)}")
    return values


@dataclass(frozen=True)
class BatchLayout:
    """The ragged layout of a flattened batch.

    Request ``i`` has ``num_drafts[i]`` draft positions. The flattened target rows hold, for
    each request in turn, its draft positions and then its bonus position; the flattened
    draft rows (and ids) hold its draft positions only.

    Attributes
    ----------
    num_drafts : tuple[int, ...]
        Drafts per request (zeros allowed).
    num_drafts_t, draft_start, target_start : torch.Tensor
        ``[batch]`` int64 device tensors: the counts, the first draft row and the first
        target row of each request.

    Examples
    --------
    >>> layout = BatchLayout.build([2, 0, 1], torch.device("cpu"))
    >>> layout.total_drafts, layout.max_drafts, layout.target_start.tolist()
    (3, 2, [0, 3, 4])
    """

    num_drafts: tuple[int, ...]
    num_drafts_t: torch.Tensor
    draft_start: torch.Tensor
    target_start: torch.Tensor

    @staticmethod
    def build(num_draft_tokens: Sequence[int] | torch.Tensor, device: torch.device) -> BatchLayout:
        """Build the layout from host-side draft counts (a sequence or a CPU tensor)."""
        if isinstance(num_draft_tokens, torch.Tensor):
            if num_draft_tokens.dim() != 1 or num_draft_tokens.dtype.is_floating_point:
                raise ValueError(
                    "num_draft_tokens must be a 1-D integer tensor or a sequence of ints"
                )
            num_draft_tokens = num_draft_tokens.tolist()
        counts = tuple(int(n) for n in num_draft_tokens)
        if any(n < 0 for n in counts):
            raise ValueError(f"num_draft_tokens must be >= 0, got {min(counts)}")
        draft_start = [0] * len(counts)
        for i in range(1, len(counts)):
            draft_start[i] = draft_start[i - 1] + counts[i - 1]
        start = torch.tensor(draft_start, dtype=torch.int64)
        return BatchLayout(
            num_drafts=counts,
            num_drafts_t=torch.tensor(counts, dtype=torch.int64).to(device, non_blocking=True),
            draft_start=start.to(device, non_blocking=True),
            target_start=(start + torch.arange(len(counts))).to(device, non_blocking=True),
        )

    @property
    def batch(self) -> int:
        """Number of requests."""
        return len(self.num_drafts)

    @property
    def total_drafts(self) -> int:
        """Number of draft positions over the batch."""
        return sum(self.num_drafts)

    @property
    def max_drafts(self) -> int:
        """Largest number of drafts of any request (the padded width minus one)."""
        return max(self.num_drafts, default=0)

    def target_request(self) -> list[int]:
        """The request each flattened target row belongs to (host list)."""
        return [i for i, n in enumerate(self.num_drafts) for _ in range(n + 1)]


@dataclass(frozen=True)
class SamplingMetadata:
    """Per-request sampling parameters, validated, with host-side flags.

    The target distribution is processed in this order: temperature, then top-k, then
    top-p, then min-p (see :mod:`specsample.probs`). Temperature 0 means greedy.

    Attributes
    ----------
    temperature, top_p, min_p : list[float]
    top_k : list[int]
        One value per request; ``top_k = 0``, ``top_p = 1`` and ``min_p = 0`` switch the
        filter off, and greedy requests have every filter off.

    Examples
    --------
    >>> meta = SamplingMetadata.build(3, temperature=[0.0, 0.7, 1.0], top_p=0.9)
    >>> meta.all_greedy, meta.any_greedy, meta.any_top_p, meta.greedy_requests
    (False, True, True, [0])
    """

    temperature: list[float]
    top_k: list[int]
    top_p: list[float]
    min_p: list[float]

    @staticmethod
    def build(
        batch: int,
        *,
        temperature: Scalars = 1.0,
        top_k: Scalars = None,
        top_p: Scalars = None,
        min_p: Scalars = None,
    ) -> SamplingMetadata:
        """Validate and expand the parameters (scalars, sequences or CPU tensors)."""
        temps = _host_list("temperature", temperature, batch, 1.0)
        ks = _host_list("top_k", top_k, batch, 0.0)
        ps = _host_list("top_p", top_p, batch, 1.0)
        mins = _host_list("min_p", min_p, batch, 0.0)
        for t in temps:
            if not (t >= 0.0 and math.isfinite(t)):
                raise ValueError(f"temperature must be finite and >= 0, got {t}")
        for k in ks:
            if k < 0 or k != int(k):
                raise ValueError(f"top_k must be a non-negative integer (0 = off), got {k}")
        for p in ps:
            if not 0.0 < p <= 1.0:
                raise ValueError(f"top_p must lie in (0, 1], got {p}")
        for m in mins:
            if not 0.0 <= m <= 1.0:
                raise ValueError(f"min_p must lie in [0, 1], got {m}")
        sampled = [t > 0.0 for t in temps]
        return SamplingMetadata(
            temps,
            [int(k) if on else 0 for k, on in zip(ks, sampled, strict=True)],
            [p if on else 1.0 for p, on in zip(ps, sampled, strict=True)],
            [m if on else 0.0 for m, on in zip(mins, sampled, strict=True)],
        )

    @property
    def greedy_requests(self) -> list[int]:
        """Indices of the greedy requests (temperature 0)."""
        return [i for i, t in enumerate(self.temperature) if t == 0.0]

    @property
    def sampled_requests(self) -> list[int]:
        """Indices of the sampled requests (temperature > 0)."""
        return [i for i, t in enumerate(self.temperature) if t > 0.0]

    @property
    def all_greedy(self) -> bool:
        """Every request is greedy: no softmax and no random numbers are needed."""
        return all(t == 0.0 for t in self.temperature)

    @property
    def any_greedy(self) -> bool:
        """Some request is greedy."""
        return any(t == 0.0 for t in self.temperature)

    @property
    def max_top_k(self) -> int:
        """Largest top-k of any request (0 when none uses top-k)."""
        return max(self.top_k, default=0)

    @property
    def any_top_p(self) -> bool:
        """Some request uses top-p."""
        return any(p < 1.0 for p in self.top_p)

    @property
    def any_min_p(self) -> bool:
        """Some request uses min-p."""
        return any(m > 0.0 for m in self.min_p)
