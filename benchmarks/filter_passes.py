"""Passes over a row that the Triton filter kernel's threshold searches take.

Usage::

    TRITON_INTERPRET=1 python benchmarks/filter_passes.py --vocab 32000 --rows 20

The count of passes is a property of the search, not of the device: each pass of
:mod:`specsample.kernels.triton.filters` reads the row once, so a filtered row is read once
by the statistics kernel, once per search pass, and once more for its log-norm. The script
runs the kernel under Triton's interpreter (it sets ``TRITON_INTERPRET=1`` for its own
process when triton is not yet imported), on rows of ``N(0, 9)`` logits at temperature
0.8, and prints, for each number of pivots a pass and each filter, the mean and largest
count of search passes per row; every row's cutoff is checked against PyTorch's.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any

FILTERS: dict[str, dict[str, Any]] = {
    "top-k 50": {"top_k": 50},
    "top-p 0.9": {"top_p": 0.9},
    "top-k 50, top-p 0.9": {"top_k": 50, "top_p": 0.9},
    "top-p 0.5": {"top_p": 0.5},
}


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and print the table; the exit status (1: a cutoff differed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000, help="tokens per row")
    parser.add_argument("--rows", type=int, default=20, help="rows per filter")
    parser.add_argument("--pivots", type=int, nargs="+", default=[4, 8], help="powers of two")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("triton") is None:
        print(
            "skipped: filter_passes.py: triton is not installed: pip install 'specsample[triton]'"
        )
        return 0
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from specsample.kernels.triton import filters
    from specsample.kernels.triton.launch import MODE_PACKAGES, interpreting
    from specsample.params.metadata import SamplingMetadata
    from specsample.probs import sampling_norms

    if not interpreting():
        parser.error("needs Triton's interpreter: run with TRITON_INTERPRET=1")
    filters._kernel()
    kernel = importlib.import_module(f"specsample.kernels.triton.{MODE_PACKAGES[True]}.filters")
    measure, passes = kernel._measure, [0]

    def counted(*arguments: Any) -> Any:
        passes[0] += 1
        return measure(*arguments)

    kernel._measure = counted
    filters.INTERPRETER_COLUMNS = 1024
    print(f"search passes per row, vocab {args.vocab}, {args.rows} rows of N(0, 9) at T = 0.8")
    print("| pivots | filter | mean | max |\n|---|---|---|---|")
    differed = 0
    for pivots in args.pivots:
        filters.INTERPRETER_PIVOTS = pivots
        for name, options in FILTERS.items():
            counts = []
            for seed in range(args.rows):
                gen = torch.Generator().manual_seed(seed)
                logits = torch.randn(1, args.vocab, generator=gen) * 3
                sampling = SamplingMetadata.build(1, logits.device, temperature=0.8, **options)
                passes[0] = 0
                ours = filters.filtered_norms(logits, sampling).cutoff
                differed += int(not torch.equal(ours, sampling_norms(logits, sampling).cutoff))
                counts.append(passes[0])
            print(f"| {pivots} | {name} | {sum(counts) / len(counts):.1f} | {max(counts)} |")
    if differed:
        print(f"{differed} cutoff(s) differed from PyTorch's")
    return 1 if differed else 0


if __name__ == "__main__":
    sys.exit(main())
