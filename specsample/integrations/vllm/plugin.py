"""The vLLM plugin: makes vLLM's model runner build the specsample rejection sampler.

vLLM calls every ``vllm.general_plugins`` entry point in each of its processes before it
builds a model runner. specsample's entry point, :func:`register`, does nothing unless
``SPECSAMPLE_VLLM=1`` (see :mod:`specsample.integrations.vllm.settings`). Enabled, it
rebinds the name ``RejectionSampler`` in vLLM's sampler module and in its (V1) model
runner module to :class:`~specsample.integrations.vllm.sampler.SpecsampleRejectionSampler`,
and selects the V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``, unless set otherwise),
the one that builds its rejection sampler from that class. Loading it twice is harmless.

What it does goes to vLLM's own log: the sampler says, when vLLM builds it, that specsample
verifies the drafts, with which method and backend; where the swap cannot happen (vLLM's V2
model runner chosen, or a vLLM without the V1 sampler), the plugin warns instead.
"""

from __future__ import annotations

import logging
import os
import sys

from specsample.integrations.vllm.settings import LOGGER, Settings

logger = logging.getLogger(LOGGER)

SAMPLER_MODULE = "vllm.v1.sample.rejection_sampler"
RUNNER_MODULES = ("vllm.v1.worker.gpu_model_runner",)
"""vLLM modules that import ``RejectionSampler`` by name and build it."""

V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: :func:`install` when enabled."""
    if Settings.from_env().enabled:
        install()


def install() -> type | None:
    """Make vLLM build :class:`SpecsampleRejectionSampler` wherever it builds its own.

    Returns
    -------
    type or None
        The class now bound to ``RejectionSampler`` in vLLM's modules; ``None`` (and a
        warning in vLLM's log) when this vLLM has no V1 rejection sampler to replace.
    """
    try:
        from specsample.integrations.vllm.sampler import SpecsampleRejectionSampler
    except ImportError as error:
        logger.warning(
            "SPECSAMPLE_VLLM=1 but specsample cannot replace this vLLM's rejection sampler "
            "(%s); vLLM's own verifies the drafts (see specsample's docs/vllm.md)",
            error,
        )
        return None

    for name in (SAMPLER_MODULE, *RUNNER_MODULES):
        module = sys.modules.get(name)
        if module is not None:
            module.RejectionSampler = SpecsampleRejectionSampler  # type: ignore[attr-defined]
    if os.environ.setdefault(V2_RUNNER, "0").strip().lower() in ("1", "true"):
        logger.warning(
            "SPECSAMPLE_VLLM=1 but %s=1: vLLM's V2 model runner has its own rejection "
            "sampler, which specsample does not replace; set %s=0 to verify with specsample",
            V2_RUNNER,
            V2_RUNNER,
        )
    return SpecsampleRejectionSampler
