"""The prompts of a call decoded with continuous batching: the steps of the loop (see :mod:`.loop`).

At most ``max_batch_size`` sequences are active. A step drafts ``m <= k`` tokens per active
sequence, scores them with one target forward over ``m + 1`` slots, verifies them, appends
the emitted tokens (masking the slots of rejected drafts), and retires the sequences that
finished; the next prompts of the queue then take their places at once (their prompts run
through the models and join the caches), so the batch stays full until the queue is empty.
A step's only host synchronisation is one small transfer deciding termination (plus the new
tokens when ``on_tokens`` streams them, and, when an adaptive length is chosen for
prompt-lookup drafts, which sequences found a match).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import torch

from specsample import backends, pipeline
from specsample.generate.drafters import Drafter, ModelDrafter
from specsample.generate.hf import CachedLM
from specsample.generate.policy import DraftLengthPolicy, remembered_costs, remembered_history
from specsample.generate.state import DecodeState, Prefill, SamplingState
from specsample.generate.stats import GenerationStats
from specsample.generate.tree import TreeLayout, TreeShape
from specsample.metadata import BatchLayout
from specsample.rules.tree import (
    Drafting,
    TreeMethod,
    traversal_verify,
    tree_verify,
    tree_verify_greedy,
)
from specsample.rules.typical import typical_acceptance

TokenCallback = Callable[[int, list[int]], None]
"""``on_tokens(sequence_index, new_token_ids)``, called every step a sequence grows."""

ProgressCallback = Callable[[int, int, int], None]
"""``on_progress(finished_sequences, total_sequences, tokens_generated)``, every step."""

FinishCallback = Callable[[int, list[int]], None]
"""``on_finish(sequence_index, generated_token_ids)``, once per sequence, as it finishes."""


class Run:
    """One call's fixed configuration: models, rule, prompts, limits and callbacks.

    Parameters
    ----------
    lm : CachedLM
        The target.
    drafter : Drafter or None
        ``None``: target-only decoding (``k`` is then 0).
    k : int
        Drafts per step (the most, with ``adaptive``).
    method : str
        Verification rule (a name of :func:`specsample.methods.chain_methods`).
    sampling : SamplingState
        The parameters of every prompt of the call.
    eos : list of int
        End-of-sequence ids.
    on_tokens, on_progress, on_finish : callable or None
        The callbacks.
    adaptive : bool
        Choose each step's draft length in ``0..k`` (:mod:`.policy`); otherwise always ``k``.
    tree : TreeShape or None
        Draft a token tree of this shape every step (the drafter must be a
        :class:`~specsample.generate.drafters.ModelDrafter`; ``method`` is then a tree rule,
        ``k`` the tree's depth).
    """

    def __init__(
        self,
        lm: CachedLM,
        drafter: Drafter | None,
        k: int,
        method: str,
        sampling: SamplingState,
        eos: list[int],
        on_tokens: TokenCallback | None,
        on_progress: ProgressCallback | None,
        adaptive: bool = False,
        on_finish: FinishCallback | None = None,
        tree: TreeShape | None = None,
    ) -> None:
        self.lm = lm
        self.tree = tree
        self.adaptive = adaptive and drafter is not None and k > 0 and tree is None
        self.drafter = drafter
        self.k = k
        self.method = method
        self.sampling = sampling
        self.eos = torch.tensor(eos, dtype=torch.int64, device=lm.device) if eos else None
        self.on_tokens = on_tokens
        self.on_progress = on_progress
        self.on_finish = on_finish


def _prefill(state: DecodeState) -> Prefill:
    """Every prompt but its last token, left-padded to a common width (read from ``state``)."""
    width = state.max_length - 1
    cols = torch.arange(width, device=state.tokens.device)
    index = cols - (width + 1 - state.lengths).unsqueeze(1)
    real = index >= 0
    index.clamp_(min=0)
    ids = state.tokens[:, :width].gather(1, index).masked_fill_(~real, 0)
    return Prefill(ids, real.to(torch.int64), index)


def _typical(
    logits: torch.Tensor, drafts: torch.Tensor, sampling: SamplingState
) -> tuple[torch.Tensor, torch.Tensor]:
    """Typical acceptance of one step (LOSSY): ``[batch, k + 1]`` tokens, ``[batch]`` emitted.

    ``logits`` is ``[batch, k + 1, vocab]``. The target rows get the requests' processing
    first (greedy rows become one-hot, so a greedy request accepts exactly the drafts equal to
    the target argmax).
    """
    out = typical_acceptance(sampling.probs(logits), drafts)
    return out.token_ids, out.num_accepted + 1


def _policy(run: Run) -> DraftLengthPolicy:
    """A draft-length policy that starts from what earlier runs in this process saw: the
    step timings of runs with the same models, drafter and threads, and the acceptance of
    first drafts of those that also drew the same way (greedy, or not)."""
    drafter = run.drafter
    if isinstance(drafter, ModelDrafter):
        source: object = (id(drafter.lm.model), drafter.lm.runs)
    else:
        source = type(drafter).__name__
    model = run.lm.model
    cost = remembered_costs(model, (source, run.lm.runs, torch.get_num_threads()))
    history = remembered_history(model, (source, run.sampling.all_greedy))
    return DraftLengthPolicy(run.k, 0, cost, history)


def _stream(
    on_tokens: TokenCallback, rows: list[int], take: torch.Tensor, new: torch.Tensor
) -> None:
    """Hand every sequence's new tokens (``take [batch]`` of ``new [batch, k + 1]``) over."""
    for row, values in zip(rows, torch.cat([take.unsqueeze(1), new], dim=1).tolist(), strict=True):
        if values[0]:
            on_tokens(row, values[1 : 1 + values[0]])


class _Batch:
    """The active sequences, the queue of prompts waiting for a place, and the counters."""

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
        self.method = run.method if run.k else "chain"
        self.backend = backends.resolve("auto", self.state.tokens)
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

    def step(self, results: list[list[int]]) -> None:
        """Draft, score, verify and commit one step of every active sequence."""
        if self.tree is not None and self._tree_fits(self.tree):
            self._tree_step(self.tree, results)
            return
        started = time.perf_counter()
        if self.policy is None:
            asked = 0 if self.tree is not None else self.run.k
            asked = max(0, self.run.lm.room(asked + 1) - 1)
            drafts, probs = self._propose(asked)
            offered = None
        elif getattr(self.run.drafter, "costless", False):
            drafts, probs, offered = self._propose_then_choose()
            asked = drafts.shape[1]
        else:
            asked = self.policy.choose(self._room())
            drafts, probs = self._propose(asked)
            offered = None
        k = drafts.shape[1]
        drafted = started if offered is not None else self._clock()
        logits = self._score(drafts)
        new, emitted = self._verify(logits, drafts, probs)
        take, finished = self._commit(new, emitted)
        any_finished, accepted = self._synchronise(take, finished, emitted, new.shape[1])
        verified = time.perf_counter()
        for j in range(k):
            self.offered[j] += self.state.batch
        if self.policy is not None:
            self.policy.record(k, accepted, verified - drafted, drafted - started, offered)
        if self.run.on_tokens is not None:
            _stream(self.run.on_tokens, self.rows, take, new)
        if self.run.drafter is not None and asked:
            self.run.drafter.update(emitted - 1, self.state)
        elif self.run.drafter is not None:
            self.run.drafter.skip(self.state)
        if any_finished:
            self._retire(finished, results)
        self.run.lm.maybe_compact(self.state.max_length)

    def _tree_fits(self, layout: TreeLayout) -> bool:
        """Whether both models have room for a tree step within their contexts."""
        slots = int(layout.parents.shape[0])
        drafter = self.run.drafter
        fits = isinstance(drafter, ModelDrafter) and drafter.room_for_tree(layout)
        return fits and self.run.lm.room(slots) == slots

    def _tree_step(self, layout: TreeLayout, results: list[list[int]]) -> None:
        """Draft a tree per sequence, score every node in one forward, verify, commit."""
        shape, drafter, state = self.run.tree, self.run.drafter, self.state
        if shape is None or not isinstance(drafter, ModelDrafter):
            raise RuntimeError("a tree step needs a tree shape and a draft model")
        proposal = drafter.propose_tree(state, shape, layout, self.sampling)
        tokens = proposal.token_ids
        positions = (state.lengths - 1).unsqueeze(1) + layout.depth
        logits = self.run.lm.forward(tokens, positions, keep=0, visible=layout.visible)
        depth, width = shape.depth, max(shape.branching)
        if self.sampling.all_greedy:
            out = tree_verify_greedy(
                logits, tokens, layout.parents, max_depth=depth, max_children=width
            )
        else:
            seeding = self.sampling.seeding
            common: dict[str, Any] = {
                "drafting": cast(Drafting, shape.drafting),
                "max_depth": depth,
                "max_children": width,
                "seeds": self.sampling.seeds,
                "generator": seeding.generator,
                "positions": state.lengths,
            }
            probs = self.sampling.probs(logits)
            if self.method == "traversal" and proposal.probs is not None:
                out = traversal_verify(
                    probs, tokens, layout.parents, draft_probs=proposal.probs, **common
                )
            else:
                method = cast(TreeMethod, self.method)
                out = tree_verify(
                    probs,
                    tokens,
                    layout.parents,
                    draft_probs=proposal.probs,
                    method=method,
                    **common,
                )
        nodes = torch.arange(tokens.shape[1], device=tokens.device)
        on_path = (out.path.unsqueeze(2) == nodes).any(dim=1)
        take, finished = self._commit(out.token_ids, out.num_emitted, valid=on_path)
        kept = out.path.max(dim=1).values + 1
        any_finished, _ = self._synchronise(take, finished, out.num_emitted, tokens.shape[1], kept)
        for j in range(shape.depth):
            self.offered[j] += state.batch
        if self.run.on_tokens is not None:
            _stream(self.run.on_tokens, self.rows, take, out.token_ids)
        drafter.update_tree(out.path, state)
        if any_finished:
            self._retire(finished, results)
        self.run.lm.maybe_compact(state.max_length)

    def _room(self) -> list[int]:
        """``[batch]`` tokens each sequence may emit this step: its budget left, and no more
        than the target's context leaves room for (compacting it first if need be)."""
        fits = max(0, self.run.lm.room(self.run.k + 1))
        return [min(left, fits) for left in self.room]

    def _propose_then_choose(self) -> tuple[torch.Tensor, None, list[int]]:
        """A costless drafter's drafts, cut to the length the policy chooses knowing which
        sequences found some (one host transfer); and how many each really offers.

        Nothing is proposed when the policy would not draft even if every sequence had
        drafts (a plain step then costs no search).
        """
        policy, drafter = self.policy, self.run.drafter
        if policy is None or drafter is None:
            raise RuntimeError("choosing a draft length needs a policy and a drafter")
        room = self._room()
        if not policy.choose(room):
            return self.state.tokens.new_zeros(self.state.batch, 0), None, [0] * len(room)
        proposal = drafter.propose(self.state, max(room, default=1) - 1, self.sampling)
        mask = proposal.drafting
        drafting = [True] * len(room) if mask is None else mask.tolist()
        asked = policy.refine(room, drafting)
        rows = zip(room, drafting, strict=True)
        offered = [min(asked, left - 1) if wants else 0 for left, wants in rows]
        return proposal.token_ids[:, :asked], None, offered

    def _clock(self) -> float:
        """Now, once the device is done (only when the policy times the steps)."""
        device = self.state.tokens.device
        if self.policy is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def _propose(self, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[batch, k]`` drafts and their ``[batch, k, vocab]`` distributions (or ``None``)."""
        drafter = self.run.drafter
        if drafter is None or not k:
            device = self.state.tokens.device
            return torch.zeros(self.state.batch, 0, dtype=torch.int64, device=device), None
        may_stop = self.policy is not None and self.method == "chain"
        proposal = drafter.propose(self.state, k, self.sampling, may_stop)
        return proposal.token_ids, proposal.probs

    def _score(self, drafts: torch.Tensor) -> torch.Tensor:
        """``[batch, k + 1, vocab]`` target logits of the last committed token and the drafts."""
        state = self.state
        inputs = torch.cat([state.last_tokens().unsqueeze(1), drafts], dim=1)
        cols = torch.arange(inputs.shape[1], device=inputs.device)
        positions = (state.lengths - 1).unsqueeze(1) + cols
        return self.run.lm.forward(inputs, positions, keep=inputs.shape[1])

    def _verify(
        self, logits: torch.Tensor, drafts: torch.Tensor, probs: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[batch, k + 1]`` emitted tokens (then -1) and ``[batch]`` how many were emitted.

        The step runs the pipeline of :func:`specsample.verify` on parameters and a layout
        that were validated once for the batch. Randomness is keyed by each sequence's seed
        and absolute position (its length).
        """
        if self.method == "typical":
            return _typical(logits, drafts, self.sampling)
        size, slots, vocab = logits.shape
        key = (size, slots - 1)
        layout = self.layouts.get(key)
        if layout is None:
            layout = BatchLayout.build([slots - 1] * size, logits.device)
            self.layouts[key] = layout
        flat = logits.reshape(size * slots, vocab)
        sampling = self.sampling
        plan = pipeline.plan_logits(
            flat, layout, sampling.metadata, sampling.seeding, positions=self.state.lengths
        )
        token_ids, accepted = pipeline.run_logits(
            flat,
            drafts.reshape(-1),
            plan,
            backend=self.backend,
            method=self.method,
            draft_probs=None if probs is None else probs.reshape(size * (slots - 1), vocab),
        )
        return token_ids, accepted + 1

    def _commit(
        self, new: torch.Tensor, emitted: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the emitted tokens up to EOS and the budget: ``[batch]`` taken, finished.

        ``valid`` (``[batch, slots]`` bool) says which of the step's target slots stay
        visible; by default those of the emitted prefix (a chain's accepted drafts).
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

    def _synchronise(
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

    def _retire(self, finished: torch.Tensor, results: list[list[int]]) -> None:
        """Store the outputs of the finished sequences (``[batch]`` bool) and drop them."""
        done = finished.nonzero().squeeze(1).tolist()
        ends = self.state.lengths.tolist()
        starts = self.prompt_lengths.tolist()
        tokens = self.state.tokens[finished]
        sequences = tokens.tolist()
        self.state.archive(tokens, self.state.lengths[finished], max(ends[row] for row in done))
        for position, row in enumerate(done):
            index = self.rows[row]
            results[index] = sequences[position][starts[row] : ends[row]]
            if self.run.on_finish is not None:
                self.run.on_finish(index, results[index])
        self.finished += len(done)
        gone = set(done)
        kept = [position for position in range(len(self.rows)) if position not in gone]
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
        """The run's counters."""
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


def decode(
    run: Run,
    prompts: list[list[int]],
    budgets: list[int],
    max_batch_size: int,
    results: list[list[int]],
) -> GenerationStats:
    """Decode every prompt, ``max_batch_size`` at a time; write each output into ``results``.

    Prompts enter in order; whenever sequences finish, the next prompts take their places
    before the next step (continuous batching).

    Parameters
    ----------
    run : Run
        The call's configuration.
    prompts : list of list of int
        The prompts of the call.
    budgets : list of int
        Most tokens each prompt may generate.
    max_batch_size : int
        Most sequences decoded at once.
    results : list of list of int
        Where ``results[i]`` receives the tokens generated for prompt ``i``.

    Returns
    -------
    GenerationStats
        The run's counters.
    """
    batch = _Batch(run, prompts, budgets, max_batch_size)
    start = time.perf_counter()
    batch.admit()
    while batch.rows:
        batch.step(results)
        batch.admit()
        if run.on_progress is not None:
            run.on_progress(batch.finished, len(prompts), batch.generated)
    return batch.stats(time.perf_counter() - start)
