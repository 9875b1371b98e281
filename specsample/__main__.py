"""``python -m specsample``: the same as the ``specsample`` command."""

import sys

from specsample.cli import main

if __name__ == "__main__":
    sys.exit(main())
