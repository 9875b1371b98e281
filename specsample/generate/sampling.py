"""The sampling parameters of the active sequences: validated once per call, selected by row.

:class:`SamplingState` holds what the requests of the active sequences ask
(:class:`specsample.params.Requests`: the validated
:class:`~specsample.params.metadata.SamplingMetadata` and
:class:`~specsample.params.seeding.Seeding`), the processing of the draft model's distributions
and the draft randomness. :meth:`SamplingState.build` validates a call's
:class:`~specsample.params.SamplingParams` once; :meth:`SamplingState.rows` selects the
sequences a batch holds as they join and leave, without validating the parameters again.

Draft randomness. A seeded sequence's draft samples read the counter stream
:attr:`specsample.random.Stream.DRAFT`. A step whose first draft sits at absolute position
``pos`` reads the stripe ``pos * DRAFT_STRIDE + j`` for its ``j``-th draft, ``j < k``. A
per-token counter (the draft for position ``t`` reading counter ``t``) would not do: a step
that accepts fewer than ``k - 1`` drafts redraws, in the next step, positions whose numbers
the previous step already used, and block verification looks at every draft of a step, so
its decision depends on those numbers. With the stripe, a sequence's position strictly
increases from step to step, so no counter is ever read twice.

Keyed runs. A state built with ``keyed=True`` (``method="gumbel"``, and seeded target-only
decoding) samples every token as the keyed Gumbel-max of :mod:`specsample.noise`, the draft
model's proposals included (:meth:`SamplingState.gumbel_tokens`): a sequence without a seed
gets one drawn from its generator (or the shared one) when the state is built, so its target
and draft noise are keyed alike too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from specsample.api import verify
from specsample.params import Requests, SamplingParams
from specsample.params.layout import BatchLayout
from specsample.params.metadata import SamplingMetadata, Scalars
from specsample.params.seeding import Seeding, check_seeds, seeding_from
from specsample.probs import processed_probs
from specsample.random import STEP_STRIDE, Stream
from specsample.uniforms import stripe

DRAFT_STRIDE = STEP_STRIDE
"""Counters of :attr:`~specsample.random.Stream.DRAFT` a step may read per position, so at most
``DRAFT_STRIDE`` drafts per step (the verifier's own bound, ``STEP_STRIDE - 1``, is tighter)."""

_CPU = torch.device("cpu")


def _on_host(value: Scalars) -> Scalars:
    """A tensor parameter on the host (its values are then validated); others as given."""
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _moved(metadata: SamplingMetadata, device: torch.device) -> SamplingMetadata:
    """``metadata``'s tensors on ``device`` (its host hints as they are)."""

    def to(value: torch.Tensor | None) -> torch.Tensor | None:
        return None if value is None else value.to(device, non_blocking=True)

    return replace(
        metadata,
        inv_temperature=metadata.inv_temperature.to(device, non_blocking=True),
        greedy=metadata.greedy.to(device, non_blocking=True),
        top_k=to(metadata.top_k),
        top_p=to(metadata.top_p),
        min_p=to(metadata.min_p),
    )


def _narrowed(host: SamplingMetadata) -> SamplingMetadata:
    """Host parameters of selected rows, with the filters none of them uses dropped and the
    hints of those rows, as :meth:`SamplingMetadata.build` gives them for these rows alone.

    Examples
    --------
    >>> meta = SamplingMetadata.build(2, _CPU, temperature=[0.0, 1.0], top_k=[0, 3])
    >>> first = _narrowed(meta.rows(torch.tensor([0])))
    >>> first.all_greedy, first.top_k, first.max_top_k
    (True, None, 0)
    """
    top_k = None if host.top_k is None or not bool((host.top_k != 0).any()) else host.top_k
    top_p = None if host.top_p is None or bool((host.top_p == 1.0).all()) else host.top_p
    min_p = None if host.min_p is None or bool((host.min_p == 0.0).all()) else host.min_p
    return replace(
        host,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        all_greedy=bool(host.greedy.all()),
        any_greedy=bool(host.greedy.any()),
        max_top_k=0 if top_k is None else int(top_k.max()),
    )


def _host_seeds(seeds: torch.Tensor | list[int | None] | None) -> list[int | None] | None:
    """Validated seeds as host values (a tensor's negative entries: unseeded)."""
    if isinstance(seeds, torch.Tensor):
        return [None if s < 0 else int(s) for s in seeds.tolist()]
    return seeds


def _drawn_seeds(seeds: list[int | None] | None, batch: int, params: SamplingParams) -> list[int]:
    """Every sequence's seed: its own, or one drawn from its generator (or the shared one,
    torch's default when ``None``), in sequence order."""
    own = dict(params.generators or {})
    out = []
    for i in range(batch):
        seed = None if seeds is None else seeds[i]
        if seed is None:
            source = own.get(i, params.generator)
            device = "cpu" if source is None else source.device
            seed = int(torch.randint(0, 1 << 62, (1,), device=device, generator=source))
        out.append(seed)
    return out


class SamplingState:
    """Per-sequence sampling parameters and random sources of the active sequences.

    Build it for a call with :meth:`build`, then select the sequences of a batch with
    :meth:`rows`. The processing is that of :mod:`specsample.probs` (temperature, top-k,
    top-p, min-p; temperature 0 is greedy).

    Parameters
    ----------
    requests : Requests
        The validated parameters and random sources, on the batch's device.
    host : SamplingMetadata
        The same parameters on the host (what :meth:`rows` reads its hints from).
    seeds : list of (int or None), optional
        Per-sequence seeds, ``None``: unseeded.
    keyed : bool
        Whether tokens are sampled as keyed Gumbel-max (``method="gumbel"``; see the module
        docstring); every sequence is then seeded.

    Attributes
    ----------
    requests : Requests
        What :func:`specsample.verify`'s pipeline receives.
    metadata : SamplingMetadata
        Its parameters (``requests.sampling``).
    seeding : Seeding
        Its random sources (``requests.seeding``).
    seeds : list of (int or None) or None
        The seeds, on the host.

    Examples
    --------
    >>> params = SamplingParams(temperature=[0.0, 0.5], seeds=[3, None])
    >>> s = SamplingState.build(2, torch.device("cpu"), params)
    >>> s.all_greedy, s.seeding.seeds.tolist(), s.rows([0]).all_greedy
    (False, [3, -1], True)
    """

    def __init__(
        self,
        requests: Requests,
        host: SamplingMetadata,
        seeds: list[int | None] | None,
        keyed: bool = False,
    ) -> None:
        self.requests = requests
        self.keyed = keyed
        self.metadata = requests.sampling
        self.seeding = requests.seeding
        self.host = host
        self.seeds = seeds
        self._expanded: dict[int, SamplingMetadata] = {}
        self._plain: dict[int, BatchLayout] = {}

    @staticmethod
    def build(
        batch: int, device: torch.device, params: SamplingParams, *, keyed: bool = False
    ) -> SamplingState:
        """Validate what ``batch`` requests ask (``params``) once, for a batch on ``device``
        (with ``keyed``, a state of a keyed run: see the module docstring).

        Raises
        ------
        ValueError, TypeError
            Naming the parameter that is out of range or of the wrong type or length.
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(params).__name__}")
        host = SamplingMetadata.build(
            batch,
            _CPU,
            temperature=_on_host(params.temperature),
            top_k=_on_host(params.top_k),
            top_p=_on_host(params.top_p),
            min_p=_on_host(params.min_p),
        )
        seeds = _host_seeds(check_seeds(params.seeds, batch, device))
        generators = params.generators
        if keyed:
            seeds, generators = list(_drawn_seeds(seeds, batch, params)), None
        seeding = seeding_from(
            batch, device, seeds=seeds, generators=generators, generator=params.generator
        )
        return SamplingState(Requests(_moved(host, device), seeding), host, seeds, keyed)

    @property
    def device(self) -> torch.device:
        """Where the batch lives."""
        return self.metadata.greedy.device

    @property
    def all_greedy(self) -> bool:
        """Every sequence decodes greedily (no distribution and no random number is needed)."""
        return self.metadata.all_greedy

    def rows(self, rows: Sequence[int]) -> SamplingState:
        """The state of the sequences at ``rows`` (host indices), in that order.

        The parameters are not validated again: they are those of the selected rows, with
        the host hints, and the random sources, a state built for these rows alone would have.
        """
        rows = list(rows)
        index = torch.tensor(rows, dtype=torch.int64)
        host = _narrowed(self.host.rows(index))
        chosen = self.metadata.rows(index.to(self.device, non_blocking=True))
        metadata = replace(
            host,
            inv_temperature=chosen.inv_temperature,
            greedy=chosen.greedy,
            top_k=None if host.top_k is None else chosen.top_k,
            top_p=None if host.top_p is None else chosen.top_p,
            min_p=None if host.min_p is None else chosen.min_p,
        )
        seeds = None if self.seeds is None else [self.seeds[i] for i in rows]
        generators = dict(self.seeding.generators)
        own = {j: generators[i] for j, i in enumerate(rows) if i in generators}
        seeding = Seeding.build(
            len(rows), self.device, seeds=seeds, generators=own, generator=self.seeding.generator
        )
        return SamplingState(Requests(metadata, seeding), host, seeds, self.keyed)

    def gumbel_tokens(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[batch]`` int64 each row's keyed Gumbel-max token at ``positions``: what
        :func:`specsample.verify` with ``method="gumbel"`` emits there without drafts.

        Parameters
        ----------
        logits : torch.Tensor
            ``[batch, vocab]`` one row per sequence, processed with its parameters (greedy
            rows take the argmax).
        positions : torch.Tensor
            ``[batch]`` int64 absolute position of the token each row samples.

        Examples
        --------
        >>> params = SamplingParams(temperature=1.0, seeds=[4, 4])
        >>> s = SamplingState.build(2, torch.device("cpu"), params, keyed=True)
        >>> tokens = s.gumbel_tokens(torch.zeros(2, 50), torch.tensor([7, 7]))
        >>> bool(tokens[0] == tokens[1])
        True
        """
        batch = logits.shape[0]
        layout = self._plain.get(batch)
        if layout is None:
            layout = self._plain[batch] = BatchLayout.build([0] * batch, self.device)
        drafts = torch.zeros(0, dtype=torch.int64, device=self.device)
        requests = self.requests.at(positions)
        return verify(logits, drafts, layout, requests=requests, method="gumbel").token_ids[:, 0]

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
        >>> params = SamplingParams(temperature=1.0, seeds=[4, 4])
        >>> s = SamplingState.build(2, torch.device("cpu"), params)
        >>> u = s.draft_uniforms(torch.tensor([7, 7]), 3)
        >>> u.shape, bool(torch.equal(u[0], u[1]))
        (torch.Size([2, 3]), True)
        """
        counters = stripe(positions, self.metadata.batch, k, DRAFT_STRIDE, self.device)
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
        >>> params = SamplingParams(temperature=[1.0, 0.0], top_k=1)
        >>> s = SamplingState.build(2, torch.device("cpu"), params)
        >>> s.probs(torch.tensor([[0.0, 1.0], [3.0, 1.0]])).tolist()
        [[0.0, 1.0], [1.0, 0.0]]
        """
        slots = math.prod(logits.shape[1:-1])
        metadata = self._expanded.get(slots)
        if metadata is None:
            index = torch.arange(self.metadata.batch, device=self.device).repeat_interleave(slots)
            metadata = self._expanded[slots] = self.metadata.rows(index)
        rows = logits.reshape(-1, logits.shape[-1])
        return processed_probs(rows, metadata).reshape(logits.shape)
