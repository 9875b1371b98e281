"""Tree drafting against chain drafting, with the shipped default pair, in one process.

Every contestant generates the same prompts (``--prompts``, cycled from the eight snippets
of ``bench_generate.py``), ``--max-new-tokens`` each, at temperatures 0 and 1, at every batch
size of ``--batch-sizes`` (continuous batching):

* ``chain k=K``: :func:`~specsample.generate.speculative_generate` with ``-k`` drafts every
  step (fixed, token-by-token rule);
* ``tree``: a tree of ``--tree`` nodes (:meth:`~specsample.generate.TreeShape.for_budget`,
  or ``--shape``) drafted without replacement and verified by recursive rejection sampling
  (temperature 0: the draft's top children, followed along the target's argmax);
* ``tree traversal``: the same tree drafted i.i.d. and verified by traversal verification
  (temperature 1 only; at temperature 0 every rule is the greedy walk).

Contestants alternate in rounds whose order rotates; every call is timed around the whole
call. The table reports, per temperature and batch size, the medians over the rounds of
tokens/s and of tokens per target forward (per sequence), and both as ratios to the chain.
The header gives the command line and the share of the CPUs other processes used.

The default run (``--threads 1``, 8 prompts x 128 tokens, batch sizes 1 and 8, 3 rounds)
takes about 5 minutes on an idle 2-core machine (a round about 85 s).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
from bench_generate import _cycled, _rotated, _table, _x
from model_loading import load_default_pair

from specsample.bench import CpuShare
from specsample.generate import TreeShape, speculative_generate
from specsample.methods import tree_method, tree_methods
from specsample.timing import Stopwatch

Run = Callable[[int], tuple[int, float]]
"""Generate ``max_new_tokens`` per prompt: ``(tokens, tokens per target forward)``."""


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[1, 8],
        help="batch sizes, continuous batching (default 1 8)",
    )
    parser.add_argument("-k", type=int, default=4, help="chain drafts per step (default 4)")
    parser.add_argument("--tree", type=int, default=16, help="tree nodes (default 16)")
    parser.add_argument(
        "--shape", type=int, nargs="+", help="children per depth (overrides --tree)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="new tokens per prompt (default 128)"
    )
    parser.add_argument(
        "--prompts", type=int, default=8, help="prompts, the snippets cycled (default 8)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed runs of each contestant (default 3)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    return parser.parse_args(argv)


def _contestants(
    args: argparse.Namespace, target: Any, draft: Any, prompts: list[list[int]]
) -> dict[tuple[float, int, str], Run]:
    """Every ``(temperature, batch, name)`` and the call that runs it."""
    shape = TreeShape.for_budget(args.tree) if args.shape is None else TreeShape.build(args.shape)
    found: dict[tuple[float, int, str], Run] = {}
    for temperature in (0.0, 1.0):
        tree_rule = tree_method(_drafting(temperature))
        variants: dict[str, dict[str, Any]] = {
            f"chain k={args.k}": {"k": args.k, "adaptive": False},
            "tree": {
                "tree": TreeShape(shape.branching, _drafting(temperature)),
                "method": tree_rule,
            },
        }
        if temperature and "traversal" in tree_methods():
            variants["tree traversal"] = {
                "tree": TreeShape(shape.branching, "iid"),
                "method": "traversal",
            }
        for batch in args.batch_sizes:
            for name, options in variants.items():
                found[(temperature, batch, name)] = _runner(
                    target, draft, prompts, temperature, batch, options
                )
    return found


def _drafting(temperature: float) -> str:
    return "without_replacement" if temperature else "deterministic"


def _runner(
    target: Any,
    draft: Any,
    prompts: list[list[int]],
    temperature: float,
    batch: int,
    options: dict[str, Any],
) -> Run:
    def run(max_new_tokens: int) -> tuple[int, float]:
        out = speculative_generate(
            target,
            prompts,
            draft,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            max_batch_size=batch,
            seeds=0,
            **options,
        )
        return out.stats.tokens, out.stats.tokens_per_forward

    return run


def _measure(
    runs: dict[tuple[float, int, str], Run], args: argparse.Namespace
) -> tuple[dict[tuple[float, int, str], tuple[float, float]], float | None]:
    """Median tokens/s and tokens per forward of every contestant; other processes' CPU share."""
    for run in runs.values():
        run(4)
    seen: dict[tuple[float, int, str], list[tuple[float, float]]] = {key: [] for key in runs}
    items = list(runs.items())
    started = Stopwatch()
    with CpuShare() as share:
        for round_index in range(args.rounds):
            for key, run in _rotated(items, round_index, args.rounds):
                watch = Stopwatch()
                tokens, per_forward = run(args.max_new_tokens)
                seen[key].append((tokens / watch.elapsed(), per_forward))
            print(
                f"round {round_index + 1}/{args.rounds} done, {started.elapsed():.0f} s",
                file=sys.stderr,
                flush=True,
            )
    medians = {
        key: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values))
        for key, values in seen.items()
    }
    return medians, share.share


def main(argv: list[str] | None = None) -> int:
    """Time every contestant and print the table; return 0 (also when skipped for lack of
    transformers, :func:`model_loading.load_default_pair`)."""
    args = _arguments(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_default_pair()
    if loaded is None:
        return 0
    tokenizer, target, draft = loaded
    runs = _contestants(args, target, draft, _cycled(args.prompts, tokenizer))
    medians, load = _measure(runs, args)
    shape = TreeShape.for_budget(args.tree) if args.shape is None else TreeShape.build(args.shape)
    command = shlex.join(
        ["python", "benchmarks/bench_tree.py", *(sys.argv[1:] if argv is None else argv)]
    )
    lines = [
        f"`{command}`: {args.prompts} prompts x {args.max_new_tokens} tokens, tree "
        f"{list(shape.branching)} ({shape.nodes} nodes), medians of {args.rounds} rounds"
        + ("" if load is None else f", other processes {load:.0%} of the CPUs"),
        "",
    ]
    rows = []
    chain = f"chain k={args.k}"
    for (temperature, batch, name), (rate, per_forward) in medians.items():
        base_rate, base_forward = medians[(temperature, batch, chain)]
        rows.append(
            [
                f"{temperature:g}",
                str(batch),
                name,
                f"{rate:.1f}",
                _x(rate / base_rate),
                f"{per_forward:.2f}",
                _x(per_forward / base_forward),
            ]
        )
    header = ["T", "batch", "contestant", "tokens/s", "/ chain", "tokens/forward", "/ chain"]
    print("\n".join([*lines, *_table(header, rows)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
