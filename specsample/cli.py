"""The ``specsample`` command: ``demo``, ``bench`` and ``compare``.

``demo`` checks :class:`specsample.sampler.RejectionSampler` for exactness on several toy
draft/target families (see :mod:`specsample.testing`), printing one table of statistical
tests per family, then prints a short cold-cache speed table (see :mod:`specsample.bench`).
``bench`` runs the full benchmark. ``compare`` verifies the same drafts with every rule and
reports tokens per verification step (see :mod:`specsample.compare`). Errors are reported on
one line and give a non-zero exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specsample import bench
from specsample.sampler import RejectionSampler

__all__ = ["DEMO_FAMILIES", "main"]

DEMO_FAMILIES = ("random", "sparse", "equal", "markov", "peaked")
"""Toy families the demo checks (see :func:`specsample.testing.make_family`)."""

_DEMO_SHAPES = ((8, 4, 32000), (64, 4, 128256))


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {value}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specsample",
        description="Exact, fast verification for speculative decoding.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    demo = commands.add_parser(
        "demo",
        help="check exactness on toy families, then print a short speed table",
        description="Check RejectionSampler for exactness on toy draft/target families "
        f"({', '.join(DEMO_FAMILIES)}), then time it on "
        + " and ".join("x".join(map(str, s)) for s in _DEMO_SHAPES)
        + " with cold caches.",
    )
    positive = bench.parse_positive_int
    demo.add_argument(
        "--rows", type=positive, default=100_000, help="sequences per family (default 100000)"
    )
    demo.add_argument("--k", type=positive, default=4, help="drafts per sequence (default 4)")
    demo.add_argument(
        "--vocab", type=positive, default=8, help="vocabulary of the toy families (default 8)"
    )
    demo.add_argument(
        "--alpha",
        type=_probability,
        default=1e-4,
        help="family-wise false-failure rate of each family's tests (default 1e-4)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of families and draws (default 0)")
    demo.add_argument("--no-speed", action="store_true", help="skip the speed table")

    bench_parser = commands.add_parser(
        "bench",
        help="cold-cache latency and peak memory against the naive reference",
        description="Time RejectionSampler, the naive reference, transformers' "
        "_speculative_sampling (when installed) and the memory-read floor, with cold caches.",
    )
    bench.add_arguments(bench_parser)

    compare = commands.add_parser(
        "compare",
        help="tokens per verification step of chain, block, tree and typical verification",
        description="Verify the same drafts with every rule and report the mean tokens per "
        "verification step (95% CI) against k, with the exact value where known.",
    )
    compare.add_argument(
        "--families",
        nargs="+",
        default=["random", "markov", "peaked", "zipf"],
        help="toy families (see specsample.testing.make_family)",
    )
    compare.add_argument(
        "--k", nargs="+", type=positive, default=[1, 2, 3, 4, 5], help="draft lengths"
    )
    compare.add_argument("--rows", type=positive, default=20_000, help="steps per point")
    compare.add_argument("--vocab", type=positive, default=8, help="vocabulary (default 8)")
    compare.add_argument("--branching", type=positive, default=2, help="children per tree node")
    compare.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    compare.add_argument("--plot", metavar="FILE.png", help="save tokens per step against k")
    return parser


def _compare(args: argparse.Namespace) -> int:
    from specsample.compare import compare_rules, format_comparison, plot_comparison

    results = compare_rules(
        args.families,
        args.k,
        rows=args.rows,
        vocab=args.vocab,
        branching=args.branching,
        seed=args.seed,
    )
    print(format_comparison(results))
    if args.plot:
        print(f"plot written to {plot_comparison(results, args.plot)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from specsample.testing import exactness_report, make_family

    print(
        f"Exactness of RejectionSampler: {args.rows} sequences per family, k={args.k}, "
        f"vocab={args.vocab}; each family passes when all its tests pass at family-wise "
        f"false-failure rate {args.alpha:g}.\n"
    )
    failed = []
    for index, name in enumerate(DEMO_FAMILIES):
        family = make_family(name, k=args.k, vocab=args.vocab, seed=args.seed + index)
        report = exactness_report(RejectionSampler(), family, rows=args.rows, seed=args.seed)
        print(report.format(args.alpha), end="\n\n", flush=True)
        if not report.passed(args.alpha):
            failed.append(name)
    print(
        f"exactness: {len(DEMO_FAMILIES) - len(failed)}/{len(DEMO_FAMILIES)} families passed"
        + (f" (failed: {', '.join(failed)})" if failed else ""),
        end="\n\n",
        flush=True,
    )
    if not args.no_speed:
        rows = bench.run_benchmark(_DEMO_SHAPES, repeats=3, slow_repeats=1)
        print(bench.format_table(rows))
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``specsample`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments after the program name (``sys.argv[1:]`` by default).

    Returns
    -------
    int
        Exit status: 0 on success (and for ``--help``), 1 when the demo finds a family that
        fails its exactness tests or the command fails, 2 for a usage error, 130 when
        interrupted.

    Examples
    --------
    >>> main(["bench", "--shapes", "2x0x8"])
    2
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "compare":
            return _compare(args)
        return bench.run_from_args(args)
    except KeyboardInterrupt:
        print("specsample: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, RuntimeError, OSError, ImportError) as exc:
        print(f"specsample {args.command}: error: {exc}", file=sys.stderr)
        return 1
