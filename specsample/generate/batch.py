"""The active sequences of a call and the queue of prompts waiting for a place.

At most ``max_batch_size`` sequences are active. :class:`Batch` keeps their committed tokens,
budgets and sampling parameters, admits the next prompts of the queue as soon as places are
free (their prompts run through the models and join the caches), commits what a step emits,
and retires the sequences that finished, so the batch stays full until the queue is empty.
Its one host synchronisation per step (:meth:`Batch.synchronise`) decides termination. The
step itself (draft, score, verify) is :mod:`specsample.generate.loop`.
"""

from __future__ import annotations

import torch

from specsample.generate.config import Run
from specsample.generate.drafters import ModelDrafter
from specsample.generate.policy import DraftLengthPolicy
from specsample.generate.state import DecodeState, Prefill
from specsample.generate.stats import GenerationStats
from specsample.generate.tree import TreeLayout
from specsample.params.layout import BatchLayout


def _prefill(state: DecodeState) -> Prefill:
    """Every prompt but its last token, left-padded to a common width (read from ``state``)."""
    width = state.max_length - 1
    cols = torch.arange(width, device=state.tokens.device)
    index = cols - (width + 1 - state.lengths).unsqueeze(1)
    real = index >= 0
    index.clamp_(min=0)
    ids = state.tokens[:, :width].gather(1, index).masked_fill_(~real, 0)
    return Prefill(ids, real.to(torch.int64), index)


def _policy(run: Run) -> DraftLengthPolicy:
    """A draft-length policy that starts from what the runs given the same memory saw: the
    step timings of runs with the same models, drafter and threads, and the acceptance of
    first drafts of those that also drew the same way (greedy, or not)."""
    drafter = run.drafter
    if isinstance(drafter, ModelDrafter):
        source: object = (id(drafter.lm.model), drafter.lm.runs)
    else:
        source = type(drafter).__name__
    model = run.lm.model
    cost = run.memory.cost_model(model, (source, run.lm.runs, torch.get_num_threads()))
    history = run.memory.history(model, (source, run.sampling.all_greedy))
    return DraftLengthPolicy(run.k, 0, cost, history)


class Batch:
    """The active sequences, the queue of prompts waiting for a place, and the counters.

    Parameters
    ----------
    run : Run
        The call's configuration.
    prompts : list of list of int
        The prompts of the call.
    budgets : list of int
        Most tokens each prompt may generate.
    size : int
        Most sequences decoded at once.

    Attributes
    ----------
    method : str
        The rule of the chain steps: ``run.method`` (``"gumbel"`` or ``"chain"`` for a
        target-only run), or ``"chain"`` in a tree run (whose steps without room for a tree
        are plain decoding steps).
    tree : TreeLayout or None
        A tree run's node layout, with the draft layout its verification takes
        (:attr:`TreeLayout.draft`), built once.
    """

    def __init__(self, run: Run, prompts: list[list[int]], budgets: list[int], size: int) -> None:
        device = run.lm.device
        self.run = run
        self.prompts = prompts
        self.budgets = budgets
        self.size = size
        self.queue = 0
        self.capacity = max(len(p) + b for p, b in zip(prompts, budgets, strict=True)) + run.k + 2
        self.state = DecodeState(
            torch.zeros(0, self.capacity, dtype=torch.int64, device=device),
            torch.zeros(0, dtype=torch.int64, device=device),
            0,
            run.lm.vocab_size,
        )
        self.prompt_lengths = torch.zeros(0, dtype=torch.int64, device=device)
        self.budget = torch.zeros(0, dtype=torch.int64, device=device)
        self.rows: list[int] = []
        self.room: list[int] = []
        self.sampling = run.sampling.rows([])
        self.policy = _policy(run) if run.adaptive else None
        self.counts = torch.zeros(run.k + 1, dtype=torch.int64, device=device)
        self.offered = [0] * run.k
        self.method = run.method if run.tree is None else "chain"
        self.layouts: dict[tuple[int, int], BatchLayout] = {}
        self.tree = None if run.tree is None else TreeLayout.build(run.tree, device)
        self.steps = self.forwards = self.generated = self.finished = 0

    def admit(self) -> None:
        """Give the free places to the next prompts of the queue and prefill them.

        Every new prompt but its last token runs through the target and the drafter, and
        the new rows join the caches (which start afresh when the batch was empty).
        """
        free = min(self.size - len(self.rows), len(self.prompts) - self.queue)
        if free <= 0:
            return
        indices = list(range(self.queue, self.queue + free))
        self.queue += free
        device = self.state.tokens.device
        lengths = [len(self.prompts[i]) for i in indices]
        tokens = torch.zeros(free, self.capacity, dtype=torch.int64)
        for row, i in enumerate(indices):
            tokens[row, : lengths[row]] = torch.tensor(self.prompts[i], dtype=torch.int64)
        new = DecodeState(
            tokens.to(device),
            torch.tensor(lengths, device=device),
            max(lengths),
            self.state.vocab_size,
        )
        prefill = _prefill(new)
        fresh = not self.rows
        lm, drafter = self.run.lm, self.run.drafter
        if fresh:
            lm.reset(0)
        lm.join(prefill.input_ids, prefill.position_ids, prefill.attention_mask)
        state = self.state
        state.tokens = torch.cat([state.tokens, new.tokens])
        state.lengths = torch.cat([state.lengths, new.lengths])
        state.max_length = max(state.max_length if not fresh else 0, new.max_length)
        self.prompt_lengths = torch.cat([self.prompt_lengths, new.lengths])
        budgets = torch.tensor([self.budgets[i] for i in indices], dtype=torch.int64)
        self.budget = torch.cat([self.budget, budgets.to(device)])
        self.rows.extend(indices)
        self.sampling = self.run.sampling.rows(self.rows)
        if self.policy is not None:
            self.policy.acceptance.add(free)
            self.room.extend(self.budgets[i] for i in indices)
        if drafter is not None:
            (drafter.start if fresh else drafter.join)(prefill, state)

    def layout(self, drafts: int) -> BatchLayout:
        """The layout of ``drafts`` drafts for every active sequence (built once per shape)."""
        key = (self.state.batch, drafts)
        layout = self.layouts.get(key)
        if layout is None:
            layout = BatchLayout.build([drafts] * self.state.batch, self.state.tokens.device)
            self.layouts[key] = layout
        return layout

    def room_left(self) -> list[int]:
        """``[batch]`` tokens each sequence may emit this step: its budget left, and no more
        than the target's context leaves room for (compacting it first if need be)."""
        fits = max(0, self.run.lm.room(self.run.k + 1))
        return [min(left, fits) for left in self.room]

    def commit(
        self, new: torch.Tensor, emitted: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the emitted tokens up to EOS and the budget: ``[batch]`` taken, finished.

        ``new`` is ``[batch, slots]`` the step's tokens, ``emitted`` ``[batch]`` how many of
        them were emitted. ``valid`` (``[batch, slots]`` bool) says which of the step's
        target slots stay visible; by default those of the emitted prefix (a chain's
        accepted drafts).
        """
        state, eos = self.state, self.run.eos
        cols = torch.arange(new.shape[1], device=new.device)
        self.run.lm.set_tail_valid(cols < emitted.unsqueeze(1) if valid is None else valid)
        state.tokens.scatter_(1, state.lengths.unsqueeze(1) + cols, new.clamp(min=0))
        allowed = self.budget - (state.lengths - self.prompt_lengths)
        take = torch.minimum(emitted, allowed)
        finished = take == allowed
        if eos is not None:
            hit = torch.isin(new, eos) & (cols < emitted.unsqueeze(1))
            first = hit.to(torch.int64).argmax(dim=1) + 1
            stop = torch.where(hit.any(dim=1), first, cols.numel() + 1)
            finished |= stop <= take
            take = torch.minimum(take, stop)
        state.lengths = state.lengths + take
        self.counts.scatter_add_(0, emitted - 1, torch.ones_like(emitted))
        return take, finished

    def synchronise(
        self,
        take: torch.Tensor,
        finished: torch.Tensor,
        emitted: torch.Tensor,
        slots: int,
        kept: torch.Tensor | None = None,
    ) -> tuple[bool, list[int]]:
        """The step's one host transfer: update the counters; whether any sequence finished.

        Also returns each sequence's accepted drafts when the policy needs them, and drops
        the target's slots of the step (``slots`` of them) that no sequence kept: each
        sequence keeps its first ``kept [batch]`` (default: the ``emitted`` ones).
        """
        last = (emitted if kept is None else kept).max()
        summary = torch.stack(
            [finished.any().to(torch.int64), self.state.lengths.max(), take.sum(), last]
        )
        if self.policy is not None:
            left = self.budget - (self.state.lengths - self.prompt_lengths)
            summary = torch.cat([summary, emitted - 1, left])
        any_finished, longest, step_tokens, most, *rows = summary.tolist()
        accepted, self.room = rows[: len(rows) // 2], rows[len(rows) // 2 :]
        self.run.lm.drop_tail(slots - most)
        self.steps += 1
        self.forwards += len(self.rows)
        self.generated += step_tokens
        self.state.max_length = longest
        return bool(any_finished), accepted

    def retire(self, finished: torch.Tensor, results: list[list[int]]) -> None:
        """Store the outputs of the finished sequences (``[batch]`` bool) and drop them."""
        done = finished.nonzero().squeeze(1).tolist()
        ends = self.state.lengths.tolist()
        starts = self.prompt_lengths.tolist()
        tokens = self.state.tokens[finished]
        sequences = tokens.tolist()
        self.state.archive(tokens, self.state.lengths[finished], max(ends[row] for row in done))
        on_finish = self.run.callbacks.on_finish
        for position, row in enumerate(done):
            index = self.rows[row]
            results[index] = sequences[position][starts[row] : ends[row]]
            if on_finish is not None:
                on_finish(index, results[index])
        self.finished += len(done)
        gone = set(done)
        kept = [position for position in range(len(self.rows)) if position not in gone]
        self._keep(kept)

    def _keep(self, kept: list[int]) -> None:
        """Keep the active sequences at ``kept`` (host positions), in that order."""
        self.rows = [self.rows[position] for position in kept]
        index = torch.tensor(kept, dtype=torch.int64).to(self.state.tokens.device)
        self.state.select(index)
        self.prompt_lengths = self.prompt_lengths[index]
        self.budget = self.budget[index]
        if self.policy is not None:
            self.policy.acceptance.keep(kept)
            self.room = [self.room[position] for position in kept]
        if not kept:
            return
        self.run.lm.select(index)
        if self.run.drafter is not None:
            self.run.drafter.select(index)
        self.sampling = self.sampling.rows(kept)

    def stats(self, wall_time_s: float) -> GenerationStats:
        """The run's counters, ``wall_time_s`` seconds after it started."""
        run = self.run
        speculative = run.drafter is not None
        return GenerationStats(
            mode="speculative" if speculative else "target-only",
            drafter=run.drafter.name if run.drafter is not None else None,
            method=run.method if speculative else None,
            k=run.k,
            sequences=len(self.prompts),
            tokens=self.generated,
            wall_time_s=wall_time_s,
            steps=self.steps,
            sequence_forwards=self.forwards,
            accepted_counts=tuple(self.counts.tolist()) if speculative else (),
            offered_by_position=tuple(self.offered) if speculative else (),
        )
