"""The steps of the loop over a :class:`~specsample.generate.batch.Batch`, and the loop itself.

A step drafts ``m <= k`` tokens per active sequence (``m`` chosen by the draft-length policy
when adaptive), scores them with one target forward over ``m + 1`` slots, verifies them
(:mod:`specsample.generate.verifying`), commits the emitted tokens (masking the slots of
rejected drafts) and retires the sequences that finished. A tree step drafts a token tree
per sequence instead and scores every node in one forward. A step's only host
synchronisation is one small transfer deciding termination (plus the new tokens when
``on_tokens`` streams them, and, when an adaptive length is chosen for prompt-lookup
drafts, which sequences found a match).
"""

from __future__ import annotations

import torch

from specsample import timing
from specsample.generate import verifying
from specsample.generate.batch import Batch
from specsample.generate.config import TokenCallback
from specsample.generate.drafters import ModelDrafter
from specsample.generate.stats import GenerationInterrupted, GenerationStats
from specsample.generate.tree import TreeLayout


def _stream(
    on_tokens: TokenCallback, rows: list[int], take: torch.Tensor, new: torch.Tensor
) -> None:
    """Hand every sequence's new tokens (``take [batch]`` of ``new [batch, k + 1]``) over."""
    for row, values in zip(rows, torch.cat([take.unsqueeze(1), new], dim=1).tolist(), strict=True):
        if values[0]:
            on_tokens(row, values[1 : 1 + values[0]])


def _clock(batch: Batch) -> float:
    """Now, once the device is done (only when the policy times the steps)."""
    return timing.now(batch.state.tokens.device if batch.policy is not None else None)


def _propose(batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[batch, k]`` drafts and their ``[batch, k, vocab]`` distributions (or ``None``)."""
    drafter, state = batch.run.drafter, batch.state
    if drafter is None or not k:
        device = state.tokens.device
        return torch.zeros(state.batch, 0, dtype=torch.int64, device=device), None
    proposal = drafter.propose(state, k, batch.sampling)
    return proposal.token_ids, proposal.probs


def _propose_then_choose(batch: Batch) -> tuple[torch.Tensor, None, list[int]]:
    """A costless drafter's drafts, cut to the length the policy chooses knowing which
    sequences found some (one host transfer); and how many each really offers.

    Nothing is proposed when the policy would not draft even if every sequence had
    drafts (a plain step then costs no search).
    """
    policy, drafter, state = batch.policy, batch.run.drafter, batch.state
    if policy is None or drafter is None:
        raise RuntimeError("choosing a draft length needs a policy and a drafter")
    room = batch.room_left()
    if not policy.choose(room):
        return state.tokens.new_zeros(state.batch, 0), None, [0] * len(room)
    proposal = drafter.propose(state, max(room, default=1) - 1, batch.sampling)
    mask = proposal.drafting
    drafting = [True] * len(room) if mask is None else mask.tolist()
    asked = policy.refine(room, drafting)
    rows = zip(room, drafting, strict=True)
    offered = [min(asked, left - 1) if wants else 0 for left, wants in rows]
    return proposal.token_ids[:, :asked], None, offered


def _drafts(
    batch: Batch,
) -> tuple[int, torch.Tensor, torch.Tensor | None, list[int] | None]:
    """The step's drafts: how many were asked for, ``[batch, m]`` drafts, their
    distributions, and how many each sequence really offers (``None``: all ``m``)."""
    if batch.policy is None:
        wanted = 0 if batch.tree is not None else batch.run.k
        asked = max(0, batch.run.lm.room(wanted + 1) - 1)
        drafts, probs = _propose(batch, asked)
        return asked, drafts, probs, None
    if getattr(batch.run.drafter, "costless", False):
        drafts, probs, offered = _propose_then_choose(batch)
        return drafts.shape[1], drafts, probs, offered
    asked = batch.policy.choose(batch.room_left())
    drafts, probs = _propose(batch, asked)
    return asked, drafts, probs, None


def _score(batch: Batch, drafts: torch.Tensor) -> torch.Tensor:
    """``[batch, k + 1, vocab]`` target logits of the last committed token and the drafts."""
    state = batch.state
    inputs = torch.cat([state.last_tokens().unsqueeze(1), drafts], dim=1)
    cols = torch.arange(inputs.shape[1], device=inputs.device)
    positions = (state.lengths - 1).unsqueeze(1) + cols
    return batch.run.lm.forward(inputs, positions, keep=inputs.shape[1])


def _verify(
    batch: Batch, logits: torch.Tensor, drafts: torch.Tensor, probs: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[batch, k + 1]`` emitted tokens (then -1) and ``[batch]`` how many were emitted."""
    return verifying.chain_step(
        logits,
        drafts,
        probs,
        batch.sampling,
        batch.state.lengths,
        layout=batch.layout(drafts.shape[1]),
        method=batch.method,
    )


def step(batch: Batch, results: list[list[int]]) -> None:
    """Draft, score, verify and commit one step of every active sequence."""
    if batch.tree is not None and _tree_fits(batch, batch.tree):
        _tree_step(batch, batch.tree, results)
        return
    run = batch.run
    started = timing.now()
    asked, drafts, probs, offered = _drafts(batch)
    k = drafts.shape[1]
    drafted = started if offered is not None else _clock(batch)
    logits = _score(batch, drafts)
    new, emitted = _verify(batch, logits, drafts, probs)
    take, finished = batch.commit(new, emitted)
    any_finished, accepted = batch.synchronise(take, finished, emitted, new.shape[1])
    verified = timing.now()
    for j in range(k):
        batch.offered[j] += batch.state.batch
    if batch.policy is not None:
        batch.policy.record(k, accepted, verified - drafted, drafted - started, offered)
    if run.callbacks.on_tokens is not None:
        _stream(run.callbacks.on_tokens, batch.rows, take, new)
    if run.drafter is not None and asked:
        run.drafter.update(emitted - 1, batch.state)
    elif run.drafter is not None:
        run.drafter.skip(batch.state)
    if any_finished:
        batch.retire(finished, results)
    run.lm.maybe_compact(batch.state.max_length)


def _tree_fits(batch: Batch, layout: TreeLayout) -> bool:
    """Whether both models have room for a tree step within their contexts."""
    slots = int(layout.parents.shape[0])
    drafter = batch.run.drafter
    fits = isinstance(drafter, ModelDrafter) and drafter.room_for_tree(layout)
    return fits and batch.run.lm.room(slots) == slots


def _tree_step(batch: Batch, layout: TreeLayout, results: list[list[int]]) -> None:
    """Draft a tree per sequence, score every node in one forward, verify, commit."""
    run, state = batch.run, batch.state
    shape, drafter = run.tree, run.drafter
    if shape is None or not isinstance(drafter, ModelDrafter):
        raise RuntimeError("a tree step needs a tree shape and a draft model")
    proposal = drafter.propose_tree(state, shape, layout, batch.sampling)
    tokens = proposal.token_ids
    positions = (state.lengths - 1).unsqueeze(1) + layout.depth
    logits = run.lm.forward(tokens, positions, keep=0, visible=layout.visible)
    out = verifying.tree_step(
        logits,
        tokens,
        proposal.probs,
        batch.sampling,
        state.lengths,
        tree=layout.draft,
        method=run.method,
    )
    nodes = torch.arange(tokens.shape[1], device=tokens.device)
    on_path = (out.path.unsqueeze(2) == nodes).any(dim=1)
    take, finished = batch.commit(out.token_ids, out.num_emitted, valid=on_path)
    kept = out.path.max(dim=1).values + 1
    any_finished, _ = batch.synchronise(take, finished, out.num_emitted, tokens.shape[1], kept)
    for j in range(shape.depth):
        batch.offered[j] += state.batch
    if run.callbacks.on_tokens is not None:
        _stream(run.callbacks.on_tokens, batch.rows, take, out.token_ids)
    drafter.update_tree(out.path, state)
    if any_finished:
        batch.retire(finished, results)
    run.lm.maybe_compact(state.max_length)


def decode(batch: Batch, results: list[list[int]]) -> GenerationStats:
    """Decode every prompt of ``batch``'s queue; write each output into ``results``.

    Prompts enter in order; whenever sequences finish, the next prompts take their places
    before the next step (continuous batching).

    Parameters
    ----------
    batch : Batch
        The call's active sequences (none yet) and queue of prompts.
    results : list of list of int
        Where ``results[i]`` receives the tokens generated for prompt ``i``.

    Returns
    -------
    GenerationStats
        The run's counters.

    Raises
    ------
    GenerationInterrupted
        On Ctrl-C (a ``KeyboardInterrupt``), with the counters of the steps that ran.
    """
    watch = timing.Stopwatch()
    batch.admit()
    on_progress = batch.run.callbacks.on_progress
    try:
        while batch.rows:
            step(batch, results)
            batch.admit()
            if on_progress is not None:
                on_progress(batch.finished, len(batch.prompts), batch.generated)
    except KeyboardInterrupt as interrupt:
        raise GenerationInterrupted(batch.stats(watch.elapsed())) from interrupt
    return batch.stats(watch.elapsed())
