"""The benchmark's plain-text table, with its methodology header."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_COLUMNS: tuple[tuple[str, str, int, int, str], ...] = (
    ("batch", "batch", 5, 0, ""),
    ("k", "k", 2, 0, ""),
    ("vocab", "vocab", 6, 0, ""),
    ("alpha", "alpha", 5, 2, ""),
    ("others", "others", 6, 0, "%"),
    ("|", "", 0, 0, ""),
    ("ours ms", "ours_ms", 8, 3, ""),
    ("torch ms", "torch_ms", 8, 3, ""),
    ("floor ms", "floor_ms", 8, 3, ""),
    ("naive ms", "naive_ms", 9, 2, ""),
    ("hf ms", "hf_ms", 8, 2, ""),
    ("|", "", 0, 0, ""),
    ("naive/ours", "speedup", 10, 1, "x"),
    ("ours/floor", "ours_over_floor", 10, 2, "x"),
    ("torch/floor", "torch_over_floor", 11, 2, "x"),
    ("hf/ours", "hf_over_ours", 8, 1, "x"),
    ("|", "", 0, 0, ""),
    ("mem ours", "ours_mem", 8, 3, ""),
    ("torch", "torch_mem", 6, 3, ""),
    ("naive", "naive_mem", 6, 2, ""),
    ("hf", "hf_mem", 6, 2, ""),
    ("floor", "floor_mem", 6, 3, ""),
)
"""Table columns: title, row key, width, decimals, suffix (``|`` separates groups)."""


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def _cell(value: float | None, width: int, digits: int, suffix: str) -> str:
    text = "-" if value is None else f"{value:.{digits}f}{suffix}"
    return f"{text:>{width}}"


def _header(first: dict[str, Any]) -> list[str]:
    """The methodology lines above the table, read from the first row."""
    return [
        f"Verification latency, cold caches ({first['device']}, {first['dtype']}, "
        f"{first['threads']} threads, torch {torch.__version__})",
        f"Before every timed call a {first['flush_mib']:.0f} MiB buffer is overwritten, so each "
        "contestant, the floor included, reads its inputs from memory;",
        f"median of {first['repeats']} cold calls after one warm-up "
        f"({first['slow_repeats']} for naive and hf), contestants interleaved. Inputs: softmax "
        "rows, drafts sampled from the draft rows.",
        "alpha = mean acceptance probability per position. floor = one read of the target and "
        "draft rows at one position per sequence.",
        "ours = RejectionSampler() on its default backend (the fused CPU kernel on CPU tensors "
        "when numba is installed); torch = the same on backend='torch'.",
        "others = share of the CPUs used by other processes during the timed calls; above a few "
        "% they slow multi-threaded calls.",
        "mem = extra peak memory during one call, in units of one [batch, k, vocab] probs tensor.",
        "",
    ]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Render :func:`run_benchmark` rows as a plain-text table with its methodology header.

    Examples
    --------
    >>> from specsample.bench import run_benchmark
    >>> rows = run_benchmark([(2, 2, 64)], repeats=1, slow_repeats=1, flush_bytes=2**20,
    ...                      progress=False)
    >>> print(format_table(rows).splitlines()[0])  # doctest: +ELLIPSIS
    Verification latency, cold caches (cpu, float32, ...
    """
    if not rows:
        return "(no shapes benchmarked)"
    lines = _header(rows[0])
    header = " ".join("|" if t == "|" else f"{t:>{w}}" for t, _, w, _, _ in _COLUMNS)
    lines += [header, "-" * len(header)]
    for row in rows:
        values = dict(row, others=_percent(row.get("others")))
        lines.append(
            " ".join(
                "|" if title == "|" else _cell(values[key], width, digits, suffix)
                for title, key, width, digits, suffix in _COLUMNS
            )
        )
    notes = dict.fromkeys(note for row in rows for note in row["notes"])
    lines += ["", *notes]
    return "\n".join(lines)
