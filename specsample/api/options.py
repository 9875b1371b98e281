"""The keyword arguments the public entry points forward to their parameter objects.

:func:`specsample.verify` and :func:`specsample.verify_tree` take what each request asks
either as one validated :class:`specsample.params.Requests` (``requests=``, what a loop
reuses step after step) or as the keywords of :class:`VerifyOptions` (``temperature=0.7``,
``seeds=[...]``, ...), which are validated into one here, at every call.

Examples
--------
>>> import torch
>>> requests = requests_from(None, {"temperature": 0.0, "positions": [3]}, 1,
...                          torch.device("cpu"), strict=False)
>>> requests.all_greedy, requests.positions.tolist()
(True, [3])
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, TypedDict

import torch

from specsample.params import Ints, Requests, SamplingParams, Seeds
from specsample.params.metadata import Scalars
from specsample.params.requests import checked_requests
from specsample.params.seeding import require_positions


class RequestOptions(TypedDict, total=False):
    """What each request asks, as keywords (see :class:`specsample.params.SamplingParams`),
    its absolute positions, and the step's uniforms when the caller draws them."""

    temperature: Scalars
    top_k: Scalars
    top_p: Scalars
    min_p: Scalars
    seeds: Seeds | None
    generators: Mapping[int, torch.Generator] | None
    generator: torch.Generator | None
    positions: Ints | None
    uniforms: torch.Tensor | None


class VerifyOptions(RequestOptions, total=False):
    """:class:`RequestOptions` and the host-side maximum of device draft counts."""

    max_draft_tokens: int | None


def check_names(entry: str, options: Mapping[str, object], allowed: Collection[str]) -> None:
    """Refuse a keyword ``entry`` does not take, as Python would.

    Examples
    --------
    >>> check_names("verify", {"temprature": 1.0}, ["temperature"])
    Traceback (most recent call last):
    ...
    TypeError: verify() got an unexpected keyword argument 'temprature'
    """
    for name in options:
        if name not in allowed:
            raise TypeError(f"{entry}() got an unexpected keyword argument {name!r}")


def requests_from(
    requests: Requests | None,
    options: Mapping[str, Any],
    batch: int,
    device: torch.device,
    *,
    strict: bool,
) -> Requests:
    """The requests of a call: ``requests`` as given (at ``options["positions"]`` when
    given), or built from the keyword ``options``.

    Raises
    ------
    TypeError
        ``requests`` that is not a :class:`~specsample.params.Requests`.
    ValueError
        Sampling keywords beside ``requests``; ``requests`` of another batch size or device;
        counter-seeded requests without positions (see
        :func:`specsample.params.seeding.require_positions`).
    """
    given = {name: options[name] for name in SamplingParams.names() if name in options}
    positions = options.get("positions")
    if requests is None:
        params = SamplingParams(**given)
        built = Requests.build(batch, device, params, positions=positions, strict=strict)
    else:
        built = checked_requests(requests, given, positions, batch, device)
    require_positions(built.seeding, built.positions)
    return built
