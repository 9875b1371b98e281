"""Batched speculative decoding over a pair of Hugging Face causal LMs.

:func:`speculative_generate` drafts ``k`` tokens per sequence (with a
:class:`ModelDrafter`, a small causal LM sharing the target's tokenizer, or an
:class:`NGramDrafter`, prompt lookup without a model), scores them with one target forward
and verifies them with :func:`specsample.verify`, so the output follows the target's
distribution exactly (unless Medusa's typical acceptance, which is lossy, is asked for).
:func:`target_generate` is the target-only baseline, sampled by the same processing. Both
report :class:`GenerationStats`; both are thin wrappers of a reusable :class:`Decoder`, whose
calls share a :class:`PolicyMemory` (what the adaptive draft length learnt), and which takes
the sampling parameters as a :class:`specsample.params.SamplingParams` and the callbacks as
:class:`Callbacks`. With ``tree=TreeShape(...)`` the draft model expands a token
tree per sequence instead of a chain, and the target scores every node in one forward.

``transformers`` is needed to run a model but is imported only when one is used.
"""

from specsample.generate.config import Callbacks
from specsample.generate.decoder import (
    MAX_K,
    Decoder,
    GenerationOutput,
    speculative_generate,
    target_generate,
)
from specsample.generate.drafters import Drafter, ModelDrafter, Proposal
from specsample.generate.inputs import MAX_NEW_TOKENS
from specsample.generate.ngram import NGramDrafter
from specsample.generate.policy import PolicyMemory
from specsample.generate.sampling import SamplingState
from specsample.generate.state import DecodeState, Prefill
from specsample.generate.stats import GenerationStats
from specsample.generate.tree import TreeShape

__all__ = [
    "MAX_K",
    "MAX_NEW_TOKENS",
    "Callbacks",
    "DecodeState",
    "Decoder",
    "Drafter",
    "GenerationOutput",
    "GenerationStats",
    "ModelDrafter",
    "NGramDrafter",
    "PolicyMemory",
    "Prefill",
    "Proposal",
    "SamplingState",
    "TreeShape",
    "speculative_generate",
    "target_generate",
]
