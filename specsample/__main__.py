"""``python -m specsample`` and the ``specsample`` command.

:func:`entry` imports the command line inside its own guard: a Ctrl-C while PyTorch and the
commands are still being imported exits with one line and status 130, as it does later.
"""

from __future__ import annotations

import sys


def entry(argv: list[str] | None = None) -> int:
    """Run :func:`specsample.cli.main` on ``argv`` (``sys.argv[1:]`` by default): its exit
    status.

    Examples
    --------
    >>> entry(["bench", "--shapes", "2x0x8"])
    2
    """
    try:
        from specsample.cli import main
    except KeyboardInterrupt:
        print("specsample: interrupted", file=sys.stderr)
        return 130
    return main(argv)


if __name__ == "__main__":
    sys.exit(entry())
