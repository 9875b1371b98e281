"""Collection settings of the whole repository.

The modules of an engine integration import their engine: where it is not installed, their
doctests are not collected (their tests skip themselves; ``make test-vllm`` runs both in an
environment with vLLM).
"""

from __future__ import annotations

import importlib.util

VLLM_MODULES = [
    "specsample/integrations/vllm/sampler.py",
    "specsample/integrations/vllm/testing.py",
]

collect_ignore = [] if importlib.util.find_spec("vllm") else VLLM_MODULES
