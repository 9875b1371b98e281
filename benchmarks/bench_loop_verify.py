"""Verification at the generation loop's shapes: temperature 1 against temperature 0, per backend.

The loop verifies ``[batch, k + 1, vocab]`` target logits with ``k = 5`` drafts and the
draft model's float32 probabilities once per step, with warm caches (the forward pass just
wrote them).
This times ``specsample.verify`` there, for the shipped pair's vocabulary (4096) and
SmolLM2's (49152), at batch 1 and 8, at temperature 0 (greedy) and 1 (sampled), on every
backend that runs here, in alternated rounds, and reports medians and the ratio of
temperature 1 to temperature 0 measured in the same run: the median over rounds of each
round's ratio, which a machine whose speed drifts between rounds moves less than a ratio of
medians.

Usage: python benchmarks/bench_loop_verify.py [--rounds 21] [--calls 30] [--threads 2]
[--shapes 1x5x4096 ...]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable

import torch

from specsample import verify
from specsample.backends import resolve
from specsample.cli.args import int_in_range
from specsample.cli.bench import parse_shape
from specsample.kernels.cpu import compiler

SHAPES = ((1, 5, 4096), (8, 5, 4096), (1, 5, 49152), (8, 5, 49152))


def _inputs(batch: int, k: int, vocab: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(batch * (k + 1), vocab, generator=gen) * 3
    draft = target.view(batch, k + 1, vocab)[:, :k].reshape(-1, vocab) + torch.randn(
        batch * k, vocab, generator=gen
    )
    probs = torch.softmax(draft, -1)
    drafts = probs.multinomial(1, generator=gen).view(-1)
    return target, probs, drafts


def _median_us(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Time every shape, temperature and backend; print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int_in_range(1), default=21, help="alternated rounds (default 21)"
    )
    parser.add_argument(
        "--calls", type=int_in_range(1), default=30, help="timed calls per round (default 30)"
    )
    parser.add_argument(
        "--threads", type=int_in_range(1), default=None, help="torch CPU threads (default: its own)"
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        metavar="BxKxV",
        default=list(SHAPES),
        help="batch x drafts x vocabulary shapes (default: 1 and 8 x 5 x 4096 and 49152)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    compiler.warm_up()
    backends = ["torch"] + (["cpu"] if resolve("auto", torch.zeros(1)) == "cpu" else [])
    print(
        f"verify at the loop's shapes (k = 5, draft probabilities), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; median of {args.rounds} rounds of {args.calls} "
        "calls, backends and temperatures alternated; T=1/T=0 the median of the rounds' ratios"
    )
    print(f"{'batch':>5} {'vocab':>6} {'backend':>7} | {'T=0 us':>8} {'T=1 us':>8} | T=1/T=0")
    for batch, k, vocab in args.shapes:
        target, draft, drafts = _inputs(batch, k, vocab)
        counts = [k] * batch
        runs: dict[tuple[str, float], list[float]] = {}
        for _ in range(args.rounds):
            for backend in backends:
                for temperature in (0.0, 1.0):
                    call = functools.partial(
                        verify,
                        target,
                        drafts,
                        counts,
                        draft_probs=draft,
                        temperature=temperature,
                        backend=backend,
                    )
                    call()
                    runs.setdefault((backend, temperature), []).append(_median_us(call, args.calls))
        for backend in backends:
            greedy = statistics.median(runs[(backend, 0.0)])
            sampled = statistics.median(runs[(backend, 1.0)])
            ratio = statistics.median(
                [t1 / t0 for t0, t1 in zip(runs[(backend, 0.0)], runs[(backend, 1.0)], strict=True)]
            )
            print(
                f"{batch:>5} {vocab:>6} {backend:>7} | {greedy:>8.0f} {sampled:>8.0f} | "
                f"{ratio:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
