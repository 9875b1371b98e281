"""Draft from a toy pair, hand the drafts to a verifier and collect what it emits."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from specsample.params.checks import check_int
from specsample.testing.families import Family

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``verifier(target_probs, bonus_token_ids, draft_probs, draft_token_ids) -> token_ids``."""


class VerifierInputs(NamedTuple):
    """Inputs of one verification call, in the verifier's argument order.

    Attributes
    ----------
    target_probs : torch.Tensor
        ``[rows, k, vocab]`` float32 target rows ``q_j(. | x_{j-1})``.
    bonus_token_ids : torch.Tensor
        ``[rows, 1]`` int64 tokens drawn from ``q_k(. | x_{k-1})``.
    draft_probs : torch.Tensor
        ``[rows, k, vocab]`` float32 draft rows ``p_j(. | x_{j-1})``.
    draft_token_ids : torch.Tensor
        ``[rows, k]`` int64 drafts ``x_j ~ p_j(. | x_{j-1})``.
    """

    target_probs: torch.Tensor
    bonus_token_ids: torch.Tensor
    draft_probs: torch.Tensor
    draft_token_ids: torch.Tensor


class Simulation(NamedTuple):
    """What :func:`simulate` returns.

    Attributes
    ----------
    inputs : VerifierInputs
        What the verifier was given (on the CPU).
    token_ids : torch.Tensor
        ``[rows, k + 1]`` int64 output of the verifier (on the CPU).
    """

    inputs: VerifierInputs
    token_ids: torch.Tensor


DRAW_BLOCK_VALUES = 1 << 23
"""Probabilities per table drawn at once: rows are drafted in blocks of
``min(DRAW_BLOCK_ROWS, max(1, DRAW_BLOCK_VALUES // (k * vocab)))`` (at most 32 MiB of float32
per table), so the memory of :func:`specsample.testing.exactness_report` does not grow with
its number of rows."""

DRAW_BLOCK_ROWS = 1 << 17
"""Most rows drafted per block (their per-row temporaries are bounded too)."""


def _block_rows(family: Family) -> int:
    """Rows drafted per block for ``family`` (see :data:`DRAW_BLOCK_VALUES`)."""
    return min(DRAW_BLOCK_ROWS, max(1, DRAW_BLOCK_VALUES // (family.k * family.vocab)))


def _draw(rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(rows.to(torch.float64), 1, generator=generator).squeeze(-1)


def _draw_block(family: Family, rows: int, generator: torch.Generator) -> VerifierInputs:
    """``rows`` sequences drafted from ``family`` with ``generator`` (see :func:`draw_inputs`)."""
    k = family.k
    prev = torch.full((rows,), family.start, dtype=torch.int64)
    contexts = []
    drafts = []
    for j in range(k):
        contexts.append(prev)
        prev = _draw(family.draft[j][prev], generator)
        drafts.append(prev)
    bonus = _draw(family.target[k][prev], generator)
    context = torch.stack(contexts, dim=1)
    positions = torch.arange(k).expand(rows, k)
    return VerifierInputs(
        target_probs=family.target[positions, context].contiguous(),
        bonus_token_ids=bonus.unsqueeze(-1),
        draft_probs=family.draft[positions, context].contiguous(),
        draft_token_ids=torch.stack(drafts, dim=1),
    )


def _input_blocks(family: Family, rows: int, seed: int) -> Iterator[VerifierInputs]:
    """The inputs of ``rows`` sequences, one block at a time, from one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    size = _block_rows(family)
    for begin in range(0, rows, size):
        yield _draw_block(family, min(size, rows - begin), generator)


def draw_inputs(family: Family, rows: int, seed: int = 0) -> VerifierInputs:
    """Draft ``rows`` sequences autoregressively and gather what a verifier needs.

    Drafts follow ``x_j ~ p_j(. | x_{j-1})`` (``x_{-1}`` being the start token); the target
    rows are ``q_j(. | x_{j-1})`` for ``j < k``, and the bonus token is drawn from the target
    row after the last draft, ``q_k(. | x_{k-1})``. A private generator seeded by ``seed``
    is used, in blocks of rows (see :data:`DRAW_BLOCK_VALUES`); the global random state is left
    untouched.

    Parameters
    ----------
    family : Family
        The toy pair.
    rows : int
        Number of sequences (``>= 0``). The result takes ``8 * rows * k * vocab`` bytes.
    seed : int
        Seed of the draws.

    Returns
    -------
    VerifierInputs
        ``target_probs``/``draft_probs`` ``[rows, k, vocab]`` float32 (contiguous),
        ``bonus_token_ids [rows, 1]`` and ``draft_token_ids [rows, k]`` int64, on the CPU.

    Raises
    ------
    ValueError
        ``rows`` is negative.

    Examples
    --------
    >>> from specsample.testing import make_family
    >>> inputs = draw_inputs(make_family("random", k=3, vocab=5), rows=10)
    >>> tuple(inputs.target_probs.shape), tuple(inputs.bonus_token_ids.shape)
    ((10, 3, 5), (10, 1))
    """
    check_int("rows", rows, 0)
    return _concat(family, list(_input_blocks(family, rows, seed)))


def _concat(family: Family, blocks: list[VerifierInputs]) -> VerifierInputs:
    """The blocks' inputs end to end (empty tensors for no block)."""
    if not blocks:
        return _draw_block(family, 0, torch.Generator())
    if len(blocks) == 1:
        return blocks[0]
    return VerifierInputs(*(torch.cat(parts) for parts in zip(*blocks, strict=True)))


def derived_seed(seed: int, index: int = 1) -> int:
    """Seed number ``index`` derived from ``seed`` (a linear congruential mix), in ``[0, 2**63)``.

    The verifier of a simulation seeded by ``seed`` draws from ``derived_seed(seed)``; the
    drafts keep ``seed`` itself.

    Examples
    --------
    >>> derived_seed(1), derived_seed(1, index=0)
    (7806831264735756412, 6364136223846793005)
    """
    return (seed * 6364136223846793005 + index * 1442695040888963407) % (1 << 63)


def _forked_rng(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Save the global generators that calls on ``device`` use, restoring them on exit."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    index = device.index
    if index is None:
        index = getattr(torch, device.type).current_device()
    return torch.random.fork_rng(devices=[index], device_type=device.type)


def _checked_output(out: object, rows: int, k: int) -> torch.Tensor:
    """The verifier's output ``[rows, k + 1]`` as CPU int64, or a ``ValueError``."""
    expected = (rows, k + 1)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"verifier must return a tensor of shape {expected}, got {shape}")
    if out.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"verifier must return int64 token ids, got {out.dtype}")
    return out.to(device="cpu", dtype=torch.int64)


_BlockConsumer = Callable[[VerifierInputs, torch.Tensor], None]
"""``consume(inputs, token_ids)``: a block's inputs and the verifier's ``[rows, k + 1]`` output."""


def _run_blocks(
    verifier: Verifier,
    family: Family,
    rows: int,
    consume: _BlockConsumer,
    *,
    seed: int,
    batch_size: int,
    device: torch.device | str,
) -> None:
    """Draft ``rows`` sequences block by block, verify them, hand each block to ``consume``.

    The drafts are those of :func:`draw_inputs` (same seed, same blocks); the verifier is
    called on chunks of at most ``batch_size`` rows of a block, with its inputs on
    ``device``, while torch's global generators are seeded from ``seed`` (and restored
    afterwards). Memory holds one block at a time.
    """
    check_int("rows", rows, 0)
    check_int("batch_size", batch_size, 1)
    target_device = torch.device(device)
    with _forked_rng(target_device):
        torch.manual_seed(derived_seed(seed))
        for inputs in _input_blocks(family, rows, seed):
            outputs = []
            for begin in range(0, inputs.draft_token_ids.shape[0], batch_size):
                chunk = [t[begin : begin + batch_size].to(target_device) for t in inputs]
                out = verifier(*chunk)
                outputs.append(_checked_output(out, chunk[0].shape[0], family.k))
            consume(inputs, torch.cat(outputs))


def simulate(
    verifier: Verifier,
    family: Family,
    rows: int,
    *,
    seed: int = 0,
    batch_size: int = 8192,
    device: torch.device | str = "cpu",
) -> Simulation:
    """Run ``verifier`` on ``rows`` sequences drafted from ``family``.

    The verifier is called on consecutive chunks of ``batch_size`` rows, with its inputs on
    ``device``. Torch's global generators are seeded from ``seed`` for the duration of the
    calls and restored afterwards, so the result is reproducible and the caller's random
    state is untouched.

    Parameters
    ----------
    verifier : Verifier
        Any callable with the chain verifier's forward signature.
    family : Family
        The toy pair.
    rows : int
        Number of sequences. The inputs returned take ``8 * rows * k * vocab`` bytes;
        :func:`specsample.testing.exactness_report` keeps none of them.
    seed : int
        Seeds both the drafts (see :func:`draw_inputs`) and the verifier's randomness.
    batch_size : int
        Most rows per verifier call (``1`` calls the verifier row by row); a call never
        spans two blocks of drafted rows (see :data:`DRAW_BLOCK_VALUES`).
    device : torch.device or str
        Where the verifier's inputs are placed.

    Returns
    -------
    Simulation
        The inputs and the ``[rows, k + 1]`` int64 output, both on the CPU.

    Raises
    ------
    TypeError
        ``rows`` or ``batch_size`` is not an int.
    ValueError
        ``rows`` is negative, ``batch_size`` is below 1, or the verifier returned a tensor
        of the wrong shape or dtype.

    Examples
    --------
    >>> from specsample.sampler import RejectionSampler
    >>> from specsample.testing import make_family
    >>> simulation = simulate(RejectionSampler(), make_family("random", k=2), rows=5)
    >>> tuple(simulation.token_ids.shape)
    (5, 3)
    """
    blocks: list[VerifierInputs] = []
    outputs: list[torch.Tensor] = []

    def keep(inputs: VerifierInputs, token_ids: torch.Tensor) -> None:
        blocks.append(inputs)
        outputs.append(token_ids)

    _run_blocks(verifier, family, rows, keep, seed=seed, batch_size=batch_size, device=device)
    token_ids = torch.cat(outputs) if outputs else torch.empty(0, family.k + 1, dtype=torch.int64)
    return Simulation(_concat(family, blocks), token_ids)
