"""A fresh deployment of vLLM with the specsample plugin: start-up and first calls, cold cache.

Each round starts two fresh processes, alternating their order: ``vllm.LLM`` on the shipped
target (or ``--model``) with vLLM's n-gram speculation (k = 4), once with vLLM's sampler
and once with the plugin (``SPECSAMPLE_VLLM=1``), each with an empty specsample kernel
cache (``SPECSAMPLE_CACHE_DIR`` a new folder), as on a machine that never ran specsample.
Each process builds the engine, then times ``--calls`` generate calls of ``--prompts``
seeded prompts x ``--max-tokens`` tokens at temperature 1. The report gives, as medians over
the rounds, the engine's start-up, the first call and the median of the later calls, and
the plugin's ratios to vLLM's own sampler, with the CPU and the load.

Usage: python benchmarks/vllm_cold_start.py [--model DIR] [--rounds 3] [--calls 6]
Exit status: 0 (or one ``skipped: ...`` line when vLLM cannot be imported); 1 a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from model_loading import skip
from vllm_e2e import cpu_busy, cpu_description

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
RESULT = "specsample-cold-start: "
"""Marks the child's result among vLLM's log lines (vLLM logs to standard output)."""
PROMPT = "def parse(text):\n    for line in text.splitlines():\n        if line"


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """One deployment in this process: build the engine, then time the calls."""
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        speculative_config=NGRAM,
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=1024,
        seed=0,
    )
    start_s = time.perf_counter() - started
    prompts = [PROMPT * (1 + i % 3) for i in range(args.prompts)]
    calls = []
    for call in range(args.calls):
        params = [
            SamplingParams(
                temperature=1.0,
                max_tokens=args.max_tokens,
                ignore_eos=True,
                seed=call * args.prompts + i,
            )
            for i in range(args.prompts)
        ]
        began = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        calls.append(time.perf_counter() - began)
    return {"start_s": start_s, "calls": calls}


def _deploy(args: argparse.Namespace, plugin: bool) -> dict[str, Any]:
    """A fresh process, its kernel cache empty."""
    with tempfile.TemporaryDirectory(prefix="specsample-cold-") as cache:
        env = {
            **os.environ,
            "SPECSAMPLE_VLLM": "1" if plugin else "0",
            "SPECSAMPLE_CACHE_DIR": cache,
            "HF_HUB_OFFLINE": "1",
        }
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        command = [
            sys.executable,
            __file__,
            "--child",
            "--model",
            args.model,
            "--dtype",
            args.dtype,
            "--calls",
            str(args.calls),
            "--prompts",
            str(args.prompts),
            "--max-tokens",
            str(args.max_tokens),
        ]
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=1800, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"deployment (plugin={plugin}) failed:\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT) :])
    return result


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "start_s": statistics.median(r["start_s"] for r in runs),
        "first_s": statistics.median(r["calls"][0] for r in runs),
        "later_s": statistics.median(statistics.median(r["calls"][1:]) for r in runs),
    }


def _report(runs: dict[bool, list[dict[str, Any]]], loads: list[float]) -> None:
    vllm_own, ours = _medians(runs[False]), _medians(runs[True])
    print(f"   {'':22s} {'vLLM sampler':>13s} {'specsample':>11s} {'ratio':>7s}")
    for key, label in (
        ("start_s", "engine start-up, s"),
        ("first_s", "first call, s"),
        ("later_s", "later calls, s"),
    ):
        ratio = ours[key] / vllm_own[key]
        print(f"   {label:22s} {vllm_own[key]:13.2f} {ours[key]:11.2f} {ratio:6.2f}x")
    print(
        f"   start-up grows by {ours['start_s'] - vllm_own['start_s']:.1f} s (the kernels' "
        "compilation, once per machine)"
    )
    print(f"   load average over the run: {min(loads):.2f} to {max(loads):.2f}")


def main(argv: list[str] | None = None) -> int:
    """Parse the options; deploy once (``--child``) or compare the two deployments."""
    default = Path(__file__).resolve().parents[1] / "specsample/models/default/target"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(default), help="model directory")
    parser.add_argument("--dtype", default="float32", help="vLLM's dtype (default float32)")
    parser.add_argument("--rounds", type=int, default=3, help="deployments of each (default 3)")
    parser.add_argument("--calls", type=int, default=6, help="generate calls each (default 6)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per call (default 16)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per prompt (64)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(_child(args)), flush=True)
        return 0
    if args.calls < 2:
        parser.error("--calls must be at least 2 (the first call, then later ones)")
    try:
        import vllm
    except ImportError as error:
        return skip(f"vLLM cannot be imported ({error})")
    busy = cpu_busy()
    print(f"== vLLM {vllm.__version__}, cold kernel cache, n-gram k=4, on {cpu_description()}")
    print(f"   CPUs busy before the start: {busy:.0%}" if busy is not None else "", end="")
    print(
        f"; {args.rounds} rounds, {args.calls} calls of {args.prompts} x {args.max_tokens} "
        "tokens at T = 1"
    )
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for plugin in (False, True) if round_ % 2 == 0 else (True, False):
            try:
                runs[plugin].append(_deploy(args, plugin))
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
            loads.append(os.getloadavg()[0])
    _report(runs, loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
