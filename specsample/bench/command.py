"""The benchmark's command-line options, shared by ``specsample bench`` and the scripts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from specsample.bench.inputs import (
    DEFAULT_SHAPES,
    MAX_SHAPE_BATCH,
    MAX_SHAPE_K,
    MAX_SHAPE_VALUES,
    MAX_SHAPE_VOCAB,
    QUICK_SHAPES,
    Shape,
    _check_shape,
)
from specsample.bench.runner import run_benchmark
from specsample.bench.table import format_table


def parse_shape(text: str) -> Shape:
    """Parse ``BATCHxKxVOCAB`` (for example ``8x4x32000``) into a shape.

    Raises
    ------
    argparse.ArgumentTypeError
        The text is not three positive integers separated by ``x``.

    Examples
    --------
    >>> parse_shape("8x4x32000")
    (8, 4, 32000)
    """
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected BATCHxKxVOCAB such as 8x4x32000, got {text!r}")
    try:
        return _check_shape(tuple(int(part) for part in parts))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_positive_int(text: str) -> int:
    """Parse a positive integer command-line value.

    Raises
    ------
    argparse.ArgumentTypeError
        The text is not an integer ``>= 1``.

    Examples
    --------
    >>> parse_positive_int("7")
    7
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


MAX_REPEATS = 1000
"""Most cold calls ``--repeats`` may ask for."""

MAX_THREADS = 256
"""Most CPU threads ``--threads`` may ask for."""


def int_in_range(low: int, high: int) -> Callable[[str], int]:
    """A command-line type: an integer in ``[low, high]``.

    Raises
    ------
    argparse.ArgumentTypeError
        From the returned parser, when the text is not such an integer.

    Examples
    --------
    >>> parse = int_in_range(1, 64)
    >>> parse("64")
    64
    >>> parse("65")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer in [1, 64], got 65
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            shown = repr(text) if value is None else value
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {shown}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``.

    ``--quick``, ``--shapes``, ``--repeats``, ``--threads`` and ``--device``; read back by
    :func:`run_from_args`.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> parser.parse_args(["--shapes", "2x2x64"]).shapes
    [(2, 2, 64)]
    """
    parser.add_argument(
        "--quick",
        action="store_true",
        help="run only "
        + ", ".join("x".join(map(str, s)) for s in QUICK_SHAPES)
        + " with fewer repeats",
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
    parser.add_argument(
        "--threads",
        type=int_in_range(1, MAX_THREADS),
        default=None,
        help=f"CPU threads torch may use (at most {MAX_THREADS})",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")


def run_from_args(args: argparse.Namespace) -> int:
    """Run the benchmark as :func:`add_arguments` configured it and print the table.

    Returns
    -------
    int
        The exit status, 0.
    """
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
