"""The benchmark's shapes and its realistic verifier inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

Shape = tuple[int, int, int]
"""``(batch, k, vocab)``."""

DEFAULT_SHAPES: tuple[Shape, ...] = (
    (1, 4, 32000),
    (8, 4, 32000),
    (64, 4, 128256),
    (16, 5, 151936),
    (128, 8, 32000),
)
"""``(batch, k, vocab)`` shapes of the full benchmark (Llama-2, Llama-3 and Qwen2 vocabularies)."""

QUICK_SHAPES: tuple[Shape, ...] = ((8, 4, 32000), (64, 4, 128256))
"""A small subset for a quick look."""

MAX_SHAPE_BATCH = 4096
"""Largest batch of a shape (the slow contestants loop over the sequences in Python)."""

MAX_SHAPE_K = 255
"""Largest ``k`` of a shape (the verifier's random streams allow ``k < 256``)."""

MAX_SHAPE_VOCAB = 1 << 20
"""Largest vocabulary of a shape."""

MAX_SHAPE_VALUES = 1 << 27
"""Most probabilities per input tensor, ``batch * (k + 1) * vocab`` (512 MiB in float32);
the largest default shape has 4.1e7."""

TARGET_SCALE = 4.0
"""Target logits are ``TARGET_SCALE * z`` with ``z`` standard normal."""

DRAFT_MIX = 0.2
"""Weight of the draft's own noise in its logits (see :func:`correlated_logits`)."""


class BenchInputs(NamedTuple):
    """Inputs of one benchmark shape: a chain verifier's arguments in order, then the bonus row.

    Attributes
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[batch, k, vocab]`` target rows ``q`` and draft rows ``p`` (fields 0 and 2).
    bonus_token_ids, draft_token_ids : torch.Tensor
        ``[batch, 1]`` and ``[batch, k]`` int64, sampled from ``bonus_probs`` and
        ``draft_probs`` (fields 1 and 3).
    bonus_probs : torch.Tensor
        ``[batch, vocab]`` the target row after the last draft.
    """

    target_probs: torch.Tensor
    bonus_token_ids: torch.Tensor
    draft_probs: torch.Tensor
    draft_token_ids: torch.Tensor
    bonus_probs: torch.Tensor


def check_shape(shape: Sequence[int]) -> Shape:
    """``shape`` as a :data:`Shape`, or a ``TypeError``/``ValueError`` naming it."""
    if len(shape) != 3 or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        raise TypeError(f"a shape must be three integers (batch, k, vocab), got {shape!r}")
    batch, k, vocab = shape
    if not (
        1 <= batch <= MAX_SHAPE_BATCH and 1 <= k <= MAX_SHAPE_K and 2 <= vocab <= MAX_SHAPE_VOCAB
    ):
        raise ValueError(
            f"a shape needs batch in [1, {MAX_SHAPE_BATCH}], k in [1, {MAX_SHAPE_K}] and vocab in "
            f"[2, {MAX_SHAPE_VOCAB}], got {tuple(shape)}"
        )
    values = batch * (k + 1) * vocab
    if values > MAX_SHAPE_VALUES:
        raise ValueError(
            f"a shape needs batch * (k + 1) * vocab <= {MAX_SHAPE_VALUES} (2**27), got "
            f"{tuple(shape)} with {values}"
        )
    return batch, k, vocab


def correlated_logits(z: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Draft logits that see the target's ``z`` through noise, ``4 (0.98 z + 0.2 z')``.

    Parameters
    ----------
    z, noise : torch.Tensor
        Standard normal tensors of one shape (``[..., vocab]``): the target's logits divided
        by :data:`TARGET_SCALE`, and the draft's own noise ``z'``.

    Returns
    -------
    torch.Tensor
        ``[..., vocab]`` draft logits; their softmax accepts about 0.7 of the target's mass
        (``sum_x min(q, p)``) per position.

    Examples
    --------
    >>> z = torch.zeros(2, 5)
    >>> torch.equal(correlated_logits(z, torch.zeros(2, 5)), z)
    True
    """
    mix = (1.0 - DRAFT_MIX**2) ** 0.5
    return TARGET_SCALE * (mix * z + DRAFT_MIX * noise)


def make_inputs(
    batch: int,
    k: int,
    vocab: int,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> BenchInputs:
    """Realistic verifier inputs: softmax rows, drafts sampled from the draft rows.

    Target logits are ``4 z`` and draft logits ``4 (0.98 z + 0.2 z')`` with independent
    standard normal ``z, z'`` (see :func:`correlated_logits`), which gives an acceptance
    ``sum_x min(q, p)`` of about 0.7 per position.

    Parameters
    ----------
    batch, k, vocab : int
        Sequences, drafts per sequence, vocabulary size.
    device : str or torch.device
        Where the tensors live.
    dtype : torch.dtype
        Dtype of the probability tensors.
    seed : int
        Seed of the generator that draws everything.

    Returns
    -------
    BenchInputs
        ``target_probs`` and ``draft_probs`` ``[batch, k, vocab]``, ``bonus_token_ids``
        ``[batch, 1]``, ``draft_token_ids`` ``[batch, k]``, ``bonus_probs`` ``[batch, vocab]``.

    Raises
    ------
    TypeError, ValueError
        The shape is not three integers, or is out of range: batch in ``[1, MAX_SHAPE_BATCH]``,
        k in ``[1, MAX_SHAPE_K]``, vocab in ``[2, MAX_SHAPE_VOCAB]`` and
        ``batch * (k + 1) * vocab <= MAX_SHAPE_VALUES``.

    Examples
    --------
    >>> inputs = make_inputs(2, 3, 50)
    >>> tuple(inputs.target_probs.shape), tuple(inputs.draft_token_ids.shape)
    ((2, 3, 50), (2, 3))
    """
    batch, k, vocab = check_shape((batch, k, vocab))
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    z = torch.randn(batch, k + 1, vocab, generator=gen, device=device)
    noise = torch.randn(batch, k, vocab, generator=gen, device=device)
    target = torch.softmax(TARGET_SCALE * z, dim=-1)
    draft = torch.softmax(correlated_logits(z[:, :k], noise), dim=-1)
    draft_ids = torch.multinomial(draft.view(-1, vocab), 1, generator=gen).view(batch, k)
    bonus_ids = torch.multinomial(target[:, k], 1, generator=gen)
    return BenchInputs(
        target[:, :k].to(dtype).contiguous(),
        bonus_ids,
        draft.to(dtype),
        draft_ids,
        target[:, k].to(dtype).contiguous(),
    )
