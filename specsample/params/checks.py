"""Input validation shared by the verifiers.

Cheap checks (rank, shape, dtype, device: metadata only) always run. The costly ones read
the tensors and synchronise with the device, so they run only in strict mode: token ids in
``[0, vocab)``, probabilities finite, non-negative and summing to 1 within
:data:`SUM_TOLERANCE` for their dtype.
"""

from __future__ import annotations

import torch

PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
"""Accepted dtypes of probability tensors."""

ID_DTYPES = (torch.int64, torch.int32)
"""Accepted dtypes of token id tensors."""

SUM_TOLERANCE = {
    torch.float64: 1e-6,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}
"""Largest ``|sum(row) - 1|`` strict mode accepts, by dtype."""


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_rank(name: str, value: torch.Tensor, rank: int, layout: str) -> None:
    """Refuse a tensor of another rank (``ValueError`` naming it and its ``layout``).

    Examples
    --------
    >>> require_rank("target_logits", torch.zeros(3), 2, "[rows, vocab]")
    Traceback (most recent call last):
    ...
    ValueError: target_logits must have shape [rows, vocab], got (3,)
    """
    if value.dim() != rank:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(value.shape)}")


def check_chain_inputs(
    target_probs: object,
    bonus_token_ids: object,
    draft_probs: object,
    draft_token_ids: object,
    *,
    target_name: str = "target_probs",
) -> None:
    """Check ranks, shapes, dtypes and devices of the chain verifier's inputs.

    ``target_name`` names ``target_probs`` in the messages.

    Raises
    ------
    TypeError
        An argument is not a tensor, or has the wrong dtype.
    ValueError
        An argument has the wrong rank or shape, or lives on another device.

    Examples
    --------
    >>> import torch
    >>> check_chain_inputs(torch.ones(2, 3, 5), torch.zeros(2, 1, dtype=torch.long),
    ...                    torch.ones(2, 4, 5), torch.zeros(2, 3, dtype=torch.long))
    Traceback (most recent call last):
    ...
    ValueError: draft_probs must have shape (2, 3, 5) like target_probs, got (2, 4, 5)
    """
    target = require_tensor(target_name, target_probs)
    bonus = require_tensor("bonus_token_ids", bonus_token_ids)
    draft = require_tensor("draft_probs", draft_probs)
    ids = require_tensor("draft_token_ids", draft_token_ids)
    require_rank(target_name, target, 3, "[batch, k, vocab]")
    require_rank("draft_probs", draft, 3, "[batch, k, vocab]")
    require_rank("draft_token_ids", ids, 2, "[batch, k]")
    batch, k, vocab = target.shape
    if vocab == 0:
        raise ValueError(f"{target_name} must have a non-empty vocabulary dimension")
    if draft.shape != target.shape:
        raise ValueError(
            f"draft_probs must have shape {tuple(target.shape)} like {target_name}, "
            f"got {tuple(draft.shape)}"
        )
    if ids.shape != (batch, k):
        raise ValueError(f"draft_token_ids must have shape {(batch, k)}, got {tuple(ids.shape)}")
    if bonus.shape not in ((batch,), (batch, 1)):
        raise ValueError(
            f"bonus_token_ids must have shape {(batch, 1)} or {(batch,)}, got {tuple(bonus.shape)}"
        )
    for name, probs in ((target_name, target), ("draft_probs", draft)):
        if probs.dtype not in PROB_DTYPES:
            raise TypeError(
                f"{name} must be float32, float16, bfloat16 or float64, got {probs.dtype}"
            )
    if draft.dtype != target.dtype:
        raise TypeError(
            f"draft_probs must have the dtype of {target_name} ({target.dtype}), got {draft.dtype}"
        )
    for name, token_ids in (("bonus_token_ids", bonus), ("draft_token_ids", ids)):
        if token_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be int64 or int32, got {token_ids.dtype}")
    for name, tensor in (
        ("bonus_token_ids", bonus),
        ("draft_probs", draft),
        ("draft_token_ids", ids),
    ):
        if tensor.device != target.device:
            raise ValueError(
                f"{name} is on {tensor.device} but {target_name} is on {target.device}"
            )


def _check_ids(name: str, ids: torch.Tensor, vocab: int) -> None:
    if ids.numel() and bool(((ids < 0) | (ids >= vocab)).any()):
        bad = ids[(ids < 0) | (ids >= vocab)][0].item()
        raise ValueError(f"{name} must lie in [0, {vocab}), found {bad}")


def check_prob_values(name: str, probs: torch.Tensor, summed: torch.Tensor | None = None) -> None:
    """Strict-mode check of probability rows ``[..., vocab]`` (synchronises).

    Every value must be finite and non-negative, and every row sum to 1 within
    :data:`SUM_TOLERANCE`; ``summed``, a bool mask over the leading dimensions, limits the
    sum check to the rows it marks (the others need not be distributions).

    Examples
    --------
    >>> check_prob_values("draft_probs", torch.tensor([[0.5, -0.5]]))
    Traceback (most recent call last):
    ...
    ValueError: draft_probs contains negative values
    >>> check_prob_values("draft_probs", torch.zeros(2, 3), torch.tensor([False, False]))
    """
    if not probs.numel():
        return
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name} contains non-finite values")
    if bool((probs < 0).any()):
        raise ValueError(f"{name} contains negative values")
    sums = probs.sum(dim=-1, dtype=torch.float64)
    if summed is not None:
        sums = sums[summed]
    if not sums.numel():
        return
    tolerance = SUM_TOLERANCE[probs.dtype]
    error = (sums - 1.0).abs().max().item()
    if error > tolerance:
        raise ValueError(
            f"{name} rows must sum to 1 within {tolerance:g} ({probs.dtype}), "
            f"one is off by {error:.3g}"
        )


def check_chain_values(
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    *,
    target_name: str = "target_probs",
) -> None:
    """Strict-mode value checks; they read every element and synchronise with the device.

    ``draft_probs`` is ``None`` for a rule that does not read it; ``target_name`` names
    ``target_probs`` in the messages.

    Raises
    ------
    ValueError
        A token id outside ``[0, vocab)``, or probabilities that are non-finite, negative, or
        whose rows do not sum to 1 within :data:`SUM_TOLERANCE`.

    Examples
    --------
    >>> import torch
    >>> check_chain_values(torch.full((1, 1, 2), 0.5), torch.tensor([[1]]),
    ...                    torch.tensor([[[0.7, 0.7]]]), torch.tensor([[0]]))
    Traceback (most recent call last):
    ...
    ValueError: draft_probs rows must sum to 1 within 0.0001 (torch.float32), one is off by 0.4
    """
    vocab = target_probs.shape[-1]
    _check_ids("draft_token_ids", draft_token_ids, vocab)
    _check_ids("bonus_token_ids", bonus_token_ids, vocab)
    check_prob_values(target_name, target_probs)
    if draft_probs is not None:
        check_prob_values("draft_probs", draft_probs)


def check_logits_tensors(target_logits: torch.Tensor, draft_token_ids: torch.Tensor) -> None:
    """Rank, dtype and device checks of :func:`specsample.verify`'s main tensors (no sync).

    Examples
    --------
    >>> check_logits_tensors(torch.zeros(3, 0), torch.zeros(2, dtype=torch.long))
    Traceback (most recent call last):
    ...
    ValueError: target_logits must have a non-empty vocabulary dimension, got shape (3, 0)
    """
    require_rank("target_logits", target_logits, 2, "[rows, vocab]")
    check_vocab_rows("target_logits", target_logits)
    check_token_ids("draft_token_ids", draft_token_ids, 1, "1-D")
    check_same_device("draft_token_ids", draft_token_ids, target_logits)


def check_vocab_rows(name: str, rows: torch.Tensor) -> None:
    """Refuse logits or probabilities ``[..., vocab]`` of a dtype other than :data:`PROB_DTYPES`
    (``TypeError``) or with no vocabulary (``ValueError``); both messages name ``name``.

    Examples
    --------
    >>> check_vocab_rows("target_logits", torch.zeros(2, 3, dtype=torch.int64))
    Traceback (most recent call last):
    ...
    TypeError: target_logits must be float32, float16, bfloat16 or float64, got torch.int64
    """
    if rows.dtype not in PROB_DTYPES:
        raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {rows.dtype}")
    if rows.shape[-1] == 0:
        raise ValueError(
            f"{name} must have a non-empty vocabulary dimension, got shape {tuple(rows.shape)}"
        )


def check_token_ids(name: str, ids: torch.Tensor, rank: int, layout: str) -> None:
    """Refuse token ids that are not an int64 or int32 tensor of ``rank`` dimensions.

    ``layout`` says the expected shape in the message.

    Examples
    --------
    >>> check_token_ids("ids", torch.zeros(3), 1, "1-D")
    Traceback (most recent call last):
    ...
    TypeError: ids must be a 1-D int64 or int32 tensor, got torch.float32 of shape (3,)
    """
    if ids.dim() != rank or ids.dtype not in ID_DTYPES:
        raise TypeError(
            f"{name} must be a {layout} int64 or int32 tensor, got {ids.dtype} "
            f"of shape {tuple(ids.shape)}"
        )


def check_draft_rows(
    name: str,
    rows: object,
    shape: tuple[int, ...],
    layout: str,
    target_logits: torch.Tensor,
) -> torch.Tensor:
    """Draft probabilities or logits: a tensor of ``shape`` (whose dimensions ``layout``
    names in the message) on the device of ``target_logits``, of a dtype of :data:`PROB_DTYPES`.

    Examples
    --------
    >>> check_draft_rows("draft_probs", torch.zeros(2, 4), (2, 3), "[total_drafts, vocab]",
    ...                  torch.zeros(4, 3))
    Traceback (most recent call last):
    ...
    ValueError: draft_probs must have shape (2, 3) [total_drafts, vocab], got (2, 4)
    """
    draft = require_tensor(name, rows)
    if draft.shape != shape:
        raise ValueError(f"{name} must have shape {shape} {layout}, got {tuple(draft.shape)}")
    check_same_device(name, draft, target_logits)
    check_vocab_rows(name, draft)
    return draft


def check_flag(name: str, value: object) -> bool:
    """Refuse a flag that is not a bool (``TypeError`` naming it).

    Examples
    --------
    >>> check_flag("strict", 1)
    Traceback (most recent call last):
    ...
    TypeError: strict must be a bool, got int
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` if it is an int in ``[minimum, maximum]`` (no upper bound for ``None``).

    Raises
    ------
    TypeError
        ``value`` is not an int (a bool is not one); the message names ``name``.
    ValueError
        ``value`` is out of range; the message names ``name`` and the range.

    Examples
    --------
    >>> check_int("rows", 3, 2)
    3
    >>> check_int("k", 65, 1, 64)
    Traceback (most recent call last):
    ...
    ValueError: k must be in [1, 64], got 65
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_bound(name: str, value: int | None) -> None:
    """Refuse a loop bound that is neither ``None`` nor a non-negative int.

    Examples
    --------
    >>> check_bound("max_depth", None); check_bound("max_depth", 3)
    >>> check_bound("max_depth", -1)
    Traceback (most recent call last):
    ...
    ValueError: max_depth must be >= 0, got -1
    """
    if value is not None:
        check_int(name, value, 0)


def check_backend(backend: object, allowed: tuple[str, ...]) -> str:
    """Refuse a backend name that is not a string (which of ``allowed`` it is, is checked on use).

    Examples
    --------
    >>> check_backend(["torch"], ("auto", "torch"))
    Traceback (most recent call last):
    ...
    TypeError: backend must be a str, one of ('auto', 'torch'), got list
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, one of {allowed}, got {type(backend).__name__}")
    return backend


def check_step_uniforms(
    uniforms: object, batch: int, columns: int, device: torch.device, *, layout: str = ""
) -> torch.Tensor:
    """Check caller-given uniforms: ``[batch, columns]`` float64 on ``device`` (no sync).

    ``layout``, when given, says in the shape message what the columns are.

    Examples
    --------
    >>> check_step_uniforms(torch.zeros(2, 3), 2, 3, torch.device("cpu"))
    Traceback (most recent call last):
    ...
    TypeError: uniforms must be float64, got torch.float32
    """
    uniforms = require_tensor("uniforms", uniforms)
    if uniforms.shape != (batch, columns):
        what = f" ({layout})" if layout else ""
        raise ValueError(
            f"uniforms must have shape {(batch, columns)}{what}, got {tuple(uniforms.shape)}"
        )
    if uniforms.dtype != torch.float64:
        raise TypeError(f"uniforms must be float64, got {uniforms.dtype}")
    if uniforms.device != device:
        raise ValueError(f"uniforms is on {uniforms.device} but the batch is on {device}")
    return uniforms


def require_data(name: str, tensor: torch.Tensor) -> None:
    """Refuse to value-check a tensor on the meta device, which holds no values."""
    if tensor.device.type == "meta":
        raise ValueError(f"strict mode reads the values of {name}, but it is on the meta device")


def check_uniform_values(uniforms: torch.Tensor | None) -> None:
    """Strict-mode check of caller-given uniforms: every value in ``[0, 1)`` (synchronises).

    Examples
    --------
    >>> check_uniform_values(torch.tensor([0.5, 1.0], dtype=torch.float64))
    Traceback (most recent call last):
    ...
    ValueError: uniforms must lie in [0, 1), got 1.0
    """
    if uniforms is None or not uniforms.numel():
        return
    bad = ~((uniforms >= 0) & (uniforms < 1))
    if bool(bad.any()):
        raise ValueError(f"uniforms must lie in [0, 1), got {float(uniforms[bad][0])}")


def check_same_device(name: str, tensor: torch.Tensor, target: torch.Tensor) -> None:
    """Refuse ``tensor`` when it is not on the device of ``target_logits`` (``ValueError``)."""
    if tensor.device != target.device:
        raise ValueError(f"{name} is on {tensor.device} but target_logits is on {target.device}")


def check_logits_values(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_rows: torch.Tensor | None,
    draft_name: str,
) -> None:
    """The strict-mode value checks of :func:`specsample.verify` (synchronise).

    Target logits must hold no NaN and draft ids lie in the vocabulary; draft probabilities
    must be finite, non-negative and sum to 1 per row (as for the samplers), draft logits
    hold no NaN.
    """
    vocab = target_logits.shape[-1]
    check_not_nan("target_logits", target_logits)
    if draft_token_ids.numel() and bool(((draft_token_ids < 0) | (draft_token_ids >= vocab)).any()):
        raise ValueError(f"draft_token_ids must lie in [0, {vocab})")
    if draft_rows is None:
        return
    if draft_name == "draft_probs":
        check_prob_values(draft_name, draft_rows)
    else:
        check_not_nan(draft_name, draft_rows)


def check_not_nan(name: str, logits: torch.Tensor) -> None:
    """Strict-mode check of logits: refuse NaN (infinities are allowed; synchronises).

    Examples
    --------
    >>> check_not_nan("target_logits", torch.tensor([0.0, float("-inf"), float("nan")]))
    Traceback (most recent call last):
    ...
    ValueError: target_logits contains NaN
    """
    if bool(torch.isnan(logits).any()):
        raise ValueError(f"{name} contains NaN")
