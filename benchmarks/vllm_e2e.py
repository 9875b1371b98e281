"""vLLM end to end, with and without the specsample plugin, in one run (needs a GPU and vLLM).

Serves the shipped default target (``specsample/models/default/target``, or ``--model``) with
vLLM's n-gram speculation, once with ``SPECSAMPLE_VLLM=1`` and once without, each in a fresh
process (vLLM loads its plugins once per process), alternating the two for ``--rounds``
rounds. At temperature 0 both must give the same tokens; the report gives each one's
tokens/s (median over rounds) and their ratio, with the GPU's name.

Usage: python benchmarks/vllm_e2e.py [--model DIR] [--rounds 3] [--prompts 32]
Exit status: 0 equal outputs, or skipped (one ``skipped: ...`` line: no vLLM or no GPU);
1 outputs differ or a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from model_loading import skip

PROMPT_TEXT = "def parse(text):\n    for line in text.splitlines():\n        if line"


def _serve(model: str, prompts: int, max_tokens: int, k: int) -> dict[str, Any]:
    """One engine in this process: generate, then report the tokens and the time."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        speculative_config={"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3},
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_model_len=1024,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    batch = [PROMPT_TEXT * (1 + i % 3) for i in range(prompts)]
    llm.generate(batch[:2], params, use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(out.outputs[0].token_ids) for out in outputs]
    return {"tokens": tokens, "seconds": seconds, "count": sum(map(len, tokens))}


def _round(args: argparse.Namespace, plugin: bool) -> dict[str, Any]:
    env = {**os.environ, "SPECSAMPLE_VLLM": "1" if plugin else "0"}
    command = [sys.executable, __file__, "--serve", "--model", args.model]
    command += ["--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens)]
    command += ["--k", str(args.k)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"vLLM run (plugin={plugin}) failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse the options; serve once (``--serve``) or compare the two set-ups."""
    default = Path(__file__).resolve().parents[1] / "specsample/models/default/target"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=str(default), help="model directory (default: the shipped target)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of each set-up, alternated (default 3)"
    )
    parser.add_argument("--prompts", type=int, default=32, help="prompts per run (default 32)")
    parser.add_argument(
        "--max-tokens", type=int, default=128, help="tokens generated per prompt (default 128)"
    )
    parser.add_argument("--k", type=int, default=4, help="n-gram drafts per step (default 4)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        print(json.dumps(_serve(args.model, args.prompts, args.max_tokens, args.k)))
        return 0
    try:
        import torch
        import vllm
    except ImportError as error:
        return skip(f"vLLM cannot be imported ({error}): pip install 'specsample[vllm]'")
    if not torch.cuda.is_available():
        return skip("vLLM needs a CUDA device; none is visible")
    print(f"== vLLM {vllm.__version__} on {torch.cuda.get_device_name(0)}, n-gram k={args.k}")
    rates: dict[bool, list[float]] = {False: [], True: []}
    same = True
    for _ in range(args.rounds):
        runs = {plugin: _round(args, plugin) for plugin in (False, True)}
        same &= runs[False]["tokens"] == runs[True]["tokens"]
        for plugin, run in runs.items():
            rates[plugin].append(run["count"] / run["seconds"])
    vllm_rate, ours = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"   tokens/s, vLLM's sampler:       {vllm_rate:10.1f}")
    print(f"   tokens/s, specsample's sampler: {ours:10.1f}  ({ours / vllm_rate:.2f}x)")
    print(f"   outputs at temperature 0: {'EQUAL' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
