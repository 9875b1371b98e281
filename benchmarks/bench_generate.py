"""Our generation against transformers' own, with the shipped default pair, in one process.

Every contestant generates the same prompts (``--prompts``, cycled from eight fixed Python
snippets), at most ``--max-new-tokens`` each and stopping at EOS, at every temperature of
``--temperatures`` (0 decodes greedily; sampling uses the full distribution, no top-k cut):

* ``hf target``: transformers' ``generate`` with the target alone;
* ``hf assisted``: with the draft model as assistant, transformers' defaults (20 drafts a
  step, constant schedule, drafting stops early below 0.4 confidence, a threshold
  transformers adapts during the call where scikit-learn is installed);
* ``hf assisted k=K``: the same with ``-k`` drafts every step (no early stop);
* ``hf prompt lookup``: n-gram drafts from the sequence itself, ``-k`` per step;
* ``ours target``: :func:`~specsample.generate.target_generate`, target-only;
* ``ours fixed k (model)``, ``ours adaptive (model)``: :func:`~specsample.generate.
  speculative_generate` with the draft model, ``-k`` drafts a step or an adaptive number
  of at most ``-k``;
* ``ours fixed k (n-gram)``, ``ours adaptive (n-gram)``: the same with
  :class:`~specsample.generate.NGramDrafter` drafts.

transformers runs at batch size 1 (one prompt after the other; ``--ours-only`` leaves it out,
which leaves time for more rounds where only ours against ours is in question); ours runs
at every batch size of ``--batch-sizes`` (1 always included), with continuous batching
(``max_batch_size``).
Each contestant is warmed up once, then runs once per round for ``--rounds`` rounds
(sampling with other random numbers each round, the same for every contestant of ours);
every call is timed around the whole call with :class:`specsample.timing.Stopwatch`, tokens counted
from what it returned (EOS included). The contestants that a ratio compares form a group
(one temperature's batch-1 contestants, transformers' included; ours at one temperature and
batch size; the queue), and a round runs the groups one after the other, each group's
contestants back to back, both orders rotating between rounds: the speed of a shared
machine drifts (by up to 2x over a minute on the one the README's figures come from), and
contestants timed seconds apart meet the same speed, where contestants minutes apart need
not. The tables report medians over the rounds of tokens per second (tokens rather than
calls, because a sampled sequence may stop at EOS after a different length in each run),
and every ratio is the median over the rounds of that round's ratio (the two contestants'
calls of one round ran at most a group's length apart):

* batch 1: each contestant's tokens/s and its ratio to ``hf target``; then the headline
  ratios ``ours adaptive (model) / best hf assisted`` (the faster of the two assisted
  contestants, named), ``ours adaptive (n-gram) / hf prompt lookup`` and
  ``ours target / hf target``;
* ours by batch size, per drafter: ``adaptive / target`` and ``adaptive / fixed k`` (the
  adaptive draft length should never be slower than either), in how many rounds the
  adaptive contestant was at least :data:`NOT_SLOWER` times target-only and at least as
  fast as fixed ``k`` (a tie shows as about half the rounds either way), ``fixed k /
  target``, and the adaptive contestant's tokens/s;
* queue (``--queue`` prompts, temperature 0, ours only; ``--queue 0`` skips it): ours
  target and ours adaptive with either drafter, at batch size 1 and at the largest batch
  size, whose batch keeps refilling from the queue as sequences finish: tokens/s at both,
  ``batch B / batch 1`` of each, and ``/ target`` (at batch size B).

The header gives the command line and the share of the CPUs other processes used during
the timed rounds (a busy machine skews every ratio). A plot (``--plot``, default
``bench_generate.png``; ``--no-plot``; left out without matplotlib) shows the batch-1
tokens/s of every contestant and ours at every batch size, one column per temperature;
``--raw`` writes every timed call (its contestant, round and tokens/s) as a JSON line, to see
the spread behind a median.

The default run (``--threads 1``: 8 prompts x 96 new tokens, temperatures 0 and 1, batch
sizes 1 4 8, a queue of 32, 5 rounds) takes about 20 minutes on an idle 2-core machine
(a round under 4 minutes, two thirds of it the main section, a third the queue); single
cells still move by a few percent between runs, so read ratios near 1 as ties.
Run ``python benchmarks/bench_generate.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import shlex
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from generate_contestants import (
    DRAFTS,
    HF_ASSISTED,
    HF_LOOKUP,
    HF_TARGET,
    OURS_TARGET,
    Contestant,
    Slot,
    hf_assisted_k,
    hf_contestants,
    ours,
    ours_contestants,
)
from model_loading import load_default_pair

from specsample.bench import CpuShare
from specsample.generate import PolicyMemory
from specsample.timing import Stopwatch

PROMPTS = (
    "def parse(text):",
    "import os\nimport sys\n\n\ndef main():",
    "class Node:\n    def __init__(self, value):",
    "    for key, value in items:",
    "def read_file(path):\n    with open(path) as f:",
    "        if not isinstance(name, str):",
    "    def __repr__(self):",
    "    except KeyError:",
)
WARM_UP_TOKENS = 4
NOT_SLOWER = 0.98
"""The least ratio of adaptive to target-only tokens/s that counts as not slower."""
Rates = dict[Slot, list[float]]
"""Tokens/s of every contestant, one value per round."""


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=[0.0, 1.0],
        help="sampling temperatures, 0 greedy (default 0 1)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[1, 4, 8],
        help="batch sizes of ours, 1 always included (default 1 4 8)",
    )
    parser.add_argument("-k", type=int, default=4, help="drafts per step (default 4)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=96, help="most new tokens per prompt (default 96)"
    )
    parser.add_argument(
        "--prompts", type=int, default=8, help="prompts, the snippets cycled (default 8)"
    )
    parser.add_argument(
        "--queue",
        type=int,
        default=32,
        help="prompts of the queue section, 0 to skip it (default 32)",
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="timed runs of each contestant (default 5)"
    )
    parser.add_argument(
        "--ours-only",
        action="store_true",
        help="leave transformers' contestants out (no headline ratios; more rounds in less time)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--plot", default="bench_generate.png", help="where to save the plot (default %(default)s)"
    )
    parser.add_argument("--no-plot", action="store_true", help="save no plot")
    parser.add_argument(
        "--raw", default=None, help="also write every timed call to this file, a JSON line each"
    )
    args = parser.parse_args(argv)
    args.batch_sizes = sorted({1, *args.batch_sizes})
    return args


def _cycled(count: int, tokenizer: Any) -> list[list[int]]:
    """The first ``count`` prompts of :data:`PROMPTS` repeated, as token ids."""
    return [tokenizer.encode(p) for p in itertools.islice(itertools.cycle(PROMPTS), count)]


def _contestants(
    args: argparse.Namespace, target: Any, draft: Any, tokenizer: Any
) -> list[Contestant]:
    """Every contestant of the run: each temperature's, then the queue's; all of ours share
    one policy memory, so every warm run starts from what the earlier ones learnt."""
    eos = tokenizer.eos_token_id
    memory = PolicyMemory()
    prompts = _cycled(args.prompts, tokenizer)
    found: list[Contestant] = []
    for temperature in args.temperatures:
        peers = {} if args.ours_only else hf_contestants(target, draft, temperature, args.k, eos)
        for name, generate in peers.items():
            found.append(Contestant(Slot("main", name, temperature, 1), prompts, generate))
        for batch in args.batch_sizes:
            peers = ours_contestants(target, draft, temperature, batch, args.k, eos, memory)
            for name, generate in peers.items():
                found.append(Contestant(Slot("main", name, temperature, batch), prompts, generate))
    if args.queue:
        queue = _cycled(args.queue, tokenizer)
        for batch in sorted({1, args.batch_sizes[-1]}):
            peers = ours_contestants(target, draft, 0.0, batch, args.k, eos, memory)
            for name in _queue_names():
                found.append(Contestant(Slot("queue", name, 0.0, batch), queue, peers[name]))
    return found


def _queue_names() -> list[str]:
    return [OURS_TARGET, *(ours(True, drafts) for drafts in DRAFTS)]


def _rotated(items: Sequence[Any], round_index: int, rounds: int) -> list[Any]:
    """``items`` started at a different place in every round, the places spread evenly."""
    shift = round_index * len(items) // rounds
    return [*items[shift:], *items[:shift]]


def _group(slot: Slot) -> tuple[object, ...]:
    """The contestants a ratio of the report compares: one temperature's batch-1
    contestants (transformers' and ours), ours at one temperature and larger batch size, or
    the whole queue section (its ratios compare batch sizes)."""
    if slot.section == "queue":
        return (slot.section,)
    return (slot.section, slot.temperature, slot.batch)


def _groups(contestants: list[Contestant]) -> list[list[Contestant]]:
    """``contestants`` by :func:`_group`, in order of first appearance."""
    groups: dict[tuple[object, ...], list[Contestant]] = {}
    for contestant in contestants:
        groups.setdefault(_group(contestant.slot), []).append(contestant)
    return list(groups.values())


def _measure(contestants: list[Contestant], args: argparse.Namespace) -> tuple[Rates, float | None]:
    """Tokens/s of every contestant in every round, and the CPU share other processes took."""
    print(f"warming up {len(contestants)} contestants", file=sys.stderr, flush=True)
    for contestant in contestants:
        contestant.tokens_per_s(WARM_UP_TOKENS)
    rates: Rates = {c.slot: [] for c in contestants}
    groups = _groups(contestants)
    started = Stopwatch()
    with CpuShare() as share:
        for round_index in range(args.rounds):
            for group in _rotated(groups, round_index, args.rounds):
                for contestant in _rotated(group, round_index, args.rounds):
                    torch.manual_seed(round_index)
                    rates[contestant.slot].append(contestant.tokens_per_s(args.max_new_tokens))
            elapsed = started.elapsed()
            left = elapsed / (round_index + 1) * (args.rounds - round_index - 1)
            print(
                f"round {round_index + 1}/{args.rounds} done, {elapsed:.0f} s, "
                f"about {left:.0f} s left",
                file=sys.stderr,
                flush=True,
            )
    return rates, share.share


def _write_raw(rates: Rates, path: str) -> None:
    """Every timed call: its contestant, round and tokens/s, one JSON object per line."""
    with open(path, "w") as out:
        for slot, values in rates.items():
            for round_index, value in enumerate(values):
                out.write(
                    json.dumps({**slot._asdict(), "round": round_index, "tokens_per_s": value})
                )
                out.write("\n")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


class Cells:
    """The rates of one section, temperature and batch size, by contestant name."""

    def __init__(self, rates: Rates, temperature: float, batch: int, section: str = "main") -> None:
        self.rounds = {
            slot.name: values
            for slot, values in rates.items()
            if (slot.section, slot.temperature, slot.batch) == (section, temperature, batch)
        }

    def __iter__(self) -> Iterator[str]:
        return iter(self.rounds)

    def rate(self, name: str) -> float:
        """Median tokens/s of ``name``."""
        return statistics.median(self.rounds[name])

    def ratio(self, name: str, base: str, other: Cells | None = None) -> float:
        """Median over the rounds of ``name``'s tokens/s over ``base``'s (``base`` read
        from ``other`` when given)."""
        return statistics.median(self._ratios(name, base, other))

    def rounds_at_least(self, name: str, base: str, floor: float) -> str:
        """In how many rounds ``name``'s tokens/s were at least ``floor`` times ``base``'s,
        as ``"hits/rounds"``."""
        ratios = self._ratios(name, base)
        return f"{sum(r >= floor for r in ratios)}/{len(ratios)}"

    def _ratios(self, name: str, base: str, other: Cells | None = None) -> list[float]:
        bases = (self if other is None else other).rounds[base]
        return [a / b for a, b in zip(self.rounds[name], bases, strict=True)]


def _batch_one(rates: Rates, temperature: float, k: int) -> list[str]:
    """Every contestant at batch size 1, then the headline ratios (ours alone: none)."""
    cells = Cells(rates, temperature, 1)
    if HF_TARGET not in cells.rounds:
        rows = [[name, f"{cells.rate(name):.1f}"] for name in cells]
        return _table(["contestant (batch 1)", "tokens/s"], rows)
    lines = _table(
        ["contestant (batch 1)", "tokens/s", "/ hf target"],
        [[name, f"{cells.rate(name):.1f}", _x(cells.ratio(name, HF_TARGET))] for name in cells],
    )
    assisted = max((HF_ASSISTED, hf_assisted_k(k)), key=cells.rate)
    headlines = [
        (f"{ours(True, 'model')} / best hf assisted ({assisted})", ours(True, "model"), assisted),
        (f"{ours(True, 'n-gram')} / {HF_LOOKUP}", ours(True, "n-gram"), HF_LOOKUP),
        (f"{OURS_TARGET} / {HF_TARGET}", OURS_TARGET, HF_TARGET),
    ]
    rows = [[label, f"**{_x(cells.ratio(a, b))}**"] for label, a, b in headlines]
    return [*lines, "", *_table(["headline (batch 1)", "ratio"], rows)]


def _by_batch(rates: Rates, temperature: float, batches: list[int]) -> list[str]:
    """Ours at every batch size: adaptive against target-only and against fixed k."""
    rows = []
    for batch in batches:
        cells = Cells(rates, temperature, batch)
        for drafts in DRAFTS:
            adaptive, fixed = ours(True, drafts), ours(False, drafts)
            rows.append(
                [
                    str(batch),
                    drafts,
                    _x(cells.ratio(adaptive, OURS_TARGET)),
                    _x(cells.ratio(adaptive, fixed)),
                    cells.rounds_at_least(adaptive, OURS_TARGET, NOT_SLOWER),
                    cells.rounds_at_least(adaptive, fixed, 1.0),
                    _x(cells.ratio(fixed, OURS_TARGET)),
                    f"{cells.rate(adaptive):.1f}",
                ]
            )
    header = [
        "batch",
        "drafts",
        "adaptive / target",
        "adaptive / fixed k",
        f"rounds >= {NOT_SLOWER:.2f}x target",
        "rounds >= 1.00x fixed k",
        "fixed k / target",
        "adaptive tokens/s",
    ]
    return _table(header, rows)


def _queue(rates: Rates, batch: int) -> list[str]:
    """Ours on the queue at batch size 1 and ``batch``."""
    single, full = Cells(rates, 0.0, 1, "queue"), Cells(rates, 0.0, batch, "queue")
    rows = [
        [
            name,
            f"{single.rate(name):.1f}",
            f"{full.rate(name):.1f}",
            _x(full.ratio(name, name, single)),
            _x(full.ratio(name, OURS_TARGET)),
        ]
        for name in _queue_names()
    ]
    header = [
        "contestant",
        "tokens/s batch 1",
        f"tokens/s batch {batch}",
        f"batch {batch} / batch 1",
        f"/ target (batch {batch})",
    ]
    return _table(header, rows)


def _report(rates: Rates, args: argparse.Namespace) -> list[str]:
    lines = []
    for temperature in args.temperatures:
        lines += [f"### Temperature {temperature:g}", "", *_batch_one(rates, temperature, args.k)]
        lines += ["", *_by_batch(rates, temperature, args.batch_sizes), ""]
    if args.queue:
        batch = args.batch_sizes[-1]
        lines += [f"### Queue: {args.queue} prompts, temperature 0", ""]
        lines += [*_queue(rates, batch), ""]
    return lines


def _plot(rates: Rates, args: argparse.Namespace) -> None:
    """Batch-1 tokens/s of every contestant, and ours at every batch size, per temperature."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = args.temperatures
    fig, axes = plt.subplots(
        2, len(temperatures), figsize=(6.5 * len(temperatures), 9), squeeze=False
    )
    for column, temperature in enumerate(temperatures):
        single = Cells(rates, temperature, 1)
        top = axes[0][column]
        contestants = list(single)
        colours = ["tab:gray" if n.startswith("hf") else "tab:orange" for n in contestants]
        values = [single.rate(name) for name in contestants]
        bars = top.bar(range(len(values)), values, color=colours)
        top.bar_label(bars, fmt="%.0f", fontsize=8)
        top.set_xticks(range(len(values)), contestants, rotation=35, ha="right", fontsize=8)
        top.set_title(f"batch 1, temperature {temperature:g}")
        top.set_ylabel("tokens/s")
        bottom = axes[1][column]
        names = [OURS_TARGET, *(ours(a, d) for d in DRAFTS for a in (False, True))]
        width = 0.8 / len(args.batch_sizes)
        for i, batch in enumerate(args.batch_sizes):
            cells = Cells(rates, temperature, batch)
            values = [cells.rate(name) for name in names]
            places = [j + (i - (len(args.batch_sizes) - 1) / 2) * width for j in range(len(names))]
            bottom.bar(places, values, width, label=f"batch {batch}")
        bottom.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        bottom.set_title(f"ours by batch size, temperature {temperature:g}")
        bottom.set_ylabel("tokens/s")
        bottom.legend(fontsize=8)
    fig.suptitle(f"{args.prompts} prompts x {args.max_new_tokens} new tokens, k={args.k}")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Print the report and save the plot (where matplotlib is installed); return 0.

    Without transformers the script is skipped (:func:`model_loading.load_default_pair`).
    """
    args = _arguments(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    loaded = load_default_pair()
    if loaded is None:
        return 0
    tokenizer, target, draft = loaded
    if not args.no_plot and importlib.util.find_spec("matplotlib") is None:
        print("plot skipped: matplotlib is not installed (pip install 'specsample[plot]')")
        args.no_plot = True
    import transformers

    command = shlex.join(["python", sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"`{command}`\n")
    print(
        f"{args.prompts} prompts x {args.max_new_tokens} new tokens, k={args.k}, "
        f"{torch.get_num_threads()} torch threads, median of {args.rounds} rounds; "
        f"torch {torch.__version__}, transformers {transformers.__version__}\n",
        flush=True,
    )
    rates, share = _measure(_contestants(args, target, draft, tokenizer), args)
    others = "unknown" if share is None else f"{share:.0%}"
    print(f"Other processes used {others} of the CPUs during the timed rounds.\n")
    print("\n".join(_report(rates, args)))
    if args.raw is not None:
        _write_raw(rates, args.raw)
        print(f"every timed call written to {args.raw}")
    if not args.no_plot:
        _plot(rates, args)
        print(f"plot saved to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
