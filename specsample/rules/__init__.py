"""Verification rules, one module per algorithm, and what they share.

* :mod:`specsample.rules.chain` — token-by-token speculative (rejection) sampling of a chain;
* :mod:`specsample.rules.block` — block verification of a chain;
* :mod:`specsample.rules.typical` — typical acceptance (lossy);
* :mod:`specsample.rules.tree` — token trees: the top-down rules (:func:`tree_verify`) and
  traversal verification (:func:`traversal_verify`);
* :mod:`specsample.rules.residual` — the lazy residual draw shared by the exact rules;
* :mod:`specsample.rules.rows` — where a rule reads its rows from (probabilities or logits).
"""

from specsample.rules.chain import VerifyResult, chain_verify
from specsample.rules.tree import TreeVerifyResult, traversal_verify, tree_verify

__all__ = ["TreeVerifyResult", "VerifyResult", "chain_verify", "traversal_verify", "tree_verify"]
