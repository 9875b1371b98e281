"""The engines of the engine tests: real ``vllm.LLM`` engines, each in a process of its own.

Each engine of :data:`ENGINES` is started in a fresh process (``engine.py`` here), and runs
there every job asked of it (:func:`start_engine`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "specsample/models/default/target"
DRAFT = ROOT / "specsample/models/default/draft"

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}  # fmt: skip
DRAFT_MODEL = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4}
"""The shipped draft as vLLM's draft model, drafting greedily (vLLM's default): one-hot
drafts, a function of the context."""
SAMPLED_DRAFTS = {**DRAFT_MODEL, "draft_sample_method": "probabilistic"}
"""The same, sampling its drafts (with vLLM's global generator, whatever the request's seed)
and handing their probabilities to the verifier."""

PLUGIN = {"SPECSAMPLE_VLLM": "1"}
SYNC = {"async_scheduling": False}
"""vLLM schedules a step ahead by default, and how many drafts it then verifies at a step
depends on timing: so do the tokens of a seeded request, whichever sampler draws them."""

ENGINES: dict[str, tuple[dict[str, Any] | None, dict[str, str], dict[str, Any]]] = {
    "plain": (None, {}, {}),
    "ngram-vllm": (NGRAM, {}, SYNC),
    "ngram-chain": (NGRAM, PLUGIN, SYNC),
    "draft-chain": (DRAFT_MODEL, PLUGIN, SYNC),
    "draft-block": (SAMPLED_DRAFTS, {**PLUGIN, "SPECSAMPLE_VLLM_METHOD": "block"}, {}),
}
"""Each engine: its speculative configuration (``None``: none), the plugin's switches
(none: ``SPECSAMPLE_VLLM`` unset, the plugin off) and its ``vllm.LLM`` keywords beyond
those of every engine."""

_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
}


def serves_here() -> bool:
    """Whether vLLM has a platform to serve on here (its CPU build, or a GPU)."""
    import torch
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu() or torch.cuda.is_available())


def start_engine(name: str, jobs: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Run ``jobs`` on the engine ``name`` in a fresh process; its results and its log."""
    speculative_config, switches, keywords = ENGINES[name]
    spec = folder / f"{name}.json"
    spec.write_text(json.dumps({"model": str(TARGET), "speculative_config": speculative_config,
                                "engine": keywords, "jobs": jobs}))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECSAMPLE_VLLM", "VLLM_"))}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("engine.py")), str(spec)],
        env={**env, **_ENV, **switches}, capture_output=True, text=True, timeout=900,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"engine {name!r} failed:\n{done.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stdout + done.stderr  # vLLM logs to standard output
    return result
