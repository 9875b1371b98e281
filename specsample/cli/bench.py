"""``specsample bench``: the cold-cache benchmark of :mod:`specsample.bench`, and its options.

:func:`add_arguments` and :func:`run` also serve the benchmark scripts.

Examples
--------
>>> parser = argparse.ArgumentParser()
>>> add_arguments(parser)
>>> parser.parse_args(["--shapes", "2x2x64"]).shapes
[(2, 2, 64)]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from specsample.bench import (
    DEFAULT_SHAPES,
    MAX_SHAPE_BATCH,
    MAX_SHAPE_K,
    MAX_SHAPE_VALUES,
    MAX_SHAPE_VOCAB,
    QUICK_SHAPES,
    Shape,
    format_table,
    run_benchmark,
)
from specsample.bench.inputs import check_shape
from specsample.cli.args import add_threads_argument, int_in_range

MAX_REPEATS = 1000
"""Most cold calls ``--repeats`` may ask for."""


def parse_shape(text: str) -> Shape:
    """Parse ``BATCHxKxVOCAB`` (for example ``8x4x32000``) into a shape.

    Raises
    ------
    argparse.ArgumentTypeError
        The text is not three positive integers separated by ``x``, or a shape out of the
        benchmark's bounds.

    Examples
    --------
    >>> parse_shape("8x4x32000")
    (8, 4, 32000)
    """
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected BATCHxKxVOCAB such as 8x4x32000, got {text!r}")
    try:
        return check_shape(tuple(int(part) for part in parts))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_device(text: str) -> str:
    """Parse ``--device``: ``cpu``, or ``cuda`` (``cuda:N``) when CUDA is available.

    Raises
    ------
    argparse.ArgumentTypeError
        Not a torch device, another kind of device, or CUDA asked for without CUDA.

    Examples
    --------
    >>> parse_device("cpu")
    'cpu'
    """
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda (cuda:N), got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text} was asked for, but CUDA is not available")
    return text


def add_parser(commands: Any) -> None:
    """Add the ``bench`` command to the subparsers ``commands``."""
    parser = commands.add_parser(
        "bench",
        help="cold-cache latency and peak memory against the naive reference",
        description="Time RejectionSampler, the naive reference, transformers' "
        "_speculative_sampling (when installed) and the memory-read floor, with cold caches.",
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``.

    ``--quick``, ``--shapes``, ``--repeats``, ``--threads`` and ``--device``; read back by
    :func:`run`.
    """
    parser.add_argument(
        "--quick",
        action="store_true",
        help="run only "
        + ", ".join("x".join(map(str, s)) for s in QUICK_SHAPES)
        + " with fewer repeats (not with --shapes)",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        metavar="BxKxV",
        help="shapes to run, such as 8x4x32000 (default: the five standard shapes); "
        f"batch <= {MAX_SHAPE_BATCH}, k <= {MAX_SHAPE_K}, vocab <= {MAX_SHAPE_VOCAB} and "
        f"batch * (k + 1) * vocab <= 2**{MAX_SHAPE_VALUES.bit_length() - 1}",
    )
    parser.add_argument(
        "--repeats",
        type=int_in_range(1, MAX_REPEATS),
        default=None,
        help="cold calls timed for ours and the floor (default 7, --quick 3; at most "
        f"{MAX_REPEATS}); naive and transformers get at most 3",
    )
    add_threads_argument(parser, "torch may use")
    parser.add_argument(
        "--device", type=parse_device, default="cpu", help="cpu or cuda (default cpu)"
    )


def check(args: argparse.Namespace) -> None:
    """Refuse ``--quick`` with ``--shapes``: it runs shapes of its own.

    Raises
    ------
    ValueError
        Both were given.
    """
    if args.quick and args.shapes:
        raise ValueError("--quick runs its own shapes: pass --quick or --shapes, not both")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark as :func:`add_arguments` configured it: the exit status, 0."""
    shapes = args.shapes or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    repeats = args.repeats or (3 if args.quick else 7)
    rows = run_benchmark(
        shapes,
        repeats=repeats,
        slow_repeats=min(repeats, 3),
        device=args.device,
        threads=args.threads,
    )
    print(format_table(rows))
    return 0
