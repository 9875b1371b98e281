"""specsample: the exact, fast verification step of speculative decoding.

Three entry points share one pipeline (:mod:`specsample.pipeline`: plan the step, then a
backend of :mod:`specsample.backends` executes it):

* :class:`RejectionSampler`, a drop-in ``nn.Module`` on ``[batch, k, vocab]`` probabilities
  (and :class:`TypicalAcceptanceSampler`, the LOSSY typical rule with the same interface);
* :func:`verify`, the functional API engines call on flattened, ragged target logits with
  per-request sampling parameters (and :func:`verify_padded` for ``[batch, k + 1, vocab]``),
  and :func:`verify_tree` for token trees (its layout a :class:`DraftTree`, its result a
  :class:`TreeVerifyResult`); what each request asks travels as keywords or as one
  validated :class:`Requests` (built from :class:`SamplingParams`).

The verification methods are listed once, in :mod:`specsample.methods`.

Both accept a prefix of each sequence's drafted tokens and emit one more, so that the emitted
stream follows the target distribution exactly. :mod:`specsample.testing` is the exactness
harness that proves it (and can test any verifier with the same signature);
:mod:`specsample.stats` holds the counters and metrics.

The names below are imported on first use, so that ``import specsample`` alone (as the
command line does before it can report a Ctrl-C on one line) does not import PyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names __getattr__ gives, for type checkers
    from specsample.api import VerifyOutput as VerifyOutput
    from specsample.api import verify as verify
    from specsample.api import verify_padded as verify_padded
    from specsample.api import verify_tree as verify_tree
    from specsample.backends import BACKENDS as BACKENDS
    from specsample.methods import METHODS as METHODS
    from specsample.params import DraftTree as DraftTree
    from specsample.params import Requests as Requests
    from specsample.params import SamplingParams as SamplingParams
    from specsample.params.layout import BatchLayout as BatchLayout
    from specsample.rules import TreeVerifyResult as TreeVerifyResult
    from specsample.rules import VerifyResult as VerifyResult
    from specsample.rules import chain_verify as chain_verify
    from specsample.sampler import RejectionSampler as RejectionSampler
    from specsample.sampler import TypicalAcceptanceSampler as TypicalAcceptanceSampler
    from specsample.stats import VerificationStats as VerificationStats
    from specsample.stats import expected_acceptance as expected_acceptance

_HOMES = {
    "BACKENDS": "specsample.backends",
    "METHODS": "specsample.methods",
    "BatchLayout": "specsample.params.layout",
    "DraftTree": "specsample.params",
    "RejectionSampler": "specsample.sampler",
    "Requests": "specsample.params",
    "SamplingParams": "specsample.params",
    "TreeVerifyResult": "specsample.rules",
    "TypicalAcceptanceSampler": "specsample.sampler",
    "VerificationStats": "specsample.stats",
    "VerifyOutput": "specsample.api",
    "VerifyResult": "specsample.rules",
    "chain_verify": "specsample.rules",
    "expected_acceptance": "specsample.stats",
    "verify": "specsample.api",
    "verify_padded": "specsample.api",
    "verify_tree": "specsample.api",
}
"""The module each public name is defined in."""

__all__ = sorted(_HOMES)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'specsample' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
