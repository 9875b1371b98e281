"""What each request of a batch asks, as the caller gives it and as the pipeline takes it.

:class:`SamplingParams` is what a caller states once per request (temperature, top-k, top-p,
min-p, where its random numbers come from): plain values, unvalidated. :class:`Requests` is
the same for one batch, validated once when built (:meth:`Requests.build`) and reused across
the steps of an unchanged batch: the sampling metadata the target rows are processed with
(:class:`specsample.params.metadata.SamplingMetadata`), the random sources
(:class:`specsample.params.seeding.Seeding`) and each request's absolute position, which moves from
step to step (:meth:`Requests.at`) without validating the rest again.

The draft layout is the other object a step needs: how many drafts each request has
(:class:`specsample.params.layout.BatchLayout`, for chains), or the tree they form
(:class:`DraftTree`).

Examples
--------
>>> import torch
>>> params = SamplingParams(temperature=[0.0, 0.8], seeds=[7, None])
>>> requests = Requests.build(2, torch.device("cpu"), params)
>>> requests.batch, requests.all_greedy, requests.seeding.seeds.tolist()
(2, False, [7, -1])
>>> requests.at(torch.tensor([5, 9])).positions.tolist()
[5, 9]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import torch

from specsample.methods import check_drafting
from specsample.params.checks import check_bound, require_tensor
from specsample.params.layout import Ints
from specsample.params.metadata import SamplingMetadata, Scalars
from specsample.params.seeding import Seeding, positions_from, seeding_from

Seeds = Sequence[int | None] | torch.Tensor
"""Per-request seeds: host ints (``None`` or -1 unseeded) or an integer tensor."""


@dataclass(frozen=True)
class SamplingParams:
    """What each request asks for, as given (validated by :meth:`Requests.build`).

    Attributes
    ----------
    temperature, top_k, top_p, min_p : scalar, sequence or tensor
        Per-request sampling parameters (one value for all, or one per request):
        temperature finite and >= 0 (0 = greedy), top_k an integer >= 0 (0 = off), top_p in
        (0, 1] (1 = off), min_p in [0, 1] (0 = off). Applied in that order.
    seeds : sequence of (int or None), or tensor, optional
        ``[batch]`` per-request seeds in ``[0, 2**64)`` (None or negative: unseeded). A
        seeded request's numbers depend only on its seed and absolute position, so a step
        with seeds needs positions (:attr:`Requests.positions`).
    generators : dict of int to torch.Generator, optional
        Per-request generators (vLLM's ``generators``): request ``i`` draws from
        ``generators[i]``.
    generator : torch.Generator, optional
        Randomness of the other requests (torch's default generator when ``None``).

    Examples
    --------
    >>> SamplingParams(temperature=0.0).temperature
    0.0
    >>> sorted(SamplingParams.names())[:3]
    ['generator', 'generators', 'min_p']
    """

    temperature: Scalars = 1.0
    top_k: Scalars = None
    top_p: Scalars = None
    min_p: Scalars = None
    seeds: Seeds | None = None
    generators: Mapping[int, torch.Generator] | None = None
    generator: torch.Generator | None = None

    @staticmethod
    def names() -> tuple[str, ...]:
        """The field names: the keyword arguments the thin wrappers forward here."""
        return _NAMES


_NAMES = tuple(f.name for f in fields(SamplingParams))


@dataclass(frozen=True)
class Requests:
    """What every request of a batch asks, validated: build with :meth:`build`.

    Attributes
    ----------
    sampling : SamplingMetadata
        ``[batch]`` sampling parameters as device tensors, with host hints.
    seeding : Seeding
        Where each request's random numbers come from.
    positions : torch.Tensor or None
        ``[batch]`` int64 absolute position of each request's first draft (``None``: not
        given yet; seeded requests are refused without positions when they verify a step).
    """

    sampling: SamplingMetadata
    seeding: Seeding
    positions: torch.Tensor | None = None

    @staticmethod
    def build(
        batch: int,
        device: torch.device,
        params: SamplingParams | None = None,
        *,
        positions: Ints | None = None,
        strict: bool = False,
    ) -> Requests:
        """Validate ``params`` for a batch of ``batch`` requests on ``device``.

        Parameters
        ----------
        batch : int
            Number of requests.
        device : torch.device
            Where the batch lives.
        params : SamplingParams, optional
            What the requests ask (default: temperature 1, no filter, unseeded).
        positions : sequence of int or tensor, optional
            ``[batch]`` absolute positions in ``[0, 2**40)``. Seeded requests need them
            when they verify a step: give them here, with :meth:`at`, or as the entry
            point's ``positions=`` (a step with seeds and no positions is refused).
        strict : bool
            Also check the values of tensors on the device (synchronises).

        Raises
        ------
        TypeError, ValueError
            A parameter of the wrong type or value (the message names it).
        """
        given = params if params is not None else SamplingParams()
        if not isinstance(given, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(given).__name__}")
        sampling = SamplingMetadata.build(
            batch,
            device,
            temperature=given.temperature,
            top_k=given.top_k,
            top_p=given.top_p,
            min_p=given.min_p,
            strict=strict,
        )
        seeding = seeding_from(
            batch,
            device,
            seeds=given.seeds,
            generators=given.generators,
            generator=given.generator,
        )
        return Requests(sampling, seeding, positions_from(positions, batch, device))

    @property
    def batch(self) -> int:
        """Number of requests."""
        return self.sampling.batch

    @property
    def all_greedy(self) -> bool:
        """Every request is known to be greedy."""
        return self.sampling.all_greedy

    def at(self, positions: torch.Tensor | None) -> Requests:
        """The same requests at new ``[batch]`` int64 positions on the batch's device.

        Nothing is validated again: the loop moves an unchanged batch along this way.
        """
        return replace(self, positions=positions)


class DraftTree(NamedTuple):
    """The draft layout of a tree step: build it with :meth:`build`.

    Attributes
    ----------
    parents : torch.Tensor
        ``[batch, nodes]`` (or ``[nodes]``, shared by every request) int64 parent of each
        node, smaller than its index; ``-1`` for the root (node 0) and for padding.
    drafting : str
        How the children were drafted (one of :func:`specsample.methods.tree_draftings`).
    max_depth, max_children : int or None
        Loop bounds: the deepest level and the most children tried per node (``None``:
        from the tree; a bound above ``nodes - 1`` costs no more work than ``nodes - 1``).

    Examples
    --------
    >>> tree = DraftTree.build(torch.tensor([-1, 0, 0, 1]), "iid", max_depth=2)
    >>> tree.drafting, tree.max_depth
    ('iid', 2)
    """

    parents: torch.Tensor
    drafting: str
    max_depth: int | None = None
    max_children: int | None = None

    @staticmethod
    def build(
        parents: torch.Tensor,
        drafting: str,
        *,
        max_depth: int | None = None,
        max_children: int | None = None,
    ) -> DraftTree:
        """Check the layout's own arguments (the rules check ``parents`` against the nodes).

        Raises
        ------
        TypeError, ValueError
            ``parents`` not a tensor, an unknown ``drafting``, a bound that is not an int
            ``>= 0`` (the message names it).
        """
        require_tensor("parents", parents)
        check_bound("max_depth", max_depth)
        check_bound("max_children", max_children)
        return DraftTree(parents, check_drafting(drafting), max_depth, max_children)


def checked_requests(
    requests: object,
    given: Mapping[str, object],
    positions: Ints | None,
    batch: int,
    device: torch.device,
) -> Requests:
    """A caller's ``requests``, checked against the batch (``batch`` requests on ``device``)
    and the other keywords ``given`` (none may be), at ``positions`` when given.

    Raises
    ------
    TypeError, ValueError
        ``requests`` is not a :class:`Requests`, keywords beside it, another batch size or
        device (the message names the argument).
    """
    if not isinstance(requests, Requests):
        raise TypeError(f"requests must be a Requests, got {type(requests).__name__}")
    if given:
        raise ValueError(
            f"pass the sampling parameters in requests or as keywords, not both: got requests "
            f"and {sorted(given)}"
        )
    if requests.batch != batch:
        raise ValueError(f"requests has {requests.batch} requests but the batch has {batch}")
    if requests.sampling.greedy.device != device:
        raise ValueError(
            f"requests is on {requests.sampling.greedy.device} but the batch is on {device}"
        )
    if positions is None:
        return requests
    return requests.at(positions_from(positions, batch, device))
