"""The ``specsample`` command: ``demo``, ``bench``, ``compare`` and ``generate``.

``demo`` checks :class:`specsample.sampler.RejectionSampler` for exactness on several toy
draft/target families (see :mod:`specsample.testing`), printing one table of statistical
tests per family, then prints a short cold-cache speed table (see :mod:`specsample.bench`).
``bench`` runs the full benchmark. ``compare`` verifies the same drafts with every rule and
reports tokens per verification step (see :mod:`specsample.compare`). ``generate`` runs
batched speculative decoding with a target/draft pair of causal LMs, or prompt lookup (see
:mod:`specsample.generate` and :mod:`specsample.generate.command`), streams the text and
prints the run's statistics. Errors are
reported on one line and give a non-zero exit status.

Every option that sizes the work is bounded, and ``--help`` states the bound: out of range,
the command refuses at once (a usage error, exit status 2) rather than running out of memory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from specsample import bench, compare
from specsample.generate import command as generate_command
from specsample.sampler import RejectionSampler
from specsample.testing import MAX_TABLE_ENTRIES, exactness_report, make_family

DEMO_FAMILIES = ("random", "sparse", "equal", "markov", "peaked")
"""Toy families the demo checks (see :func:`specsample.testing.make_family`)."""

_DEMO_SHAPES = ((8, 4, 32000), (64, 4, 128256))

_TABLE = f"(k + 1) * vocab**2 <= 2**{MAX_TABLE_ENTRIES.bit_length() - 1}"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line: the error, and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {value}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specsample",
        description="Exact, fast verification for speculative decoding.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    _add_demo_parser(commands)
    _add_bench_parser(commands)
    _add_compare_parser(commands)
    _add_generate_parser(commands)
    return parser


def _add_demo_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="check exactness on toy families, then print a short speed table",
        description="Check RejectionSampler for exactness on toy draft/target families "
        f"({', '.join(DEMO_FAMILIES)}), then time it on "
        + " and ".join("x".join(map(str, s)) for s in _DEMO_SHAPES)
        + " with cold caches.",
    )
    demo.add_argument(
        "--rows",
        type=bench.int_in_range(1, compare.MAX_ROWS),
        default=100_000,
        help=f"sequences per family (default 100000, at most {compare.MAX_ROWS})",
    )
    demo.add_argument(
        "--k",
        type=bench.int_in_range(1, compare.MAX_K),
        default=4,
        help=f"drafts per sequence (default 4, at most {compare.MAX_K})",
    )
    demo.add_argument(
        "--vocab",
        type=bench.int_in_range(2, MAX_TABLE_ENTRIES),
        default=8,
        help=f"vocabulary of the toy families (default 8; {_TABLE})",
    )
    demo.add_argument(
        "--alpha",
        type=_probability,
        default=1e-4,
        help="family-wise false-failure rate of each family's tests (default 1e-4)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of families and draws (default 0)")
    demo.add_argument("--no-speed", action="store_true", help="skip the speed table")


def _add_bench_parser(commands: Any) -> None:
    bench_parser = commands.add_parser(
        "bench",
        help="cold-cache latency and peak memory against the naive reference",
        description="Time RejectionSampler, the naive reference, transformers' "
        "_speculative_sampling (when installed) and the memory-read floor, with cold caches.",
    )
    bench.add_arguments(bench_parser)


def _add_compare_parser(commands: Any) -> None:
    rules = ", ".join(compare.RULES[:-1]) + " and " + compare.RULES[-1]
    compare_parser = commands.add_parser(
        "compare",
        help=f"tokens per verification step of {rules} verification",
        description="Verify the same drafts with every rule and report the mean tokens per "
        "verification step (95% CI) against k, with the exact value where known.",
    )
    compare_parser.add_argument(
        "--families",
        nargs="+",
        default=["random", "markov", "peaked", "zipf"],
        help="toy families (see specsample.testing.make_family)",
    )
    compare_parser.add_argument(
        "--k",
        nargs="+",
        type=bench.int_in_range(1, compare.MAX_K),
        default=[1, 2, 3, 4, 5],
        help=f"draft lengths (tree depths), each at most {compare.MAX_K}",
    )
    compare_parser.add_argument(
        "--rows",
        type=bench.int_in_range(2, compare.MAX_ROWS),
        default=20_000,
        help=f"steps per point (default 20000, at most {compare.MAX_ROWS})",
    )
    compare_parser.add_argument(
        "--vocab",
        type=bench.int_in_range(2, MAX_TABLE_ENTRIES),
        default=8,
        help=f"vocabulary (default 8; {_TABLE} for the largest k)",
    )
    compare_parser.add_argument(
        "--branching",
        type=bench.int_in_range(1, compare.MAX_TREE_NODES),
        default=2,
        help="children per tree node (default 2); a tree has at most "
        f"{compare.MAX_TREE_NODES} nodes, branching + ... + branching**k",
    )
    compare_parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    compare_parser.add_argument("--plot", metavar="FILE.png", help="save tokens per step against k")


def _add_generate_parser(commands: Any) -> None:
    """The ``generate`` command (its options: :mod:`specsample.generate.command`)."""
    generate = commands.add_parser(
        "generate",
        help="generate text with batched speculative decoding",
        description="Generate from a target causal LM with speculative decoding: a draft model "
        "(--draft) or prompt lookup (--ngram) proposes k tokens, one target forward scores them "
        "and exact verification keeps the target's distribution. Without --target, the default "
        "pair installed under specsample/models/default is used.",
    )
    generate_command.add_arguments(generate)


def _compare(args: argparse.Namespace) -> int:
    results = compare.compare_rules(
        args.families,
        args.k,
        rows=args.rows,
        vocab=args.vocab,
        branching=args.branching,
        seed=args.seed,
    )
    print(compare.format_comparison(results))
    if args.plot:
        print(f"plot written to {compare.plot_comparison(results, args.plot)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
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
        if args.command == "generate":
            return generate_command.run_from_args(args)
        return bench.run_from_args(args)
    except KeyboardInterrupt:
        print("specsample: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, RuntimeError, OSError, ImportError) as exc:
        print(f"specsample {args.command}: error: {exc}", file=sys.stderr)
        return 1
