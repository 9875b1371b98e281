"""The adaptive draft length: how many tokens each step drafts, to maximise tokens per second.

* :mod:`~specsample.generate.policy.chooser`: :class:`DraftLengthPolicy`, the choice of each
  step's length from expected tokens over expected time;
* :mod:`~specsample.generate.policy.acceptance`: what it knows of acceptance
  (:class:`AcceptanceTracker` per sequence, :class:`History` over every sequence);
* :mod:`~specsample.generate.policy.costs`: what it knows of cost (:class:`CostModel`);
* :mod:`~specsample.generate.policy.memory`: what runs carry over to later ones
  (:class:`PolicyMemory`, an object its caller owns).
"""

from specsample.generate.policy.acceptance import AcceptanceTracker, History
from specsample.generate.policy.chooser import DraftLengthPolicy
from specsample.generate.policy.costs import CostModel
from specsample.generate.policy.memory import PolicyMemory

__all__ = ["AcceptanceTracker", "CostModel", "DraftLengthPolicy", "History", "PolicyMemory"]
