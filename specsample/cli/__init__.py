"""The ``specsample`` command: ``demo``, ``bench``, ``compare`` and ``generate``.

One module per command (:mod:`specsample.cli.demo`, :mod:`specsample.cli.bench`,
:mod:`specsample.cli.compare`, :mod:`specsample.cli.generate`), each adding its parser
(``add_parser``) and running it (``run``); :mod:`specsample.cli.args` holds the argument
types they share and :mod:`specsample.cli.progress` the one progress reporter. ``demo``
checks :class:`specsample.sampler.RejectionSampler` for exactness on toy families, then
prints a short cold-cache speed table; ``bench`` runs the full benchmark; ``compare``
verifies the same drafts with every rule and reports tokens per verification step;
``generate`` runs batched speculative decoding with a target/draft pair of causal LMs, or
prompt lookup, streams the text and prints the run's statistics. Errors are reported on one
line and give a non-zero exit status.

Every option that sizes the work is bounded, and ``--help`` states the bound: out of range,
the command refuses at once (a usage error, exit status 2) rather than running out of memory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from specsample.cli import bench, compare, demo, generate

COMMANDS = {"demo": demo, "bench": bench, "compare": compare, "generate": generate}
"""Each command's module, in the order ``--help`` lists them."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line: the error, and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specsample",
        description="Exact, fast verification for speculative decoding.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for module in COMMANDS.values():
        module.add_parser(commands)
    return parser


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
        return int(COMMANDS[args.command].run(args))
    except KeyboardInterrupt:
        print("specsample: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, RuntimeError, OSError, ImportError) as exc:
        print(f"specsample {args.command}: error: {exc}", file=sys.stderr)
        return 1
