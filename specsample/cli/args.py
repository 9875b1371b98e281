"""Argument types and options that several commands share.

Every option is checked as it is parsed, so that a bad value is a usage error (exit status
2) before any work starts. Every option that sizes the work is bounded, and ``--help`` states
the bound: out of range, the command refuses at once rather than running out of memory.
:func:`int_in_range` is the type of such an option, :func:`number_in_range` of a bounded
real number and :func:`plot_file` of ``--plot`` (which needs matplotlib, checked at once).

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
import math
from collections.abc import Callable
from pathlib import Path

from specsample.extras import install_command
from specsample.testing import MAX_TABLE_ENTRIES
from specsample.testing.compare import MAX_ROWS

MAX_THREADS = 256
"""Most CPU threads ``--threads`` may ask for."""

MAX_SEED = (1 << 63) - 1
"""Largest ``--seed`` of the toy-family commands (``demo``, ``compare``)."""


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


def number_in_range(
    low: float, high: float | None = None, *, open_low: bool = False
) -> Callable[[str], float]:
    """A command-line type: a finite number in ``[low, high]`` (``None``: no upper bound).

    Parameters
    ----------
    low, high : float
        The bounds; ``high`` is included, ``low`` too unless ``open_low``.
    open_low : bool
        Exclude ``low``.

    Returns
    -------
    callable
        ``parse(text) -> float``.

    Raises
    ------
    argparse.ArgumentTypeError
        From the returned parser, when the text is not such a number (``nan`` and
        infinities are not).

    Examples
    --------
    >>> top_p = number_in_range(0, 1, open_low=True)
    >>> top_p("0.9")
    0.9
    >>> top_p("2")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a number in (0, 1], got 2.0
    >>> number_in_range(0)("inf")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a finite number >= 0, got inf
    """
    if high is None:
        allowed = f"a finite number {'>' if open_low else '>='} {low:g}"
    else:
        allowed = f"a number in {'(' if open_low else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        below = value <= low if open_low else value < low
        if not math.isfinite(value) or below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {value}")
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


def plot_file(text: str) -> str:
    """Parse ``--plot FILE``: a file name matplotlib can write, in a directory that exists.

    Checked as the options are parsed, so that a missing matplotlib or a bad path is
    reported before the work, not after it.

    Raises
    ------
    argparse.ArgumentTypeError
        matplotlib is not installed; the name does not end in a format matplotlib writes
        (``.png``, ``.svg``, ``.pdf``, ...), is a directory, or is in a directory that does
        not exist.

    Examples
    --------
    >>> plot_file("acceptance.png")
    'acceptance.png'
    """
    try:
        import matplotlib.backend_bases
    except ImportError:
        raise argparse.ArgumentTypeError(
            f"matplotlib is not installed; install it with: {install_command('plot')}"
        ) from None
    path = Path(text)
    formats = matplotlib.backend_bases.FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in formats:
        raise argparse.ArgumentTypeError(
            f"expected a file name ending in .png, .svg, .pdf or another format matplotlib "
            f"writes ({', '.join(sorted(formats))}), got {text!r}"
        )
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"there is no directory {path.parent} for {text}")
    return text


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


def check_vocab(vocab: int, k: int, k_flag: str = "--k") -> None:
    """Refuse a ``--vocab`` whose toy tables, at draft length ``k``, exceed their bound.

    Parameters
    ----------
    vocab, k : int
        ``--vocab`` and the largest draft length.
    k_flag : str
        The flag that gave ``k``, for the message.

    Raises
    ------
    ValueError
        ``(k + 1) * vocab**2 > MAX_TABLE_ENTRIES``; the message names both flags.

    Examples
    --------
    >>> check_vocab(836, 5)
    >>> check_vocab(837, 5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --vocab 837 with --k 5 needs toy tables of (k + 1) * vocab**2 = 4203414 ...
    """
    entries = (k + 1) * vocab * vocab
    if entries > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"--vocab {vocab} with {k_flag} {k} needs toy tables of (k + 1) * vocab**2 = "
            f"{entries} entries, more than {MAX_TABLE_ENTRIES}: lower --vocab or {k_flag}"
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
    """Add ``--seed`` (an integer in ``[0, MAX_SEED]``, default 0) and ``--plot FILE.png``
    (:func:`plot_file`; default: no chart).

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
        parser.add_argument(
            "--seed",
            type=int_in_range(0, MAX_SEED),
            default=0,
            help=f"{seed} (default 0, at most 2**63 - 1)",
        )
    if plot is not None:
        parser.add_argument(
            "--plot",
            metavar="FILE.png",
            type=plot_file,
            help=f"save {plot} (needs matplotlib; .png, .svg, .pdf, ...)",
        )
