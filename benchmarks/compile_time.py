"""How long ``torch.compile`` (inductor) takes on the seeded entry points, first call included.

Compiles ``RejectionSampler()`` (probabilities ``[8, 4, 50]``) or ``verify`` (logits of 8
requests with 4 drafts each, temperature 1), both with per-row seeds and positions, times the
first call (tracing, inductor's code generation and the run), and checks it equals the eager
output. Not part of ``make test``: ``python benchmarks/compile_time.py sampler`` (or
``verify``). Inductor's caches go to a fresh directory (unless ``TORCHINDUCTOR_CACHE_DIR`` is
set), so the time is that of a cold compile. ``--backend eager`` (or ``aot_eager``) compiles
with one of torch's debugging backends instead: tracing only, in a few seconds, no C++
compiler needed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

from specsample import RejectionSampler, verify
from specsample.timing import Stopwatch

BATCH, K, VOCAB = 8, 4, 50


def _sampler(generator: torch.Generator, backend: str) -> tuple[float, bool]:
    target = torch.softmax(torch.randn(BATCH, K, VOCAB, generator=generator), -1)
    draft = torch.softmax(torch.randn(BATCH, K, VOCAB, generator=generator), -1)
    ids = torch.multinomial(draft.view(-1, VOCAB), 1, generator=generator).view(BATCH, K)
    bonus = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    seeds = torch.arange(BATCH)
    positions = torch.full((BATCH,), 16)
    compiled = torch.compile(RejectionSampler(), backend=backend)
    watch = Stopwatch()
    out = compiled(target, bonus, draft, ids, seeds=seeds, positions=positions)
    seconds = watch.elapsed()
    eager = RejectionSampler()(target, bonus, draft, ids, seeds=seeds, positions=positions)
    return seconds, torch.equal(out, eager)


def _verify(generator: torch.Generator, backend: str) -> tuple[float, bool]:
    counts = [K] * BATCH
    logits = torch.randn(sum(counts) + BATCH, VOCAB, generator=generator)
    drafts = torch.randint(0, VOCAB, (sum(counts),), generator=generator)
    seeds = list(range(BATCH))
    positions = [16] * BATCH
    compiled = torch.compile(verify, backend=backend)
    watch = Stopwatch()
    out = compiled(logits, drafts, counts, temperature=1.0, seeds=seeds, positions=positions)
    seconds = watch.elapsed()
    expected = verify(logits, drafts, counts, temperature=1.0, seeds=seeds, positions=positions)
    return seconds, torch.equal(out.token_ids, expected.token_ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "entry",
        choices=["sampler", "verify"],
        help="what to compile: RejectionSampler() or specsample.verify",
    )
    parser.add_argument(
        "--backend",
        choices=["inductor", "aot_eager", "eager"],
        default="inductor",
        help="torch.compile backend (default inductor; the others trace only, for a quick check)",
    )
    args = parser.parse_args(argv)
    if args.backend == "inductor":
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))
    run = _sampler if args.entry == "sampler" else _verify
    seconds, equal = run(torch.Generator().manual_seed(0), args.backend)
    print(
        f"{args.entry} ({args.backend}): first compiled call {seconds:.1f} s, "
        f"equal to eager: {equal}"
    )
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
