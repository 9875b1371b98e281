"""What ``specsample generate`` prints: the streamed text, the sequences, the statistics.

The text of the first sequence is streamed as it is generated (batch 1, :class:`Stream`);
otherwise every sequence is printed at the end. Then come the run's statistics
(:func:`print_stats`), with ``--compare`` the target-only statistics and the wall-clock
speedup (:func:`print_speedup`), and with ``--plot`` a bar chart of the acceptance by draft
position (:func:`plot_acceptance`).

The speedup is a ratio of two wall-clock runs on the same machine, so other processes
competing for the CPUs make it noisy: a note follows the speedup when other processes used
:data:`BUSY_SHARE` of the CPUs or more during the two runs (as the benchmarks measure it,
:class:`specsample.bench.measure.CpuShare`).
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any

from specsample.extras import install_command
from specsample.methods import METHODS

BUSY_SHARE = 0.1
"""From this share of the CPUs used by other processes on, the timed runs competed with
them, and :func:`print_speedup` says so."""


class Stream:
    """Print the prompt (none when ``prompt_ids`` is empty), then sequence 0 as it arrives.

    The whole sequence is decoded each time and only the new suffix printed, so tokens that
    merge with their neighbours (spaces, multi-byte characters) print correctly. An instance
    is the ``on_tokens`` callback of :func:`specsample.generate.speculative_generate`.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        Decodes the ids.
    prompt_ids : list of int
        The prompt, printed first.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: "".join(map(chr, ids)))
    >>> stream = Stream(tokenizer, [104, 105])
    hi
    >>> stream(0, [33])
    !
    """

    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        if not self.ids:
            self.printed = ""
            return
        self.printed = tokenizer.decode(self.ids, skip_special_tokens=True)
        sys.stdout.write(self.printed)
        sys.stdout.flush()

    def __call__(self, index: int, token_ids: list[int]) -> None:
        """Print what ``token_ids``, new tokens of sequence ``index`` (0), add to the text."""
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.printed):
            return
        sys.stdout.write(text[len(self.printed) :])
        sys.stdout.flush()
        self.printed = text


def print_sequences(
    output: Any, streamed: bool, tokenizer: Any, prompt_ids: list[int], method: str
) -> None:
    """End the streamed sequence, or print every sequence; then the run's statistics.

    Printed sequences follow ``prompt_ids`` (empty with ``--chat``: the reply alone).
    """
    if streamed:
        print("\n")
    else:
        for i, ids in enumerate(output.sequences):
            print(f"[{i}] {tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)}")
        print()
    print_stats(output, method)


def print_stats(output: Any, method: str) -> None:
    """The run's statistics, and a note when the rule is lossy."""
    print(output.stats.format_table())
    if not METHODS[method].exact:
        print(f"note: {method} acceptance is lossy; this output is not a sample of the target")


def print_speedup(output: Any, baseline: Any, others: float | None = None) -> None:
    """The target-only statistics, then the wall-clock speedup of speculative decoding.

    Parameters
    ----------
    output, baseline : GenerationOutput
        The speculative and the target-only run.
    others : float, optional
        The share of the CPUs other processes used during both runs
        (:class:`specsample.bench.measure.CpuShare`): from :data:`BUSY_SHARE` on, a note says
        that they competed for the CPUs.
    """
    print()
    print(baseline.stats.format_table())
    speedup = output.stats.tokens_per_s / baseline.stats.tokens_per_s
    print(
        f"\nwall-clock speedup: {speedup:.2f}x ({baseline.stats.tokens_per_s:.1f} tokens/s "
        f"target-only -> {output.stats.tokens_per_s:.1f} tokens/s speculative; tokens per "
        "second, since sampled runs may stop at EOS after different lengths)"
    )
    if others is not None and others >= BUSY_SHARE:
        print(
            f"note: other processes used {others:.0%} of the CPUs during the two runs: they "
            "slow both runs and make their ratio noisy (a quiet machine with --threads 1 "
            "gives steadier figures)"
        )


def plot_acceptance(stats: Any, path: str) -> None:
    """Save a bar chart of the acceptance by draft position to ``path``, and say so.

    Raises
    ------
    ImportError
        matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            f"--plot needs matplotlib; install it with: {install_command('plot')}"
        ) from None
    rates = stats.acceptance_by_position
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.bar(range(1, len(rates) + 1), rates, color="tab:blue")
    axes.set_xlabel("draft position")
    axes.set_ylabel("fraction accepted")
    axes.set_ylim(0, 1)
    axes.set_xticks(range(1, len(rates) + 1))
    title = f"acceptance by position: k={stats.k}, {stats.method}, drafter {stats.drafter}"
    axes.set_title("\n".join(textwrap.wrap(title, 72)), fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    print(f"acceptance by position saved to {path}")
