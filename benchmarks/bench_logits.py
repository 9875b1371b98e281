"""Benchmark the logits path of :func:`specsample.verify` against a naive full-softmax path.

Usage::

    python benchmarks/bench_logits.py                 # (64, 4, 128256) and (16, 5, 151936)
    python benchmarks/bench_logits.py --quick         # one small shape, fewer repeats
    python benchmarks/bench_logits.py --shapes 8x4x32000 --repeats 5

Contestants, on the same flattened ragged batch (target logits ``[rows, vocab]`` with
``rows = total_drafts + batch``, draft probabilities ``[total_drafts, vocab]``, draft ids):

* ``ours``: :func:`specsample.verify` on the logits (backend ``"auto"``: the fused CPU
  kernels when numba is installed);
* ``torch``: the same call on the PyTorch backend (``backend="torch"``);
* ``floor``: one read of every target row and of one draft row per request
  (``logits.sum(-1)``, ``draft_probs[first].sum(-1)``): the rows an exact verifier must
  read (a greedy request needs each row's argmax, a sampled one each row's normaliser up to
  its first rejection, and the draft row there);
* ``naive``: what an engine without a logits path does: a full softmax of every row
  (``torch.softmax(logits / T)``; greedy rows become one-hot argmax rows), then the padded
  probabilities verifier :func:`specsample.chain_verify`. The padded ``[batch, K, vocab]``
  target and draft tensors are gathered from the ragged rows: a request with ``n_i < K``
  drafts gets its bonus row at position ``n_i``, draft ids -1 and draft probabilities zero
  from ``n_i`` on, so that the chain rejects at ``n_i`` and draws from the bonus row; the
  bonus token of a full request is drawn with :func:`torch.multinomial` from its bonus row.

Each shape runs four batches: all greedy, all sampled (temperature 1.0), half and half
(alternating), and all sampled with top-k 50 and top-p 0.9 (``filtered``). Draft counts are
uniform in ``1..k``, with ``k`` itself present. Timing reuses
the cold-cache method of :mod:`specsample.bench` (a cache-sized buffer is overwritten before
every timed call; medians of interleaved calls after a warm-up), and so does the peak-memory
measurement (:func:`specsample.bench.extra_peak_bytes`), reported as a multiple of one
``[rows, vocab]`` float32 buffer. The ``agree`` column checks that both paths give the same
tokens on greedy requests. Timings depend on the machine and its load; they are never a
pass/fail criterion.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from specsample import chain_verify, verify
from specsample.backends import resolve
from specsample.bench import (
    TARGET_SCALE,
    Flusher,
    Shape,
    cache_flush_bytes,
    correlated_logits,
    profile_calls,
)
from specsample.cli.args import int_in_range
from specsample.cli.bench import parse_shape
from specsample.kernels.cpu import compiler

SHAPES: tuple[Shape, ...] = ((64, 4, 128256), (16, 5, 151936))
"""``(batch, k, vocab)``: Llama-3 and Qwen2 vocabularies."""

QUICK_SHAPES: tuple[Shape, ...] = ((8, 4, 32000),)
"""A small shape for a quick look."""

MODES = ("greedy", "sampled", "mixed", "filtered")
"""All greedy, all sampled at temperature 1.0, alternating, and sampled with top-k and top-p."""

FILTERS = {"top_k": 50, "top_p": 0.9}
"""The filters of the ``filtered`` mode."""


class Case(NamedTuple):
    """One flattened ragged batch.

    Attributes
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` target logits, request after request: draft rows, then bonus row.
    draft_probs : torch.Tensor
        ``[total_drafts, vocab]`` the rows the drafts were sampled from.
    draft_token_ids : torch.Tensor
        ``[total_drafts]`` int64.
    counts : list of int
        Drafts per request.
    temperature : list of float
        Per request; 0 is greedy.
    filters : dict
        ``top_k`` and ``top_p`` of every request (empty: none).
    """

    logits: torch.Tensor
    draft_probs: torch.Tensor
    draft_token_ids: torch.Tensor
    counts: list[int]
    temperature: list[float]
    filters: dict[str, float]


def make_case(batch: int, k: int, vocab: int, mode: str, seed: int = 0) -> Case:
    """Target logits ``4 z``, draft logits ``4 (0.98 z + 0.2 z')``, drafts sampled.

    The logits are those of :func:`specsample.bench.make_inputs` (see
    :func:`specsample.bench.correlated_logits`). Counts are uniform in ``1..k`` with the
    first request at ``k``.
    """
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, k + 1, (batch,), generator=gen)
    counts[0] = k
    total = int(counts.sum())
    rows = total + batch
    z = torch.randn(rows, vocab, generator=gen)
    starts = torch.cumsum(counts + 1, 0) - (counts + 1)
    draft_rows = torch.cat([s + torch.arange(int(n)) for s, n in zip(starts, counts, strict=True)])
    noise = torch.randn(total, vocab, generator=gen)
    draft_probs = torch.softmax(correlated_logits(z[draft_rows], noise), -1)
    del noise
    ids = torch.multinomial(draft_probs, 1, generator=gen).squeeze(-1)
    if mode == "greedy":
        temperature = [0.0] * batch
    elif mode == "mixed":
        temperature = [0.0 if i % 2 else 1.0 for i in range(batch)]
    else:
        temperature = [1.0] * batch
    filters = dict(FILTERS) if mode == "filtered" else {}
    return Case(z.mul_(TARGET_SCALE), draft_probs, ids, counts.tolist(), temperature, filters)


def ours(case: Case, generator: torch.Generator, backend: str = "auto") -> torch.Tensor:
    """:func:`specsample.verify` on the logits."""
    out = verify(
        case.logits,
        case.draft_token_ids,
        case.counts,
        draft_probs=case.draft_probs,
        temperature=case.temperature,
        generator=generator,
        backend=backend,
        **case.filters,  # type: ignore[arg-type]
    )
    return out.token_ids


def floor(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """One read of every target row and of each request's first draft row."""
    first = torch.cumsum(torch.tensor(case.counts), 0) - torch.tensor(case.counts)
    return case.logits.sum(-1), case.draft_probs[first].sum(-1)


def naive(case: Case, generator: torch.Generator) -> torch.Tensor:
    """Full softmax of every row, padded probabilities, then :func:`chain_verify` (only
    temperatures: the ``filtered`` mode has no naive contestant)."""
    logits, draft_probs, ids = case.logits, case.draft_probs, case.draft_token_ids
    rows, vocab = logits.shape
    batch, width = len(case.counts), max(case.counts)
    counts = torch.tensor(case.counts)
    per_row = torch.repeat_interleave(torch.tensor(case.temperature), counts + 1)
    greedy = per_row == 0
    if bool(greedy.all()):
        probs = torch.zeros(rows, vocab).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    else:
        scale = torch.where(greedy, 1.0, per_row).unsqueeze(-1)
        probs = torch.softmax(logits / scale, dim=-1)
        if bool(greedy.any()):
            index = greedy.nonzero().squeeze(-1)
            probs[index] = torch.zeros(index.shape[0], vocab).scatter_(
                1, logits[index].argmax(-1, keepdim=True), 1.0
            )
    cols = torch.arange(width)
    target_start = torch.cumsum(counts + 1, 0) - (counts + 1)
    draft_start = torch.cumsum(counts, 0) - counts
    in_request = cols < counts.unsqueeze(-1)
    target_rows = target_start.unsqueeze(-1) + torch.minimum(cols, counts.unsqueeze(-1))
    draft_rows = draft_start.unsqueeze(-1) + torch.minimum(cols, counts.unsqueeze(-1) - 1)
    target = probs[target_rows]
    draft = draft_probs[draft_rows].masked_fill_(~in_request.unsqueeze(-1), 0.0)
    padded_ids = torch.where(in_request, ids[draft_rows], -1)
    full = counts == width
    bonus = torch.zeros(batch, dtype=torch.int64)
    bonus_rows = probs[(target_start + counts)[full]]
    bonus[full] = torch.multinomial(bonus_rows, 1, generator=generator).squeeze(-1)
    uniforms = torch.rand(batch, width + 1, dtype=torch.float64, generator=generator)
    return chain_verify(target, draft, padded_ids, bonus, uniforms).token_ids


def _greedy_agree(case: Case, seed: int) -> bool | None:
    """Both paths give the same tokens on the greedy requests (``None``: there are none)."""
    greedy = [i for i, t in enumerate(case.temperature) if t == 0.0]
    if not greedy or case.filters:
        return None
    a = ours(case, torch.Generator().manual_seed(seed))[greedy]
    b = naive(case, torch.Generator().manual_seed(seed))[greedy]
    return bool(torch.equal(a, b))


def measure(shape: Shape, mode: str, *, repeats: int, flush: Flusher, seed: int) -> dict[str, Any]:
    """One table row: cold medians, speed ratio, extra peak memory, greedy agreement."""
    batch, k, vocab = shape
    case = make_case(batch, k, vocab, mode, seed)
    rows = case.logits.shape[0]
    unit = rows * vocab * 4
    generator = torch.Generator().manual_seed(seed)
    calls: dict[str, Callable[[], object]] = {
        "ours": lambda: ours(case, generator),
        "torch": lambda: ours(case, generator, "torch"),
        "floor": lambda: floor(case),
    }
    if not case.filters:
        calls["naive"] = lambda: naive(case, generator)
    with torch.no_grad():
        agree = _greedy_agree(case, seed)
    counts = dict.fromkeys(calls, repeats)
    profile = profile_calls(calls, counts, flush, torch.device("cpu"), unit)
    medians, memory = profile.medians, profile.memory
    naive_ms = 1e3 * medians["naive"] if "naive" in medians else None
    return {
        "batch": batch,
        "k": k,
        "vocab": vocab,
        "rows": rows,
        "mode": mode,
        "ours_ms": 1e3 * medians["ours"],
        "torch_ms": 1e3 * medians["torch"],
        "floor_ms": 1e3 * medians["floor"],
        "naive_ms": naive_ms,
        "ours_over_floor": medians["ours"] / medians["floor"],
        "torch_over_floor": medians["torch"] / medians["floor"],
        "ratio": None if naive_ms is None else medians["naive"] / medians["ours"],
        "ours_mem": memory["ours"],
        "naive_mem": memory.get("naive"),
        "agree": agree,
        "others": profile.others,
    }


def format_markdown(results: Sequence[dict[str, Any]], header: dict[str, Any]) -> str:
    """A markdown table of :func:`measure` rows, under a line describing the method."""
    lines = [
        f"Logits path vs naive softmax + chain_verify (cpu, {header['threads']} threads, "
        f"torch {torch.__version__}); median of {header['repeats']} cold calls "
        f"({header['flush_mib']:.0f} MiB flushed before each); memory in units of one "
        "[rows, vocab] float32 buffer; counts uniform in 1..k; ours = backend 'auto' "
        f"({header['backend']}), torch = the PyTorch backend; floor = one read of every "
        f"target row and one draft row per request; filtered = top-k {FILTERS['top_k']}, "
        f"top-p {FILTERS['top_p']}.",
        "",
        "| batch | k | vocab | rows | mode | ours ms | torch ms | floor ms | ours/floor "
        "| torch/floor | naive ms | naive/ours | ours mem | naive mem | greedy agree | others |",
        "|---:|---:|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|",
    ]
    for r in results:
        agree = "-" if r["agree"] is None else ("yes" if r["agree"] else "NO")
        others = "-" if r["others"] is None else f"{100 * r['others']:.0f}%"
        naive_ms = "-" if r["naive_ms"] is None else f"{r['naive_ms']:.1f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        naive_mem = "-" if r["naive_mem"] is None else f"{r['naive_mem']:.2f}"
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['vocab']} | {r['rows']} | {r['mode']} "
            f"| {r['ours_ms']:.2f} | {r['torch_ms']:.2f} | {r['floor_ms']:.2f} "
            f"| {r['ours_over_floor']:.2f}x | {r['torch_over_floor']:.2f}x | {naive_ms} "
            f"| {ratio} | {r['ours_mem']:.2f} | {naive_mem} | {agree} | {others} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run every shape and mode, print the markdown table."""
    parser = argparse.ArgumentParser(
        description="Cold-cache latency and peak memory of verify() on logits against a "
        "full softmax followed by the padded probabilities verifier."
    )
    parser.add_argument(
        "--quick", action="store_true", help="one small shape (8x4x32000), 3 repeats"
    )
    parser.add_argument(
        "--shapes", nargs="+", type=parse_shape, metavar="BxKxV", help="shapes to run"
    )
    parser.add_argument(
        "--repeats", type=int_in_range(1), default=None, help="cold calls (default 5)"
    )
    parser.add_argument(
        "--threads", type=int_in_range(1), default=None, help="CPU threads torch may use"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    args = parser.parse_args(argv)
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    repeats = args.repeats or (3 if args.quick else 5)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    compiler.warm_up()
    nbytes = cache_flush_bytes(torch.device("cpu"))
    flush = Flusher(torch.device("cpu"), nbytes)
    results = []
    for shape in shapes:
        for mode in MODES:
            row = measure(shape, mode, repeats=repeats, flush=flush, seed=args.seed)
            results.append(row)
            print(
                f"{'x'.join(map(str, shape))} {mode}: ours {row['ours_ms']:.2f} ms, "
                f"floor {row['floor_ms']:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
    header = {
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "flush_mib": nbytes / 2**20,
        "backend": resolve("auto", torch.zeros(1)),
    }
    print(format_markdown(results, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
