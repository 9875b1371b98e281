"""``specsample warm``: compile the fused CPU kernels ahead of time.

The first use of the CPU kernels on a machine compiles them (about a minute, announced) and
caches the machine code for the user (:mod:`specsample.kernels.cpu.compiler`); every later process
loads
it. This command does that step now, at install or image-build time, so that no later call
waits for it: it prints where the cache is and whether the kernels were compiled or loaded.

Examples
--------
>>> parser = argparse.ArgumentParser()
>>> add_parser(parser.add_subparsers())
>>> parser.parse_args(["warm"]).quiet
False
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from typing import Any

from specsample.kernels.cpu import compiler

_HELP = "compile the fused CPU kernels now, once for this machine and user"
"""The command's line in ``specsample --help``."""

_DESCRIPTION = (
    "Compile the fused CPU kernels (numba) into the user's cache, or check that the cache "
    "holds them. Later processes then load them in about a second. The cache is "
    "$SPECSAMPLE_CACHE_DIR/numba, else $XDG_CACHE_HOME/specsample/numba, else "
    "~/.cache/specsample/numba."
)
"""What ``specsample warm --help`` says of the command."""


def add_parser(commands: Any) -> None:
    """Add the ``warm`` command to the subparsers ``commands``."""
    parser = commands.add_parser("warm", help=_HELP, description=_DESCRIPTION)
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")


def check(args: argparse.Namespace) -> None:
    """Nothing to check: ``warm`` takes no value."""


def run(args: argparse.Namespace) -> int:
    """Compile or load the kernels: 0 when they are ready, 1 when they cannot be (numba
    missing, or a compilation failed)."""
    if not compiler.available():
        print("specsample warm: numba is not installed: pip install 'specsample[cpu]'",
              file=sys.stderr)  # fmt: skip
        return 1
    started = time.perf_counter()
    ready = compiler.warm_up(io.StringIO() if args.quiet else None)
    if not ready:
        print("specsample warm: the CPU kernels did not compile", file=sys.stderr)
        return 1
    if not args.quiet:
        seconds = time.perf_counter() - started
        print(f"specsample warm: the CPU kernels are ready ({seconds:.1f} s), cached in "
              f"{compiler.cache_dir() / compiler.sources_key()}")  # fmt: skip
    return 0
