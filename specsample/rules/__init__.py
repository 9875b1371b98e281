"""Verification rules, one module per algorithm, and what they share.

* :mod:`specsample.rules.chain` — token-by-token speculative (rejection) sampling of a chain;
* :mod:`specsample.rules.residual` — the lazy residual draw shared by the exact rules;
* :mod:`specsample.rules.rows` — where a rule reads its rows from (probabilities or logits).
"""

from specsample.rules.chain import VerifyResult, chain_verify

__all__ = ["VerifyResult", "chain_verify"]
