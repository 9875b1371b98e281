"""Validation of what :func:`~specsample.generate.speculative_generate` is given.

Each function checks one argument and returns it in the form the loop uses, raising a
``TypeError`` or ``ValueError`` that names the argument.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specsample.params.checks import check_int

MAX_NEW_TOKENS = 1 << 20
"""Most tokens one call may generate per prompt (the committed tokens of a batch are kept in
one ``[batch, prompt + max_new_tokens + k]`` int64 buffer)."""


def prompt_list(prompts: object) -> list[list[int]]:
    """The prompts as lists of token ids (from a ``[batch, length]`` tensor or a sequence).

    Examples
    --------
    >>> prompt_list(torch.tensor([[1, 2], [3, 4]]))
    [[1, 2], [3, 4]]
    """
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2 or prompts.dtype.is_floating_point:
            raise ValueError(
                "prompts must be a 2-D integer tensor [batch, length] or a sequence of token-id "
                f"lists, got a tensor of shape {tuple(prompts.shape)} and dtype {prompts.dtype}"
            )
        return [[int(t) for t in row] for row in prompts.tolist()]
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(
            "prompts must be a sequence of token-id lists or a tensor, "
            f"got {type(prompts).__name__}"
        )
    result = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise TypeError(
                f"prompts[{i}] must be a sequence of token ids, got {type(prompt).__name__}"
            )
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise TypeError(f"prompts[{i}] must hold int token ids")
        result.append(list(prompt))
    if not result:
        raise ValueError("prompts must hold at least one prompt")
    return result


def eos_ids(eos_token_id: int | Sequence[int] | None) -> list[int]:
    """The end-of-sequence ids as a list (empty: no EOS).

    Examples
    --------
    >>> eos_ids(2), eos_ids([2, 3]), eos_ids(None)
    ([2], [2, 3], [])
    """
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool):
        return [eos_token_id]
    if isinstance(eos_token_id, Sequence) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in eos_token_id
    ):
        return list(eos_token_id)
    raise TypeError(
        f"eos_token_id must be an int, a sequence of ints or None, got {eos_token_id!r}"
    )


def seed_list(seed: int, count: int) -> list[int]:
    """The seeds of ``count`` prompts from one int: prompt ``i`` gets ``seed + i``.

    Examples
    --------
    >>> seed_list(5, 3)
    [5, 6, 7]
    """
    if seed < 0:
        raise ValueError(f"seeds must be non-negative, got {seed}")
    return [seed + i for i in range(count)]


def _new_token_limits(max_new_tokens: int | Sequence[int], count: int) -> list[int]:
    """One ``max_new_tokens`` per prompt, each checked."""
    if isinstance(max_new_tokens, Sequence) and not isinstance(max_new_tokens, (str, bytes)):
        if len(max_new_tokens) != count:
            raise ValueError(
                f"max_new_tokens must be one int or one per prompt ({count}), "
                f"got {len(max_new_tokens)}"
            )
        return [
            check_int(f"max_new_tokens[{i}]", value, 1, MAX_NEW_TOKENS)
            for i, value in enumerate(max_new_tokens)
        ]
    return [check_int("max_new_tokens", max_new_tokens, 1, MAX_NEW_TOKENS)] * count


def token_budgets(
    prompts: list[list[int]],
    max_new_tokens: int | Sequence[int],
    vocab_size: int,
    context: int | None,
) -> list[int]:
    """Tokens each prompt may generate: ``max_new_tokens``, or fewer where the context ends.

    ``max_new_tokens`` is one int or one per prompt.

    Raises
    ------
    ValueError
        A ``max_new_tokens`` outside ``[1, MAX_NEW_TOKENS]``, or not one per prompt; a prompt
        is empty, holds ids outside ``[0, vocab_size)`` or fills the context.

    Examples
    --------
    >>> token_budgets([[1, 2], [3]], 8, 10, 6), token_budgets([[1], [2]], [3, 9], 10, 6)
    ([4, 5], [3, 5])
    """
    limits = _new_token_limits(max_new_tokens, len(prompts))
    budgets = []
    for i, (prompt, max_new) in enumerate(zip(prompts, limits, strict=True)):
        if not prompt:
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompts[{i}] holds token ids outside [0, {vocab_size})")
        if context is None:
            budgets.append(max_new)
            continue
        if len(prompt) >= context:
            raise ValueError(
                f"prompts[{i}] has {len(prompt)} tokens but the target's context is {context} "
                "positions: nothing can be generated"
            )
        budgets.append(min(max_new, context - len(prompt)))
    return budgets
