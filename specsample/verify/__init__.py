"""Verification rules, one module per algorithm.

* :mod:`specsample.verify.chain` — token-by-token speculative (rejection) sampling;
* :mod:`specsample.verify.residual` — the lazy residual draw shared by the exact rules.
"""

from specsample.verify.chain import VerifyResult, chain_verify

__all__ = ["VerifyResult", "chain_verify"]
