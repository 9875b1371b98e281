"""Mean tokens per verification step of every rule of :data:`specsample.testing.compare.RULES`.

Usage::

    python benchmarks/compare_rules.py --families random markov peaked zipf --plot rules.png

The same options and table as ``specsample compare``; see :mod:`specsample.testing.compare`.
"""

from __future__ import annotations

import argparse
import sys

from specsample.cli import compare


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, print the table (and save the plot); the exit status (2: usage error)."""
    parser = argparse.ArgumentParser(
        description="Verify the same drafts with every rule and report the mean tokens per "
        "verification step (95% CI) against k, with the exact value where known."
    )
    compare.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        compare.check(args)
        return compare.run(args)
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    sys.exit(main())
