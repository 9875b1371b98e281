"""One vLLM engine, in this process: run the jobs of a JSON file, print the results as JSON.

The engine tests start one process per engine: vLLM loads its plugins once per process, and
its CPU build cannot start a second engine in a process. The engine runs in the process
itself (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so that its model runner can be inspected.

Input (the file named by the only argument)::

    {"model": DIR, "speculative_config": {...} or null, "engine": {more vllm.LLM keywords},
     "jobs": {NAME: {"prompts": [[token ids], ...], "params": [{SamplingParams keywords}, ...]}}}

Output, the last line of standard output::

    {"sampler": "module.Class" of the runner's rejection sampler (null without one),
     "kernels_warm": whether specsample's CPU kernels were ready before the first request,
     "start_s": seconds to build the engine,
     "jobs": {NAME: [[generated token ids], ...]}}
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 512,
    "seed": 0,
    "max_num_seqs": 256,
    # Room for every prompt of a step in one piece: vLLM's CPU build (0.32) fails a step
    # where the prefill of a seeded request is split ("CPU Generator does not use offset").
    "max_num_batched_tokens": 16384,
    # The smallest block the CPU attention takes: a prompt shared by thousands of requests
    # is then computed once, its whole blocks found in the prefix cache afterwards.
    "block_size": 32,
}
"""``vllm.LLM`` keywords of every engine."""


def _sampler_name(llm: Any) -> str | None:
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is None:
        return None
    return f"{type(sampler).__module__}.{type(sampler).__qualname__}"


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the engine, then run each job as one ``generate`` call."""
    from vllm import LLM, SamplingParams

    from specsample.kernels.cpu import compiler

    started = time.perf_counter()
    keywords = {**ENGINE, **spec["engine"]}
    llm = LLM(model=spec["model"], speculative_config=spec["speculative_config"], **keywords)
    result: dict[str, Any] = {
        "sampler": _sampler_name(llm),
        "kernels_warm": compiler.warmed(),
        "start_s": time.perf_counter() - started,
        "jobs": {},
    }
    for name, job in spec["jobs"].items():
        prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
        params = [SamplingParams(**keywords) for keywords in job["params"]]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        result["jobs"][name] = [list(out.outputs[0].token_ids) for out in outputs]
    return result


if __name__ == "__main__":
    print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))))
