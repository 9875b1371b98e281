"""``specsample compare``: tokens per verification step of every rule, on the same drafts.

The rules (:data:`specsample.testing.compare.RULES`, named by :mod:`specsample.methods`)
verify the same drafts of toy families (see :mod:`specsample.testing.compare`); the table
gives the mean tokens per step (95% CI) against ``k``, with the exact value where known.
The run reports its progress on stderr (:class:`specsample.cli.progress.PartsProgress`).
"""

from __future__ import annotations

import argparse
from typing import Any

from specsample.cli.args import (
    add_rows_argument,
    add_seed_and_plot_arguments,
    add_vocab_argument,
    check_vocab,
    int_in_range,
)
from specsample.cli.progress import PartsProgress
from specsample.methods import MAX_SIMULATED_TREE_NODES
from specsample.testing import EXTRA_FAMILIES, FAMILIES
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
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the comparison's options to ``parser`` (``benchmarks/compare_rules.py`` uses them
    too); read back by :func:`check` and :func:`run`."""
    parser.add_argument(
        "--families",
        nargs="+",
        choices=FAMILIES + EXTRA_FAMILIES,
        default=["random", "markov", "peaked", "zipf"],
        metavar="FAMILY",
        help=f"toy families, among {', '.join(FAMILIES + EXTRA_FAMILIES)} (default random "
        "markov peaked zipf; see specsample.testing.make_family)",
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


def check(args: argparse.Namespace) -> None:
    """Refuse ``--vocab`` or ``--branching`` too large for the largest ``--k``.

    Raises
    ------
    ValueError
        The toy tables or the trees would exceed their bounds; the message names the flags.
    """
    k = max(args.k)
    check_vocab(args.vocab, k, "--k")
    nodes = sum(args.branching**depth for depth in range(1, k + 1))
    if nodes > MAX_SIMULATED_TREE_NODES:
        raise ValueError(
            f"--branching {args.branching} with --k {k} makes trees of {nodes} nodes, more than "
            f"{MAX_SIMULATED_TREE_NODES}: lower --branching or --k"
        )


def run(args: argparse.Namespace) -> int:
    """Run ``specsample compare`` as :func:`add_parser` configured it: the exit status, 0."""
    results = compare_rules(
        args.families,
        args.k,
        rows=args.rows,
        vocab=args.vocab,
        branching=args.branching,
        seed=args.seed,
        on_progress=PartsProgress("compare", "points (family, k)"),
    )
    print(format_comparison(results))
    if args.plot:
        print(f"plot written to {plot_comparison(results, args.plot)}")
    return 0
