"""The draft layout of a chain step: how a ragged batch's drafts and target rows lie in the
flattened tensors, built and checked once.

:class:`BatchLayout` turns the draft counts the caller gives (host values, CPU tensors or
tensors on the batch's device) into a few small device tensors and host-side sizes, so the
device work is planned without synchronising; :func:`step_layout` checks it against the
step's other arguments (the drafts, the bonus tokens) where :func:`specsample.verify`
receives them.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from specsample.params.checks import check_draft_rows, require_tensor
from specsample.params.metadata import placed
from specsample.params.transfer import to_device
from specsample.random import STEP_STRIDE

Ints = Sequence[int] | torch.Tensor
"""Per-request integers: host ints or an integer tensor."""


def check_max_drafts(max_drafts: object) -> None:
    """Refuse a ``max_draft_tokens`` that is neither ``None`` nor an int >= 0.

    Examples
    --------
    >>> check_max_drafts(2.0)
    Traceback (most recent call last):
    ...
    TypeError: max_draft_tokens must be an int or None, got float
    """
    if max_drafts is None:
        return
    if isinstance(max_drafts, bool) or not isinstance(max_drafts, int):
        raise TypeError(f"max_draft_tokens must be an int or None, got {type(max_drafts).__name__}")
    if max_drafts < 0:
        raise ValueError(f"max_draft_tokens must be >= 0, got {max_drafts}")


def _counts_tensor(counts: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """Check a tensor of counts; ``None`` when it is on the host (its values are read)."""
    if counts.dtype.is_floating_point or counts.is_complex() or counts.dtype == torch.bool:
        raise TypeError(f"num_draft_tokens must be an integer tensor, got {counts.dtype}")
    if counts.dim() != 1:
        raise ValueError(f"num_draft_tokens must have shape [batch], got {tuple(counts.shape)}")
    return None if placed("num_draft_tokens", counts, device) else counts


def _host_counts(counts: object) -> list[int]:
    """Host counts: a sequence of ints in ``[0, 2**63)``."""
    if isinstance(counts, str | bytes) or not isinstance(counts, Sequence):
        raise TypeError(
            "num_draft_tokens must be a sequence of ints or a 1-D integer tensor, "
            f"got {type(counts).__name__}"
        )
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"num_draft_tokens entries must be int, got {type(n).__name__}")
        if not 0 <= int(n) < 1 << 63:
            raise ValueError(f"num_draft_tokens entries must lie in [0, 2**63), got {n}")
    return [int(n) for n in counts]


def _traced(total_drafts: int | None, max_drafts: int | None) -> bool:
    """Whether host counts are to be taken as device counts: under :func:`torch.compile`,
    with their sum and maximum given, so that reading them breaks no graph."""
    return torch.compiler.is_compiling() and total_drafts is not None and max_drafts is not None


@dataclass(frozen=True)
class BatchLayout:
    """The ragged layout of a flattened batch.

    Request ``i`` has ``num_drafts[i]`` draft positions. The flattened target rows hold, for
    each request in turn, its draft positions and then its bonus position (or, with
    ``bonus_rows=False``, its draft positions only, the bonus tokens being given); the
    flattened draft rows (and ids) hold its draft positions only.

    Attributes
    ----------
    batch, total_drafts, max_drafts : int
        Requests, draft positions over the batch, and the most drafts of any request (the
        padded width minus one): host-side.
    bonus_rows : bool
        Whether the target rows include one bonus row per request.
    num_drafts, draft_start, target_start : torch.Tensor
        ``[batch]`` int64 device tensors: the counts, the first draft row and the first
        target row of each request.
    target_request : torch.Tensor
        ``[target_rows]`` int64 device tensor: the request each flattened target row belongs
        to. Built with the layout (from host counts, in the same copy to the device as the
        tensors above, :func:`specsample.params.transfer.to_device`), so a step that reuses
        the layout launches nothing for it.

    Examples
    --------
    >>> layout = BatchLayout.build([2, 0, 1], torch.device("cpu"))
    >>> layout.total_drafts, layout.max_drafts, layout.target_start.tolist()
    (3, 2, [0, 3, 4])
    >>> layout.target_request.tolist()
    [0, 0, 0, 1, 2, 2]
    """

    batch: int
    total_drafts: int
    max_drafts: int
    bonus_rows: bool
    num_drafts: torch.Tensor
    draft_start: torch.Tensor
    target_start: torch.Tensor
    target_request: torch.Tensor

    @staticmethod
    def build(
        num_draft_tokens: Sequence[int] | torch.Tensor,
        device: torch.device,
        *,
        total_drafts: int | None = None,
        max_drafts: int | None = None,
        bonus_rows: bool = True,
    ) -> BatchLayout:
        """Build the layout from the draft counts.

        Parameters
        ----------
        num_draft_tokens : sequence of int or tensor
            ``[batch]`` drafts per request: host ints, an integer CPU tensor, or an integer
            tensor on the batch's device (then ``total_drafts`` and ``max_drafts`` are
            required, as reading them would synchronise). A tensor on any other device is
            refused. Under :func:`torch.compile`, a CPU tensor given with ``total_drafts``
            and ``max_drafts`` is used as a device tensor (its values are not read).
        device : torch.device
            The batch's device.
        total_drafts, max_drafts : int, optional
            Host-side sum and maximum of device counts. With host counts ``total_drafts``
            is ignored and ``max_drafts``, when given, widens the padded width (it must be
            at least the largest count).
        bonus_rows : bool
            Whether the target rows include each request's bonus row.

        Raises
        ------
        TypeError
            Counts that are not ints (or an integer tensor), a ``max_drafts`` not an int.
        ValueError
            A negative count, a tensor of the wrong shape or device, a ``max_drafts``
            below the largest count.
        """
        check_max_drafts(max_drafts)
        if isinstance(num_draft_tokens, torch.Tensor):
            counts_tensor = _counts_tensor(num_draft_tokens, device)
            if counts_tensor is None and _traced(total_drafts, max_drafts):
                counts_tensor = num_draft_tokens
            if counts_tensor is not None:
                return BatchLayout._from_device(
                    counts_tensor, device, total_drafts, max_drafts, bonus_rows
                )
            num_draft_tokens = num_draft_tokens.tolist()
        counts = _host_counts(num_draft_tokens)
        widest = max([0, *counts])
        if max_drafts is not None and max_drafts < widest:
            raise ValueError(
                f"max_draft_tokens is {max_drafts} but a request has {widest} draft tokens"
            )
        batch = len(counts)
        rows_of = [n + 1 for n in counts] if bonus_rows else counts
        starts = list(accumulate(counts, initial=0))[:batch]
        target_starts = list(accumulate(rows_of, initial=0))[:batch]
        request = [i for i, n in enumerate(rows_of) for _ in range(n)]
        host = torch.tensor(counts + starts + target_starts + request, dtype=torch.int64)
        parts = host.split([batch, batch, batch, len(request)])
        num_drafts, draft_start, target_start, target_request = to_device(parts, device)
        return BatchLayout(
            batch=batch,
            total_drafts=sum(counts),
            max_drafts=widest if max_drafts is None else int(max_drafts),
            bonus_rows=bonus_rows,
            num_drafts=num_drafts,
            draft_start=draft_start,
            target_start=target_start,
            target_request=target_request,
        )

    @staticmethod
    def _from_device(
        counts: torch.Tensor,
        device: torch.device,
        total_drafts: int | None,
        max_drafts: int | None,
        bonus_rows: bool,
    ) -> BatchLayout:
        if total_drafts is None or max_drafts is None:
            raise ValueError(
                f"num_draft_tokens is a tensor on {counts.device}: pass its maximum as "
                "max_draft_tokens= (reading it would synchronise), or give the counts as a list"
            )
        counts = counts.to(device=device, dtype=torch.int64)
        start = counts.cumsum(0) - counts
        target_start = start + torch.arange(counts.shape[0], device=device) if bonus_rows else start
        target_rows = total_drafts + (counts.shape[0] if bonus_rows else 0)
        rows = torch.arange(target_rows, device=device)
        return BatchLayout(
            batch=counts.shape[0],
            total_drafts=total_drafts,
            max_drafts=max_drafts,
            bonus_rows=bonus_rows,
            num_drafts=counts,
            draft_start=start,
            target_start=target_start,
            target_request=torch.searchsorted(target_start, rows, right=True) - 1,
        )

    @property
    def target_rows(self) -> int:
        """Number of flattened target rows: ``total_drafts`` (plus ``batch`` bonus rows)."""
        return self.total_drafts + (self.batch if self.bonus_rows else 0)


def step_layout(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Ints | BatchLayout,
    bonus_token_ids: torch.Tensor | None,
    max_draft_tokens: int | None,
    needs_bonus_rows: str | None,
) -> tuple[BatchLayout, torch.Tensor | None]:
    """The layout of a chain step on flattened logits (built from ``num_draft_tokens``, or
    that layout checked against the other arguments), and the given bonus ids as
    ``[batch]`` int64 (or ``None``).

    ``needs_bonus_rows`` names what needs the bonus rows (to refuse ``bonus_token_ids``).

    Examples
    --------
    >>> layout, bonus = step_layout(torch.zeros(5, 4), torch.tensor([0, 1, 2]), [2, 1],
    ...                             None, None, None)
    >>> layout.batch, layout.max_drafts, bonus
    (2, 2, None)
    """
    if isinstance(num_draft_tokens, BatchLayout):
        layout = _given(num_draft_tokens, bonus_token_ids, max_draft_tokens)
    else:
        layout = BatchLayout.build(
            num_draft_tokens,
            target_logits.device,
            total_drafts=draft_token_ids.shape[0],
            max_drafts=max_draft_tokens,
            bonus_rows=bonus_token_ids is None,
        )
    if layout.max_drafts >= STEP_STRIDE:
        name = "num_draft_tokens" if max_draft_tokens is None else "max_draft_tokens"
        raise ValueError(
            f"{name}: a request may have at most {STEP_STRIDE - 1} drafts, got {layout.max_drafts}"
        )
    if layout.total_drafts != draft_token_ids.shape[0]:
        raise ValueError(
            f"num_draft_tokens adds up to {layout.total_drafts} "
            f"but draft_token_ids has {draft_token_ids.shape[0]} entries"
        )
    bonus = check_bonus_ids(bonus_token_ids, layout.batch, target_logits.device)
    if needs_bonus_rows is not None and bonus is not None:
        raise ValueError(
            f"{needs_bonus_rows} needs the bonus rows: pass them instead of bonus_token_ids"
        )
    return layout, bonus


def _given(
    layout: BatchLayout, bonus_token_ids: torch.Tensor | None, max_draft_tokens: int | None
) -> BatchLayout:
    """A layout passed as ``num_draft_tokens``, checked against the other arguments."""
    if max_draft_tokens is not None:
        raise ValueError("pass max_draft_tokens to BatchLayout.build, not beside a layout")
    if layout.bonus_rows != (bonus_token_ids is None):
        has = "has" if layout.bonus_rows else "has no"
        raise ValueError(
            f"num_draft_tokens is a layout that {has} bonus rows, which does not match "
            f"bonus_token_ids={'None' if bonus_token_ids is None else 'a tensor'}"
        )
    return layout


def check_bonus_ids(value: object, batch: int, device: torch.device) -> torch.Tensor | None:
    if value is None:
        return None
    ids = require_tensor("bonus_token_ids", value)
    if ids.shape not in ((batch,), (batch, 1)):
        raise ValueError(
            f"bonus_token_ids must have shape ({batch},) or ({batch}, 1), got {tuple(ids.shape)}"
        )
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"bonus_token_ids must be int64 or int32, got {ids.dtype}")
    if ids.device != device:
        raise ValueError(f"bonus_token_ids is on {ids.device} but target_logits is on {device}")
    return ids.reshape(batch).to(torch.int64)


def check_logits_inputs(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    draft_rows: object,
    draft_name: str,
) -> torch.Tensor | None:
    """Check :func:`specsample.verify`'s tensors against the layout :func:`step_layout` built
    (no sync): the target rows, and the draft rows ``draft_rows`` (named ``draft_name``).

    Returns the draft rows (``[total_drafts, vocab]``), or ``None`` when there are none.
    """
    rows, vocab = target_logits.shape
    total = layout.total_drafts
    if rows != layout.target_rows:
        what = "total_drafts + batch" if layout.bonus_rows else "total_drafts (bonus ids given)"
        raise ValueError(
            f"target_logits must have {what} = {layout.target_rows} rows "
            f"(num_draft_tokens adds up to {total}, batch {layout.batch}), got {rows}"
        )
    if draft_rows is None:
        return None
    return check_draft_rows(
        draft_name, draft_rows, (total, vocab), "[total_drafts, vocab]", target_logits
    )


def check_layout_values(layout: BatchLayout) -> None:
    """Strict-mode check of the draft counts (read back when given as a device tensor).

    Raises
    ------
    ValueError
        A negative count, counts that do not add up to ``total_drafts``, or one above
        ``max_drafts`` (``max_draft_tokens``).
    """
    counts = layout.num_drafts
    if not counts.numel():
        return
    if bool((counts < 0).any()):
        raise ValueError("num_draft_tokens must be >= 0")
    if int(counts.sum()) != layout.total_drafts:
        raise ValueError(
            f"num_draft_tokens adds up to {int(counts.sum())} "
            f"but draft_token_ids has {layout.total_drafts} entries"
        )
    if int(counts.max()) > layout.max_drafts:
        raise ValueError(
            f"max_draft_tokens is {layout.max_drafts} but a request has "
            f"{int(counts.max())} draft tokens"
        )
