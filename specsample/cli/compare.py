"""``specsample compare``: tokens per verification step of every rule, on the same drafts.

The rules (:data:`specsample.testing.compare.RULES`, named by :mod:`specsample.methods`)
verify the same drafts of toy families (see :mod:`specsample.testing.compare`); the table
gives the mean tokens per step (95% CI) against ``k``, with the exact value where known.
"""

from __future__ import annotations

import argparse
from typing import Any

from specsample.cli.args import (
    add_rows_argument,
    add_seed_and_plot_arguments,
    add_vocab_argument,
    int_in_range,
)
from specsample.methods import MAX_SIMULATED_TREE_NODES
from specsample.testing.compare import (
    MAX_K,
    RULES,
    compare_rules,
    format_comparison,
    plot_comparison,
)


def add_parser(commands: Any) -> None:
    """Add the ``compare`` command to the subparsers ``commands``."""
    rules = ", ".join(RULES[:-1]) + " and " + RULES[-1]
    parser = commands.add_parser(
        "compare",
        help=f"tokens per verification step of {rules} verification",
        description="Verify the same drafts with every rule and report the mean tokens per "
        "verification step (95% CI) against k, with the exact value where known.",
    )
    parser.add_argument(
        "--families",
        nargs="+",
        default=["random", "markov", "peaked", "zipf"],
        help="toy families (see specsample.testing.make_family)",
    )
    parser.add_argument(
        "--k",
        nargs="+",
        type=int_in_range(1, MAX_K),
        default=[1, 2, 3, 4, 5],
        help=f"draft lengths (tree depths), each at most {MAX_K}",
    )
    add_rows_argument(parser, "steps per point", 20_000, low=2)
    add_vocab_argument(parser, "vocabulary", " for the largest k")
    parser.add_argument(
        "--branching",
        type=int_in_range(1, MAX_SIMULATED_TREE_NODES),
        default=2,
        help="children per tree node (default 2); a tree has at most "
        f"{MAX_SIMULATED_TREE_NODES} nodes, branching + ... + branching**k",
    )
    add_seed_and_plot_arguments(parser, seed="seed", plot="tokens per step against k")


def run(args: argparse.Namespace) -> int:
    """Run ``specsample compare`` as :func:`add_parser` configured it: the exit status, 0."""
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
