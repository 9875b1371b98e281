"""End-to-end exactness of a generation loop: the law of the first two generated tokens.

A loop that samples from a causal LM exactly must emit, after a fixed prompt, a first token
``x1 ~ q(. | prompt)`` and a second ``x2 ~ q(. | prompt, x1)``. :func:`two_token_joint`
computes that joint law from the model alone (full forwards, no cache), and
:func:`joint_test` compares the first two tokens of many generated sequences with it by one
chi-square test, its cells fixed before looking at the counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specsample.testing.chisquare import chi2_sf, pooled_cells


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, -1)


def two_token_joint(
    model: Any,
    prompt: Sequence[int],
    *,
    chunk: int = 512,
    process: Callable[[torch.Tensor], torch.Tensor] = _softmax,
) -> torch.Tensor:
    """``[vocab, vocab]`` float64 ``q(x1 | prompt) q(x2 | prompt, x1)``, each ``q`` the
    model's logits turned into probabilities by ``process`` (temperature 1 by default).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM (any callable taking ``[batch, length]`` ids and returning ``.logits``).
    prompt : sequence of int
        The prompt's token ids.
    chunk : int
        Continuations ``x1`` scored per forward.
    process : callable
        ``[rows, vocab]`` float64 logits to ``[rows, vocab]`` probabilities: the sampling
        the law is that of (temperature, top-k, top-p, ...); a softmax by default.

    Examples
    --------
    >>> import torch
    >>> from types import SimpleNamespace
    >>> uniform = lambda ids: SimpleNamespace(logits=torch.zeros(*ids.shape, 4))
    >>> float(two_token_joint(uniform, [1, 2]).sum())
    1.0
    """
    context = torch.tensor([list(prompt)])
    with torch.inference_mode():
        first = process(model(context).logits[:, -1].double())[0]
        vocab = first.shape[0]
        rows = []
        for start in range(0, vocab, chunk):
            tokens = torch.arange(start, min(start + chunk, vocab)).unsqueeze(1)
            ids = torch.cat([context.expand(tokens.shape[0], -1), tokens], dim=1)
            rows.append(process(model(ids).logits[:, -1].double()))
    return first.unsqueeze(1) * torch.cat(rows)


def joint_test(sequences: Sequence[Sequence[int]], joint: torch.Tensor) -> tuple[float, int]:
    """p-value and degrees of freedom of the first two tokens' counts against ``joint``.

    Every pair ``(x1, x2)`` expected :data:`~specsample.testing.MIN_EXPECTED` times or more
    is a cell of its own; the rarer ones are pooled into one cell (see
    :func:`~specsample.testing.chisquare.pooled_cells`).

    Parameters
    ----------
    sequences : sequence of sequences of int
        Generated tokens (prompt excluded), at least two per sequence.
    joint : torch.Tensor
        ``[vocab, vocab]`` float64 law of the pair (:func:`two_token_joint`).

    Examples
    --------
    >>> import torch
    >>> joint = torch.full((2, 2), 0.25, dtype=torch.float64)
    >>> pvalue, df = joint_test([[0, 0], [0, 1], [1, 0], [1, 1]] * 25, joint)
    >>> round(pvalue, 6), df
    (1.0, 3)
    """
    vocab = joint.shape[0]
    pairs = torch.tensor([list(s[:2]) for s in sequences])
    observed = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab)
    cell_observed, cell_expected = pooled_cells(observed, joint.reshape(-1) * len(sequences))
    statistic = sum((o - e) ** 2 / e for o, e in zip(cell_observed, cell_expected, strict=True))
    return chi2_sf(statistic, len(cell_expected) - 1), len(cell_expected) - 1
