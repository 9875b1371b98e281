"""Speculative generation against target-only generation, with the shipped default pair.

For every temperature and batch size, target-only and speculative decoding generate the same
prompts (eight fixed Python snippets, ``--max-new-tokens`` each), alternately,
``--repeats`` times; the table reports medians of ratios measured in this run:

* ``speedup``: speculative tokens/s over target-only tokens/s (tokens per second, because a
  sampled sequence may stop at EOS after a different length in the two modes);
* ``batch scaling``: tokens/s of this batch size over tokens/s of batch size 1, same mode;
* ``tokens/forward``: generated tokens per target forward of one sequence;
* ``same tokens``: whether both modes generated the same tokens in every run (expected at
  temperature 0, up to float32 near-ties between logits computed in different batch shapes;
  at temperature 1 speculative sampling reproduces the law, not the draws);
* ``others``: the CPU share other processes used during the runs (a busy machine skews
  every ratio).

Batch size 1 decodes the eight prompts one after the other; batch size 8 decodes them
together. Run ``python benchmarks/bench_generate.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import torch

from specsample.bench import CpuShare
from specsample.generate import NGramDrafter, hf, speculative_generate, target_generate

PROMPTS = (
    "def parse(text):",
    "import os\nimport sys\n\n\ndef main():",
    "class Node:\n    def __init__(self, value):",
    "    for key, value in items:",
    "def read_file(path):\n    with open(path) as f:",
    "        if not isinstance(name, str):",
    "    def __repr__(self):",
    "    except KeyError:",
)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["chain", "block"],
        help="rules for sampled runs (greedy runs use chain)",
    )
    parser.add_argument("-k", type=int, default=4, help="drafts per step (default 4)")
    parser.add_argument(
        "--adaptive", action="store_true", help="choose each step's draft length in 0..k"
    )
    parser.add_argument(
        "--ngram", action="store_true", help="draft by prompt lookup instead of the draft model"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode (median)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    return parser.parse_args(argv)


def _run(
    target: Any, draft: Any, prompts: list[list[int]], mode: str, args: Any, common: dict
) -> Any:
    """One generation run of ``mode``; its ``GenerationOutput``."""
    if mode == "target-only":
        return target_generate(target, prompts, **common)
    drafter = NGramDrafter() if args.ngram else draft
    return speculative_generate(
        target, prompts, drafter, k=args.k, adaptive=args.adaptive, **common
    )


def main(argv: list[str] | None = None) -> int:
    """Print the table; return 0."""
    args = _arguments(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    pair = hf.default_pair()
    if pair is None:
        print("the default model pair is not installed", file=sys.stderr)
        return 1
    tokenizer = hf.load_tokenizer(pair[0])
    target = hf.load_model(pair[0], role="target")
    draft = hf.load_model(pair[1], role="draft")
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    print(
        f"{len(prompts)} prompts x {args.max_new_tokens} new tokens, k={args.k}"
        f"{' (adaptive)' if args.adaptive else ''}, {'n-gram' if args.ngram else 'model'} drafts, "
        f"{torch.get_num_threads()} torch threads, median of {args.repeats} runs per mode"
    )
    print(
        "| temperature | method | batch | speedup | batch scaling (spec / target-only) "
        "| tokens/forward | same tokens | others |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for temperature in args.temperatures:
        methods = args.methods if temperature > 0 else ["chain"]
        for method in methods:
            single: dict[str, float] = {}
            for batch in args.batch_sizes:
                common = {
                    "temperature": temperature,
                    "max_new_tokens": args.max_new_tokens,
                    "eos_token_id": tokenizer.eos_token_id,
                    "seeds": 0,
                    "max_batch_size": batch,
                }
                warm = {**common, "max_new_tokens": 4}
                _run(target, draft, prompts[:batch], "speculative", args, warm)
                target_generate(target, prompts[:batch], **warm)
                rates: dict[str, list[float]] = {"target-only": [], "speculative": []}
                per_forward = []
                same = True
                with CpuShare() as share:
                    for _ in range(args.repeats):
                        outputs = {
                            mode: _run(
                                target,
                                draft,
                                prompts,
                                mode,
                                args,
                                {**common, "method": method} if mode == "speculative" else common,
                            )
                            for mode in rates
                        }
                        for mode, output in outputs.items():
                            rates[mode].append(output.stats.tokens_per_s)
                        per_forward.append(outputs["speculative"].stats.tokens_per_forward)
                        same &= outputs["speculative"].sequences == outputs["target-only"].sequences
                speed = {mode: statistics.median(v) for mode, v in rates.items()}
                single = single or speed
                others = "?" if share.share is None else f"{share.share:.0%}"
                print(
                    f"| {temperature:g} | {method} | {batch} "
                    f"| **{speed['speculative'] / speed['target-only']:.2f}x** "
                    f"| {speed['speculative'] / single['speculative']:.2f}x / "
                    f"{speed['target-only'] / single['target-only']:.2f}x "
                    f"| {statistics.median(per_forward):.2f} | {'yes' if same else 'no'} "
                    f"| {others} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
