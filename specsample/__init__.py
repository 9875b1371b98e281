"""specsample: the exact, fast verification step of speculative decoding.

Three entry points share one pipeline (:mod:`specsample.pipeline`: plan the step, then a
backend of :mod:`specsample.backends` executes it):

* :class:`RejectionSampler`, a drop-in ``nn.Module`` on ``[batch, k, vocab]`` probabilities
  (and :class:`TypicalAcceptanceSampler`, the LOSSY typical rule with the same interface);
* :func:`verify`, the functional API engines call on flattened, ragged target logits with
  per-request sampling parameters (and :func:`verify_padded` for ``[batch, k + 1, vocab]``),
  and :func:`verify_tree` for token trees; what each request asks travels as keywords or as
  one validated :class:`Requests` (built from :class:`SamplingParams`).

The verification methods are listed once, in :mod:`specsample.methods`.

Both accept a prefix of each sequence's drafted tokens and emit one more, so that the emitted
stream follows the target distribution exactly. :mod:`specsample.testing` is the exactness
harness that proves it (and can test any verifier with the same signature);
:mod:`specsample.stats` holds the counters and metrics.
"""

from specsample.api import VerifyOutput, verify, verify_padded, verify_tree
from specsample.backends import BACKENDS
from specsample.metadata import BatchLayout
from specsample.methods import METHODS
from specsample.params import Requests, SamplingParams
from specsample.rules import VerifyResult, chain_verify
from specsample.sampler import RejectionSampler, TypicalAcceptanceSampler
from specsample.stats import VerificationStats, expected_acceptance

__all__ = [
    "BACKENDS",
    "METHODS",
    "BatchLayout",
    "RejectionSampler",
    "Requests",
    "SamplingParams",
    "TypicalAcceptanceSampler",
    "VerificationStats",
    "VerifyOutput",
    "VerifyResult",
    "chain_verify",
    "expected_acceptance",
    "verify",
    "verify_padded",
    "verify_tree",
]

__version__ = "0.1.0"
