"""``specsample demo``: exactness on toy families, then a short cold-cache speed table.

:class:`specsample.sampler.RejectionSampler` is checked for exactness on the toy draft/target
families :data:`FAMILIES` (see :mod:`specsample.testing`), one table of statistical tests per
family, then timed on :data:`SPEED_SHAPES` (see :mod:`specsample.bench`). The exit status is
1 when a family fails its tests.
"""

from __future__ import annotations

import argparse
from typing import Any

from specsample.bench import format_table, run_benchmark
from specsample.cli.args import (
    add_rows_argument,
    add_seed_and_plot_arguments,
    add_vocab_argument,
    check_vocab,
    int_in_range,
    probability,
)
from specsample.sampler import RejectionSampler
from specsample.testing import exactness_report, make_family
from specsample.testing.compare import MAX_K

FAMILIES = ("random", "sparse", "equal", "markov", "peaked")
"""Toy families the demo checks (see :func:`specsample.testing.make_family`)."""

SPEED_SHAPES = ((8, 4, 32000), (64, 4, 128256))
"""``(batch, k, vocab)`` of the speed table."""


def add_parser(commands: Any) -> None:
    """Add the ``demo`` command to the subparsers ``commands``."""
    demo = commands.add_parser(
        "demo",
        help="check exactness on toy families, then print a short speed table",
        description="Check RejectionSampler for exactness on toy draft/target families "
        f"({', '.join(FAMILIES)}), then time it on "
        + " and ".join("x".join(map(str, s)) for s in SPEED_SHAPES)
        + " with cold caches.",
    )
    add_rows_argument(demo, "sequences per family", 100_000)
    demo.add_argument(
        "--k",
        type=int_in_range(1, MAX_K),
        default=4,
        help=f"drafts per sequence (default 4, at most {MAX_K})",
    )
    add_vocab_argument(demo, "vocabulary of the toy families")
    demo.add_argument(
        "--alpha",
        type=probability,
        default=1e-4,
        help="family-wise false-failure rate of each family's tests (default 1e-4)",
    )
    add_seed_and_plot_arguments(demo, seed="seed of families and draws")
    demo.add_argument("--no-speed", action="store_true", help="skip the speed table")


def check(args: argparse.Namespace) -> None:
    """Refuse a ``--vocab`` too large for ``--k`` (see :func:`specsample.cli.args.check_vocab`).

    Raises
    ------
    ValueError
        The toy tables would exceed their bound; the message names both flags.
    """
    check_vocab(args.vocab, args.k)


def run(args: argparse.Namespace) -> int:
    """Run ``specsample demo`` as :func:`add_parser` configured it: the exit status, 0 or 1.

    The status is 1 when a family fails its exactness tests.
    """
    print(
        f"Exactness of RejectionSampler: {args.rows} sequences per family, k={args.k}, "
        f"vocab={args.vocab}; each family passes when all its tests pass at family-wise "
        f"false-failure rate {args.alpha:g}.\n",
        flush=True,
    )
    failed = []
    for index, name in enumerate(FAMILIES):
        family = make_family(name, k=args.k, vocab=args.vocab, seed=args.seed + index)
        report = exactness_report(RejectionSampler(), family, rows=args.rows, seed=args.seed)
        print(report.format(args.alpha), end="\n\n", flush=True)
        if not report.passed(args.alpha):
            failed.append(name)
    print(
        f"exactness: {len(FAMILIES) - len(failed)}/{len(FAMILIES)} families passed"
        + (f" (failed: {', '.join(failed)})" if failed else ""),
        end="\n\n",
        flush=True,
    )
    if not args.no_speed:
        rows = run_benchmark(SPEED_SHAPES, repeats=3, slow_repeats=1)
        print(format_table(rows))
    return 1 if failed else 0
