"""Benchmark the verification step with cold caches (see :mod:`specsample.bench`).

Usage::

    python benchmarks/bench_sampler.py                      # the five standard shapes
    python benchmarks/bench_sampler.py --quick              # two shapes, fewer repeats
    python benchmarks/bench_sampler.py --shapes 8x4x32000 64x4x128256

Prints one progress line per shape on stderr, then the table on stdout.
"""

from __future__ import annotations

import argparse
import sys

from specsample.cli.bench import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(
        description="Cold-cache latency and peak memory of RejectionSampler against the "
        "naive reference, transformers (when installed) and the memory-read floor."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
