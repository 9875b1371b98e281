"""The ``specsample`` command: ``demo``, ``bench``, ``compare``, ``generate`` and ``warm``.

One module per command (:mod:`specsample.cli.demo`, :mod:`specsample.cli.bench`,
:mod:`specsample.cli.compare`, :mod:`specsample.cli.generate`), each adding its parser
(``add_parser``), checking the options together (``check``) and running it (``run``);
:mod:`specsample.cli.args` holds the argument types they share and
:mod:`specsample.cli.progress` the progress reporters. ``demo`` checks
:class:`specsample.sampler.RejectionSampler` for exactness on toy families, then prints a
short cold-cache speed table; ``bench`` runs the full benchmark; ``compare`` verifies the
same drafts with every rule and reports tokens per verification step; ``generate`` runs
batched speculative decoding with a target/draft pair of causal LMs, or prompt lookup,
streams the text and prints the run's statistics; ``warm`` compiles the fused CPU kernels
ahead of time (:mod:`specsample.cli.warm`). ``specsample --version`` prints the
package's version.

Every option is checked before any work starts (and before any model loads): a value out
of range, a combination that makes no sense or a flag that does not exist is a usage error
(exit status 2) on one line, ``specsample COMMAND: error: ...``, naming the flag as it is
typed, with the closest flag or command when one was misspelt. Every option that sizes the
work is bounded, and ``--help`` states the bound. Errors found later (a file that cannot
serve, a model that cannot load) are reported on one line too, with exit status 1. Ctrl-C
stops a command with exit status 130 and one line on stderr, ``specsample COMMAND:
interrupted`` (after what it ran is reported), whether it comes while the options are
checked, while models load or while the command runs.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from specsample import __version__
from specsample.cli import bench, compare, demo, generate, warm
from specsample.kernels.cpu import compiler

COMMANDS = {
    "demo": demo,
    "bench": bench,
    "compare": compare,
    "generate": generate,
    "warm": warm,
}
"""Each command's module, in the order ``--help`` lists them."""


def did_you_mean(word: str, known: Sequence[str]) -> str:
    """``" (did you mean X?)"`` for the closest of ``known`` to ``word``, or ``""``.

    Examples
    --------
    >>> did_you_mean("--temprature", ["--temperature", "--top-p"])
    ' (did you mean --temperature?)'
    >>> did_you_mean("xyz", ["generate"])
    ''
    """
    close = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line: the error, and where help is;
    an invalid choice (a command, a ``--method``, ...) names the closest valid one."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        choices = [str(choice) for choice in action.choices]
        raise argparse.ArgumentError(
            action,
            f"invalid choice: {value!r}{did_you_mean(str(value), choices)}; choose from "
            + ", ".join(choices),
        )


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``specsample`` parser, and each command's parser by name."""
    parser = _Parser(
        prog="specsample",
        description="Exact, fast verification for speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"specsample {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for module in COMMANDS.values():
        module.add_parser(commands)
    return parser, dict(commands.choices)


def _unrecognized(extras: list[str], command: argparse.ArgumentParser) -> str:
    """The usage error for arguments no option of ``command`` takes, with close flags."""
    flags = [flag for flag in command._option_string_actions if flag.startswith("--")]
    hints = [
        did_you_mean(extra.split("=", 1)[0], flags) for extra in extras if extra.startswith("--")
    ]
    return f"unrecognized arguments: {' '.join(extras)}{''.join(dict.fromkeys(hints))}"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options, each checked, and checked together by the command's ``check``.

    Raises
    ------
    SystemExit
        For ``--help`` and ``--version`` (status 0), or a usage error (status 2, the error
        on stderr).
    """
    parser, commands = _build_parser()
    args, extras = parser.parse_known_args(argv)
    command = commands[args.command]
    if extras:
        command.error(_unrecognized(extras, command))
    try:
        COMMANDS[args.command].check(args)
    except ValueError as exc:
        command.error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``specsample`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments after the program name (``sys.argv[1:]`` by default).

    Returns
    -------
    int
        Exit status: 0 on success (and for ``--help`` and ``--version``), 1 when the demo
        finds a family that fails its exactness tests or the command fails, 2 for a usage
        error, 130 when interrupted.

    Examples
    --------
    >>> main(["bench", "--shapes", "2x0x8"])
    2
    """
    prog = "specsample"
    try:
        try:
            args = _parse(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 2
        prog = f"specsample {args.command}"
        if args.command != "warm":  # compiled (announced) or loaded before anything is timed
            compiler.warm_up()
        return int(COMMANDS[args.command].run(args))
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, RuntimeError, OSError, ImportError) as exc:
        if _interrupted(exc):  # a Ctrl-C that a library turned into its own error
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1


def _interrupted(error: BaseException) -> bool:
    """Whether ``error`` was raised while handling a Ctrl-C (transformers' lazy imports
    report one as "Could not import module ...")."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
