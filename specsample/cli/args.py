"""Argument types and options that several commands share.

Every option that sizes the work is bounded, and ``--help`` states the bound: out of range,
the command refuses at once (a usage error, exit status 2) rather than running out of
memory. :func:`int_in_range` is the type of such an option.

Examples
--------
>>> parser = argparse.ArgumentParser()
>>> add_threads_argument(parser, "torch may use")
>>> add_seed_and_plot_arguments(parser, seed="seed")
>>> args = parser.parse_args(["--threads", "2"])
>>> args.threads, args.seed
(2, 0)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from specsample.testing import MAX_TABLE_ENTRIES
from specsample.testing.compare import MAX_ROWS

MAX_THREADS = 256
"""Most CPU threads ``--threads`` may ask for."""


def int_in_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """A command-line type: an integer in ``[low, high]`` (``None``: no upper bound).

    Parameters
    ----------
    low, high : int
        The bounds, both included; ``high=None`` accepts any integer ``>= low``.

    Returns
    -------
    callable
        ``parse(text) -> int``.

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
    >>> int_in_range(1)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer >= 1, got 0
    """
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            shown = repr(text) if value is None else value
            raise argparse.ArgumentTypeError(f"expected an integer {allowed}, got {shown}")
        return value

    return parse


def probability(text: str) -> float:
    """Parse a probability strictly between 0 and 1.

    Raises
    ------
    argparse.ArgumentTypeError
        The text is not a number in ``(0, 1)``.

    Examples
    --------
    >>> probability("1e-4")
    0.0001
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {value}")
    return value


def add_threads_argument(parser: argparse.ArgumentParser, use: str, note: str = "") -> None:
    """Add ``--threads``, the CPU threads torch may use, at most :data:`MAX_THREADS`.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    use : str
        What the threads do, for the help: ``"CPU threads {use} ({note}at most ...)"``.
    note : str
        Said before the bound in the help (the default, advice), ending with ``"; "``.
    """
    parser.add_argument(
        "--threads",
        type=int_in_range(1, MAX_THREADS),
        default=None,
        help=f"CPU threads {use} ({note}at most {MAX_THREADS})",
    )


def add_vocab_argument(parser: argparse.ArgumentParser, what: str, where: str = "") -> None:
    """Add ``--vocab``, the vocabulary of toy families (default 8), bounded by their table.

    A family holds ``(k + 1) * vocab**2`` entries, at most
    :data:`specsample.testing.MAX_TABLE_ENTRIES`.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    what : str
        The help text before the default and the bound.
    where : str
        Said after the bound (for which ``k`` it holds).
    """
    bound = f"(k + 1) * vocab**2 <= 2**{MAX_TABLE_ENTRIES.bit_length() - 1}"
    parser.add_argument(
        "--vocab",
        type=int_in_range(2, MAX_TABLE_ENTRIES),
        default=8,
        help=f"{what} (default 8; {bound}{where})",
    )


def add_rows_argument(
    parser: argparse.ArgumentParser, what: str, default: int, low: int = 1
) -> None:
    """Add ``--rows``, how many draws a toy-family run makes, at most :data:`MAX_ROWS`.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    what : str
        What a row is, for the help: ``"{what} (default {default}, at most ...)"``.
    default : int
        The default count.
    low : int
        The least count accepted.
    """
    parser.add_argument(
        "--rows",
        type=int_in_range(low, MAX_ROWS),
        default=default,
        help=f"{what} (default {default}, at most {MAX_ROWS})",
    )


def add_seed_and_plot_arguments(
    parser: argparse.ArgumentParser, *, seed: str | None = None, plot: str | None = None
) -> None:
    """Add ``--seed`` (an integer, default 0) and ``--plot FILE.png`` (default: no chart).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    seed : str, optional
        What the seed seeds, for the help; ``None``: no ``--seed``.
    plot : str, optional
        The chart ``--plot`` saves, for the help; ``None``: no ``--plot``.
    """
    if seed is not None:
        parser.add_argument("--seed", type=int, default=0, help=f"{seed} (default 0)")
    if plot is not None:
        parser.add_argument("--plot", metavar="FILE.png", help=f"save {plot}")
