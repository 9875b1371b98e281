"""The PyTorch backend's typical-acceptance step (Medusa's rule, LOSSY) on flattened logits.

Typical acceptance reads whole processed target rows (an entropy per position), so this
step materialises the processed distributions of each request's draft and bonus rows, as
the rule itself does on probabilities (:func:`specsample.rules.typical.typical_acceptance`).
"""

from __future__ import annotations

import torch

from specsample.backends.eager import pad_drafts
from specsample.params.layout import BatchLayout
from specsample.params.metadata import SamplingMetadata
from specsample.probs import request_probs
from specsample.rules.typical import typical_acceptance


def verify_typical(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    sampling: SamplingMetadata,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Typical acceptance of a ragged step: ``(token_ids, num_accepted)``. NOT exact.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[total_drafts + batch, vocab]``: per request its draft rows, then its bonus row.
    draft_token_ids : torch.Tensor
        ``[total_drafts]`` int64.
    layout : BatchLayout
        The ragged layout (with bonus rows).
    sampling : SamplingMetadata
        ``[batch]`` per-request parameters; greedy rows become the one-hot distribution of
        their argmax, so a greedy request accepts exactly the drafts equal to the argmax.

    Returns
    -------
    tuple of torch.Tensor
        ``[batch, max_drafts + 1]`` int64 tokens (accepted drafts, the argmax correction or
        bonus argmax, then -1) and ``[batch]`` int64 accepted counts.

    Examples
    --------
    >>> logits = torch.tensor([[0.0, 9.0], [9.0, 0.0], [0.0, 9.0]])
    >>> layout = BatchLayout.build([1, 0], torch.device("cpu"))
    >>> meta = SamplingMetadata.build(2, torch.device("cpu"), temperature=0.0)
    >>> tokens, accepted = verify_typical(logits, torch.tensor([1]), layout, meta)
    >>> tokens.tolist(), accepted.tolist()
    ([[1, 0], [1, -1]], [1, 0])
    """
    rows, vocab = target_logits.shape
    width = layout.max_drafts + 1
    drafts = pad_drafts(draft_token_ids, layout, vocab, rows)
    cols = torch.arange(width, device=target_logits.device)
    index = (layout.target_start.unsqueeze(-1) + cols).clamp_(max=max(rows - 1, 0))
    out = typical_acceptance(request_probs(target_logits[index], sampling), drafts.ids[:, :-1])
    return out.token_ids, out.num_accepted
