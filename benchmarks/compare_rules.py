"""Mean tokens per verification step of every rule of :data:`specsample.testing.compare.RULES`.

Usage::

    python benchmarks/compare_rules.py --families random markov peaked zipf --plot rules.png

The same as ``specsample compare``; see :mod:`specsample.testing.compare`.
"""

from __future__ import annotations

import sys

from specsample.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
