"""The vLLM plugin (:mod:`specsample.integrations.vllm.plugin`), loaded the way vLLM loads it.

vLLM loads each process's plugins once (``vllm.plugins.load_general_plugins``), so every
case runs in a fresh interpreter: it loads the plugins through vLLM's entry-point mechanism,
then builds the rejection sampler the way vLLM's (V1) model runner does, by the name its
module imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

_BUILD = """
from vllm.plugins import load_general_plugins
load_general_plugins()
import os
from vllm.v1.worker import gpu_model_runner
from vllm.v1.sample.sampler import Sampler
sampler = gpu_model_runner.RejectionSampler(Sampler())
print(type(sampler).__module__, type(sampler).__name__, os.environ.get("VLLM_USE_V2_MODEL_RUNNER"))
"""


def _built(**env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SPECSAMPLE_", "VLLM_"))}
    result = subprocess.run(
        [sys.executable, "-c", _BUILD],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()[-3:]


def test_enabled_plugin_makes_the_model_runner_build_specsample() -> None:
    module, name, v2 = _built(SPECSAMPLE_VLLM="1")
    assert (module, name) == ("specsample.integrations.vllm.sampler", "SpecsampleRejectionSampler")
    assert v2 == "0"


def test_plugin_respects_vllms_own_allow_list() -> None:
    """``VLLM_PLUGINS`` names the plugins vLLM loads; ours is ``specsample``."""
    assert _built(SPECSAMPLE_VLLM="1", VLLM_PLUGINS="specsample")[1] == (
        "SpecsampleRejectionSampler"
    )
    assert _built(SPECSAMPLE_VLLM="1", VLLM_PLUGINS="")[1] == "RejectionSampler"


def test_disabled_plugin_leaves_vllm_alone() -> None:
    module, name, v2 = _built()
    assert (module, name) == ("vllm.v1.sample.rejection_sampler", "RejectionSampler")
    assert v2 == "None"
