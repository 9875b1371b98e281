"""specsample: the exact, fast verification step of speculative decoding.

The main entry point is :class:`RejectionSampler`, a drop-in ``nn.Module`` that accepts a
prefix of each sequence's drafted tokens and emits one more, so that the emitted stream
follows the target distribution exactly. :mod:`specsample.testing` is the exactness harness
that proves it (and can test any verifier with the same signature); :mod:`specsample.stats`
holds the counters and metrics.
"""

from specsample.sampler import RejectionSampler
from specsample.stats import VerificationStats, expected_acceptance
from specsample.verify import VerifyResult, chain_verify

__all__ = [
    "RejectionSampler",
    "VerificationStats",
    "VerifyResult",
    "chain_verify",
    "expected_acceptance",
]

__version__ = "0.1.0"
