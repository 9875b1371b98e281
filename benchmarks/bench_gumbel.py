"""What drafter-invariant sampling costs: ``method="gumbel"`` beside ``"chain"``, shipped pair.

Every contestant generates the same seeded prompts (``--prompts``, cycled from the generation
benchmark's snippets), ``--max-new-tokens`` each, at ``--temperature`` (default 1):

* ``target``: :func:`~specsample.generate.target_generate` (seeded, so it samples the keyed
  Gumbel-max tokens that ``method="gumbel"`` reproduces);
* for each drafter (the shipped draft model, :class:`~specsample.generate.NGramDrafter`) and
  each method (``chain``, ``gumbel``): :func:`~specsample.generate.speculative_generate` with
  ``-k`` drafts a step (``fixed``) and with the adaptive draft length (``adaptive``).

Each contestant is warmed up once, then runs once per round for ``--rounds`` rounds, in an
order that rotates between rounds; round ``r`` seeds prompt ``i`` with ``1000 r + i`` for
every contestant. The table gives, per contestant, the median tokens/s, the median tokens per
target forward of a sequence (the drafts accepted plus one), the median over rounds of the
ratio of ``gumbel`` to ``chain`` tokens/s (same drafter and mode, same round), and in how
many rounds the gumbel text equalled the target-only text. The header names the CPU (model
and vector extensions), the torch threads and the share of the CPUs other processes used.

Run ``python benchmarks/bench_gumbel.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import statistics
import sys
from typing import Any

import torch
from bench_generate import PROMPTS
from model_loading import load_default_pair
from vllm_e2e import cpu_description

from specsample.bench.measure import CpuShare
from specsample.generate import NGramDrafter, PolicyMemory, speculative_generate, target_generate
from specsample.timing import Stopwatch

TARGET = "target"
METHODS = ("chain", "gumbel")
MODES = ("fixed", "adaptive")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", type=int, default=4, help="drafts per step (default 4)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts (default 8)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=96, help="new tokens per prompt (default 96)"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="default 1")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    return parser.parse_args(argv)


class Run:
    """One contestant: a name and a call that returns the sequences and the generation stats."""

    def __init__(self, name: str, call: Any) -> None:
        self.name = name
        self.call = call
        self.rates: list[float] = []
        self.per_forward: list[float] = []
        self.texts: list[list[list[int]]] = []

    def time(self, prompts: list[list[int]], seed: int, tokens: int, keep: bool) -> None:
        """One call with seeds ``seed + i``; its figures kept when ``keep``."""
        watch = Stopwatch()
        out = self.call(prompts, seed, tokens)
        elapsed = watch.elapsed()
        if keep:
            self.rates.append(out.stats.tokens / elapsed)
            self.per_forward.append(out.stats.tokens_per_forward)
            self.texts.append(out.sequences)


def _contestants(args: argparse.Namespace, target: Any, draft: Any) -> list[Run]:
    common = {"temperature": args.temperature}

    def plain(prompts: list[list[int]], seed: int, tokens: int) -> Any:
        return target_generate(target, prompts, seeds=seed, max_new_tokens=tokens, **common)

    runs = [Run(TARGET, plain)]
    drafters = {"model": draft, "n-gram": NGramDrafter()}
    for (kind, drafter), method, mode in itertools.product(drafters.items(), METHODS, MODES):
        memory = PolicyMemory()

        def call(
            prompts: list[list[int]],
            seed: int,
            tokens: int,
            drafter: Any = drafter,
            method: str = method,
            mode: str = mode,
            memory: PolicyMemory = memory,
        ) -> Any:
            return speculative_generate(
                target,
                prompts,
                drafter,
                k=args.k,
                method=method,
                adaptive=mode == "adaptive",
                memory=memory,
                seeds=seed,
                max_new_tokens=tokens,
                **common,
            )

        runs.append(Run(f"{kind} {method} {mode}", call))
    return runs


def _measure(runs: list[Run], prompts: list[list[int]], args: argparse.Namespace) -> float | None:
    """Warm every contestant up, then time the rounds; the CPU share of other processes."""
    for run in runs:
        run.time(prompts, 0, 8, keep=False)
    with CpuShare() as share:
        for round_index in range(args.rounds):
            shift = round_index % len(runs)
            for run in runs[shift:] + runs[:shift]:
                run.time(prompts, 1000 * (round_index + 1), args.max_new_tokens, keep=True)
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return share.share


def _report(runs: list[Run]) -> list[str]:
    by_name = {run.name: run for run in runs}
    reference = by_name[TARGET].texts
    lines = [
        "| contestant | tokens/s | tokens per forward | gumbel / chain | text = target-only |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        ratio = same = "-"
        if " gumbel " in f" {run.name} ":
            chain = by_name[run.name.replace("gumbel", "chain")]
            ratios = [g / c for g, c in zip(run.rates, chain.rates, strict=True)]
            ratio = f"**{statistics.median(ratios):.2f}x**"
            equal = sum(text == ref for text, ref in zip(run.texts, reference, strict=True))
            same = f"{equal}/{len(reference)} rounds"
        rate, per_forward = statistics.median(run.rates), statistics.median(run.per_forward)
        lines.append(f"| {run.name} | {rate:.1f} | {per_forward:.2f} | {ratio} | {same} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the table; return 0 (without transformers the script is skipped)."""
    args = _arguments(argv)
    loaded = load_default_pair()
    if loaded is None:
        return 0
    tokenizer, target, draft = loaded
    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        prompts = [
            tokenizer.encode(p) for p in itertools.islice(itertools.cycle(PROMPTS), args.prompts)
        ]
        runs = _contestants(args, target, draft)
        share = _measure(runs, prompts, args)
    finally:
        torch.set_num_threads(before)
    command = shlex.join(["python", sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"`{command}`\n")
    print(
        f"CPU: {cpu_description()}; {args.threads} torch threads; T={args.temperature}, "
        f"{args.prompts} prompts x {args.max_new_tokens} tokens, k={args.k}, medians of "
        f"{args.rounds} rounds; other processes used "
        f"{'unknown' if share is None else f'{share:.0%}'} of the CPUs.\n"
    )
    print("\n".join(_report(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
