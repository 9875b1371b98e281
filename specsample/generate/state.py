"""What the decoding loop keeps per active sequence: committed tokens and sampling parameters.

:class:`DecodeState` holds the committed tokens; :class:`SamplingState` the sampling
parameters (on the host for :func:`specsample.verify`, on the device for the draft model's
processing) and where each sequence's random numbers come from
(:class:`specsample.random.Seeding`). :class:`Prefill` is the first forward of each model.

Draft randomness. A seeded sequence's draft samples read the counter stream
:attr:`specsample.random.Stream.DRAFT`. A step whose first draft sits at absolute position
``pos`` reads the stripe ``pos * DRAFT_STRIDE + j`` for its ``j``-th draft, ``j < k``. A
per-token counter (the draft for position ``t`` reading counter ``t``) would not do: a step
that accepts fewer than ``k - 1`` drafts redraws, in the next step, positions whose numbers
the previous step already used, and block verification looks at every draft of a step, so
its decision depends on those numbers. With the stripe, a sequence's position strictly
increases from step to step, so no counter is ever read twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specsample.metadata import GREEDY_BELOW, SamplingMetadata, Scalars
from specsample.probs import processed_probs
from specsample.random import STEP_STRIDE, Seeding, Stream, stripe
from specsample.seeding import check_seeds

DRAFT_STRIDE = STEP_STRIDE
"""Counters of :attr:`~specsample.random.Stream.DRAFT` a step may read per position, so at most
``DRAFT_STRIDE`` drafts per step (the verifier's own bound, ``STEP_STRIDE - 1``, is tighter)."""


FINISHED_KEPT = 16
"""Finished sequences a run keeps the tokens of (see :attr:`DecodeState.finished`)."""


@dataclass
class DecodeState:
    """The committed tokens of the active sequences, as the decoding loop keeps them.

    Attributes
    ----------
    tokens : torch.Tensor
        ``[batch, capacity]`` int64: sequence ``i`` holds its prompt and generated tokens in
        columns ``0 .. lengths[i] - 1``; later columns hold stale values.
    lengths : torch.Tensor
        ``[batch]`` int64 number of committed tokens (prompt included): the absolute position
        of the step's first draft.
    max_length : int
        Host-side upper bound of ``lengths``.
    vocab_size : int
        Width of the target's logits; every draft id must lie in ``[0, vocab_size)``.
    finished : torch.Tensor or None
        ``[f, capacity]`` int64 the tokens of the last (at most :data:`FINISHED_KEPT`)
        sequences of the run that finished, oldest first; ``None`` before the first one.
    finished_lengths : torch.Tensor or None
        ``[f]`` int64 their lengths.
    finished_width : int
        Host-side upper bound of ``finished_lengths``.

    Examples
    --------
    >>> state = DecodeState(torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([3, 2]), 3, 10)
    >>> state.batch, state.last_tokens().tolist()
    (2, [6, 8])
    >>> state.archive(state.tokens[1:], state.lengths[1:], 2); state.finished.tolist()
    [[7, 8, 0]]
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    max_length: int
    vocab_size: int
    finished: torch.Tensor | None = None
    finished_lengths: torch.Tensor | None = None
    finished_width: int = 0

    @property
    def batch(self) -> int:
        """Number of active sequences."""
        return int(self.tokens.shape[0])

    def last_tokens(self) -> torch.Tensor:
        """``[batch]`` int64 the last committed token of every sequence."""
        return self.tokens.gather(1, (self.lengths - 1).unsqueeze(1)).squeeze(1)

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences at ``index`` (``[kept]`` int64), in that order."""
        self.tokens = self.tokens[index]
        self.lengths = self.lengths[index]

    def archive(self, tokens: torch.Tensor, lengths: torch.Tensor, longest: int) -> None:
        """Keep the ``tokens [f, capacity]`` and ``lengths [f]`` of sequences that finished.

        ``longest`` is a host-side upper bound of ``lengths``. Only the last
        :data:`FINISHED_KEPT` finished sequences are kept.
        """
        if self.finished is not None and self.finished_lengths is not None:
            tokens = torch.cat([self.finished, tokens])
            lengths = torch.cat([self.finished_lengths, lengths])
        self.finished, self.finished_lengths = tokens[-FINISHED_KEPT:], lengths[-FINISHED_KEPT:]
        self.finished_width = max(self.finished_width, longest)


class Prefill(NamedTuple):
    """The prompts without their last token, left-padded, for the first forward of each model.

    Attributes
    ----------
    input_ids, attention_mask, position_ids : torch.Tensor
        ``[batch, width]`` int64; ``width`` may be 0 (every prompt has one token).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor


class SamplingValues(NamedTuple):
    """Per-sequence sampling parameters, each a ``[batch]`` tensor (0, 1 and 0 switch off).

    Attributes
    ----------
    temperature : torch.Tensor
        float32, ``>= 0`` (0: greedy).
    top_k : torch.Tensor
        int64, ``>= 0``.
    top_p, min_p : torch.Tensor
        float32, in ``(0, 1]`` and ``[0, 1]``.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor


_OFF = {"top_k": 0.0, "top_p": 1.0, "min_p": 0.0}


def _host_values(
    batch: int, temperature: Scalars, top_k: Scalars, top_p: Scalars, min_p: Scalars
) -> SamplingValues:
    """Validate scalars, sequences or tensors and expand them to ``[batch]`` CPU tensors."""
    given = [
        v.detach().cpu() if isinstance(v, torch.Tensor) else v
        for v in (temperature, top_k, top_p, min_p)
    ]
    cpu = torch.device("cpu")
    SamplingMetadata.build(
        batch, cpu, temperature=given[0], top_k=given[1], top_p=given[2], min_p=given[3]
    )
    defaults = (1.0, *_OFF.values())
    dtypes = (torch.float32, torch.int64, torch.float32, torch.float32)
    return SamplingValues(
        *(
            torch.as_tensor(d if v is None else v, dtype=t).expand(batch).clone()
            for v, d, t in zip(given, defaults, dtypes, strict=True)
        )
    )


class SamplingState:
    """Per-sequence sampling parameters and random sources of the active sequences.

    Build it with :meth:`build`. The processing is that of :mod:`specsample.probs`
    (temperature, top-k, top-p, min-p; temperature 0 is greedy).

    Parameters
    ----------
    values : SamplingValues
        ``[batch]`` CPU tensors (already validated).
    seeds : list of (int or None), optional
        Per-sequence seeds, ``None``: unseeded.
    generator : torch.Generator, optional
        Randomness of unseeded sequences (torch's default generator when ``None``).
    device : torch.device
        Where the batch lives.

    Attributes
    ----------
    values : SamplingValues
        The parameters on the host (what :func:`specsample.verify` receives).
    all_greedy : bool
        Every sequence decodes greedily (no distribution and no random number is needed).
    seeding : specsample.random.Seeding
        Where each sequence's random numbers come from.
    metadata : specsample.metadata.SamplingMetadata
        The parameters as the verification pipeline takes them, built once for the batch.

    Examples
    --------
    >>> s = SamplingState.build(2, torch.device("cpu"), temperature=[0.0, 0.5], seeds=[3, None])
    >>> s.all_greedy, s.values.temperature.tolist(), s.seeding.seeds.tolist()
    (False, [0.0, 0.5], [3, -1])
    """

    def __init__(
        self,
        values: SamplingValues,
        seeds: list[int | None] | None,
        generator: torch.Generator | None,
        device: torch.device,
    ) -> None:
        self.values = values
        self.seeds = seeds
        self.generator = generator
        self.device = device
        greedy = values.temperature < GREEDY_BELOW
        self.all_greedy = bool(greedy.all())
        self.seeding = Seeding.build(self.batch, device, seeds=seeds, generator=generator)
        self.metadata = SamplingMetadata.build(
            self.batch,
            device,
            temperature=values.temperature,
            top_k=values.top_k,
            top_p=values.top_p,
            min_p=values.min_p,
        )
        self._expanded: dict[int, SamplingMetadata] = {}

    @staticmethod
    def build(
        batch: int,
        device: torch.device,
        *,
        temperature: Scalars = 0.0,
        top_k: Scalars = None,
        top_p: Scalars = None,
        min_p: Scalars = None,
        seeds: Sequence[int | None] | None = None,
        generator: torch.Generator | None = None,
    ) -> SamplingState:
        """Validate the parameters (scalars or one value per sequence) and build the state.

        Raises
        ------
        ValueError, TypeError
            Naming the parameter that is out of range or of the wrong type or length.
        """
        values = _host_values(batch, temperature, top_k, top_p, min_p)
        seed_list = check_seeds(seeds, batch)
        if isinstance(seed_list, torch.Tensor):
            raise TypeError("seeds must be a sequence of int or None")
        return SamplingState(values, seed_list, generator, device)

    @property
    def batch(self) -> int:
        """Number of active sequences."""
        return int(self.values.temperature.shape[0])

    def draft_uniforms(self, positions: torch.Tensor, k: int) -> torch.Tensor:
        """``[batch, k]`` float64 uniforms of a step's draft samples.

        Parameters
        ----------
        positions : torch.Tensor
            ``[batch]`` int64 absolute position of each sequence's first draft.
        k : int
            Drafts per sequence, ``<= DRAFT_STRIDE``.

        Seeded sequences read the stripe of ``positions`` in the
        :attr:`~specsample.random.Stream.DRAFT` stream (see the module docstring), the others
        their generator.

        Examples
        --------
        >>> s = SamplingState.build(2, torch.device("cpu"), temperature=1.0, seeds=[4, 4])
        >>> u = s.draft_uniforms(torch.tensor([7, 7]), 3)
        >>> u.shape, bool(torch.equal(u[0], u[1]))
        (torch.Size([2, 3]), True)
        """
        counters = stripe(positions, self.batch, k, DRAFT_STRIDE, self.device)
        return self.seeding.draw(self.device, [(Stream.DRAFT, counters)])

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's processed distribution, as :func:`specsample.verify` processes the target.

        Parameters
        ----------
        logits : torch.Tensor
            ``[batch, vocab]`` or ``[batch, slots, vocab]``: one or several rows per sequence,
            each processed with its sequence's parameters.

        Returns
        -------
        torch.Tensor
            float32 probabilities of the shape of ``logits``; greedy rows are the one-hot
            distribution of their argmax.

        Examples
        --------
        >>> s = SamplingState.build(2, torch.device("cpu"), temperature=[1.0, 0.0], top_k=1)
        >>> s.probs(torch.tensor([[0.0, 1.0], [3.0, 1.0]])).tolist()
        [[0.0, 1.0], [1.0, 0.0]]
        """
        slots = math.prod(logits.shape[1:-1])
        metadata = self._expanded.get(slots)
        if metadata is None:
            index = torch.arange(self.batch, device=self.device).repeat_interleave(slots)
            metadata = self._expanded[slots] = self.metadata.rows(index)
        rows = logits.reshape(-1, logits.shape[-1])
        return processed_probs(rows, metadata).reshape(logits.shape)

    def rows(self, rows: Sequence[int]) -> SamplingState:
        """The state of the sequences at ``rows`` (host indices), in that order."""
        index = torch.tensor(list(rows), dtype=torch.int64)
        values = SamplingValues(*(value[index] for value in self.values))
        seeds = None if self.seeds is None else [self.seeds[i] for i in rows]
        return SamplingState(values, seeds, self.generator, self.device)
