"""One decoding forward of the shipped pair: transformers' own forward against the fused one.

For each model of the shipped default pair, each batch size of ``--batch-sizes`` and each
width of ``--widths`` (slots per sequence: 1 for a plain step, ``k + 1`` for a step scoring
``k`` drafts), a :class:`~specsample.adapter.CachedLM` holding ``--context`` tokens per
sequence runs one forward over ``width`` new slots, which are then dropped, so every call
sees the same cache. Three contestants, alternated call by call (``--calls`` each after a
warm-up): transformers' forward (``fused=False``), the fused forward with the model's own
weight layout, and the fused forward with the larger projections on oneDNN's layout (the
default on a CPU). The table gives medians in milliseconds and the ratio of each fused
contestant to transformers' forward, with the share of the CPUs other processes used.

Run ``python benchmarks/bench_forward.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch
from model_loading import load_default_pair

from specsample.adapter import CachedLM, FusedForward
from specsample.bench import CpuShare
from specsample.timing import Stopwatch

CONTESTANTS = ("transformers", "fused, own layout", "fused, oneDNN")


def _lms(model: object) -> dict[str, CachedLM]:
    """The three contestants over one model."""
    own = CachedLM(model, forward="fused")
    own.fused = FusedForward(model, pack=False)
    lms = (CachedLM(model, forward="model"), own, CachedLM(model, forward="fused"))
    return dict(zip(CONTESTANTS, lms, strict=True))


def _call(lm: CachedLM, batch: int, width: int, context: int, vocab: int) -> Callable[[], float]:
    """A timed forward of ``width`` slots over a cache of ``context`` tokens per sequence."""
    generator = torch.Generator().manual_seed(0)
    lm.reset(batch)
    prompt = torch.randint(0, vocab, (batch, context), generator=generator)
    lm.forward(prompt, torch.arange(context).expand(batch, -1))
    ids = torch.randint(0, vocab, (batch, width), generator=generator)
    positions = (torch.arange(width) + context).expand(batch, -1)

    def timed() -> float:
        watch = Stopwatch()
        lm.forward(ids, positions, keep=width)
        seconds = watch.elapsed()
        lm.drop_tail(width)
        return seconds

    return timed


def main(argv: list[str] | None = None) -> int:
    """Time the three forwards of both models and print the table; return 0 (also when
    skipped for lack of transformers, :func:`model_loading.load_default_pair`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[1, 4, 8],
        help="sequences per forward (default 1 4 8)",
    )
    parser.add_argument(
        "--widths",
        type=int,
        nargs="+",
        default=[1, 5],
        help="new slots per sequence: 1 a plain step, k + 1 a step scoring k drafts (default 1 5)",
    )
    parser.add_argument(
        "--context", type=int, default=128, help="tokens in the cache (default 128)"
    )
    parser.add_argument(
        "--calls", type=int, default=40, help="timed calls per contestant (default 40)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_default_pair()
    if loaded is None:
        return 0
    models = dict(zip(("target", "draft"), loaded[1:], strict=True))
    print(f"`python benchmarks/bench_forward.py` {args.threads} thread(s), {args.calls} calls")
    print()
    print("| model | batch | width | transformers ms | fused, own layout | fused, oneDNN |")
    print("|---|---:|---:|---:|---:|---:|")
    with CpuShare() as share, torch.inference_mode():
        for role, model in models.items():
            lms = _lms(model)
            vocab = lms["transformers"].vocab_size
            for batch in args.batch_sizes:
                for width in args.widths:
                    print(_row(lms, role, batch, width, args.context, vocab, args.calls))
    print()
    others = "unknown" if share.share is None else f"{share.share:.0%}"
    print(f"Other processes used {others} of the CPUs meanwhile.")
    return 0


def _row(
    lms: dict[str, CachedLM],
    role: str,
    batch: int,
    width: int,
    context: int,
    vocab: int,
    count: int,
) -> str:
    """One table row: every contestant's median forward time, alternated call by call."""
    calls = {name: _call(lm, batch, width, context, vocab) for name, lm in lms.items()}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(3):
        for call in calls.values():
            call()
    for _ in range(count):
        for name, call in calls.items():
            times[name].append(call())
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["transformers"]
    cells = [f"{base * 1e3:.2f}"] + [
        f"{medians[name] * 1e3:.2f} ({base / medians[name]:.2f}x)" for name in CONTESTANTS[1:]
    ]
    return f"| {role} | {batch} | {width} | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    sys.exit(main())
