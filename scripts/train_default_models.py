"""Train the default target/draft pair shipped in ``specsample/models/default``.

Everything is trained from text every CPython installation has: the ``.py`` files of its own
standard library (``sysconfig.get_paths()["stdlib"]``, without test suites or site-packages),
read in sorted order. The script

1. trains a byte-level BPE tokenizer (``tokenizers``) shared by both models,
2. trains the target, a ``LlamaForCausalLM``, on next-token cross-entropy,
3. stores it (bfloat16 weights, float32 config) and reloads it exactly as shipped,
4. lets the target continue random windows of the training text (``--target-samples``, some
   greedy, the rest sampled at temperature 1), and trains the draft, a one-layer
   ``LlamaForCausalLM``, by distillation on windows of that text and of the training text
   (``--sample-share``): the KL divergence from the target's next-token distribution
   (optionally mixed with cross-entropy),
5. measures on held-out files (and on the target's continuations of held-out prompts) the
   losses, the draft's greedy agreement with the target and the mean acceptance
   ``sum_x min(p, q)`` at temperature 1,
6. times one decoding step of each model (one token against a 128-token KV cache, batch 1),
7. writes both model directories and ``training.json`` into ``--out`` (and, with
   ``--readme``, a README of the run).

``--out`` is required. A directory inside the ``specsample`` package (the shipped pair lives in
``specsample/models/default``) is refused unless ``--overwrite-shipped`` is given, so that a
copied command never replaces the shipped weights by accident; replacing them also rewrites
``specsample/models/README.md``.

``--reuse-target`` skips steps 2 and 3: it keeps the target already in ``--out`` (its training
as recorded in ``training.json``) and trains a new draft against it.

Given ``--seed`` and explicit ``--steps`` / ``--draft-steps`` the result is deterministic on a
given machine and Python version. Without them each phase trains until it has used most of its
share of ``--minutes`` and then fixes its step count (see ``run_phase``); the resolved counts are
printed and recorded in the README, and passing them repeats the run exactly.

Usage::

    HF_HUB_OFFLINE=1 python scripts/train_default_models.py --out trained-models --minutes 30
    HF_HUB_OFFLINE=1 python scripts/train_default_models.py --out trained-models \
        --reuse-target --minutes 32
    # replace the shipped pair (and its README):
    HF_HUB_OFFLINE=1 python scripts/train_default_models.py --minutes 30 \
        --out specsample/models/default --overwrite-shipped
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specsample.timing import Stopwatch, now

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_OUT = ROOT / "specsample" / "models" / "default"
SHIPPED_README = ROOT / "specsample" / "models" / "README.md"
REPEAT_OUT = "trained-models"
"""Where the recorded repeat command writes: a directory outside the package."""

EOS = "<|endoftext|>"
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
HELD_OUT_EVERY = 25
"""Every 25th file (in sorted order) is held out for evaluation."""
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
OMP_POLICY = "OMP_WAIT_POLICY"
START_ENV = "TRAIN_DEFAULT_MODELS_START"
RESERVE_S = 150.0
"""Seconds kept for evaluation, timing and saving at the end of the budget."""
RECORD = "training.json"
"""What a run records next to the models (read back by ``--reuse-target``)."""
SAMPLE_PROMPT_LEN = 32
"""Tokens of training text that start each of the target's own samples."""
HELD_SAMPLES = 64
"""Target samples from held-out prompts, for evaluation."""


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int

    def describe(self) -> str:
        return (
            f"{self.layers} layer{'s' if self.layers != 1 else ''}, hidden {self.hidden}, "
            f"MLP {self.intermediate}, "
            f"{self.heads} heads of {self.hidden // self.heads}"
        )


TARGET_SHAPE = ModelShape(layers=12, hidden=320, intermediate=864, heads=5)
DRAFT_SHAPE = ModelShape(layers=1, hidden=128, intermediate=384, heads=2)


@dataclass
class PhaseResult:
    steps: int
    planned_steps: int
    seconds: float
    final_loss: float
    tokens_per_s: float
    stopped_early: bool
    log: list[str] = field(default_factory=list)
    model: Any = field(default=None, repr=False, compare=False)

    def record(self) -> dict[str, Any]:
        """The counts and figures, without the model and the log."""
        return {k: v for k, v in asdict(self).items() if k not in ("model", "log")}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# Data


def stdlib_files() -> tuple[Path, list[Path]]:
    """The standard library's ``.py`` files, sorted, without test suites or site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if EXCLUDED_DIRS.intersection(parts[:-1]) or parts[-1].startswith("test_"):
            continue
        if path.is_file():
            files.append(path)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return root, files


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap_tokenizer(tokenizer: Any, context: int) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=context,
    )


def encode_stream(tokenizer: Any, texts: list[str], eos_id: int) -> torch.Tensor:
    """All texts as one token stream, each followed by EOS."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.int16)


def batches(
    stream: torch.Tensor, batch_size: int, seq_len: int, seed: int
) -> Iterator[torch.Tensor]:
    """Endless random windows of ``seq_len`` tokens, reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.arange(seq_len)
    high = stream.numel() - seq_len
    while True:
        starts = torch.randint(0, high, (batch_size, 1), generator=generator)
        yield stream[starts + offsets].long()


def teacher_batches(
    target: Any, windows: Iterator[torch.Tensor], *, pool: int, reuse: int, seed: int
) -> Iterator[torch.Tensor]:
    """Batches for distillation: windows with the target's next-token log-probabilities.

    Running the target costs far more than a draft step, so its outputs are kept in a pool of
    the last ``pool`` batches: a new batch joins every ``reuse`` steps, and each step draws one
    from the pool at random (reproducibly from ``seed``). Each item is a float tensor
    ``[batch, len, 1 + vocab]``: the token ids, then the log-probabilities after each token.
    """
    generator = torch.Generator().manual_seed(seed)
    kept: deque[torch.Tensor] = deque(maxlen=pool)
    step = 0
    while True:
        if step % reuse == 0:
            ids = next(windows)
            with torch.no_grad():
                logits = target(input_ids=ids[:, :-1]).logits.float()
                t_logp = F.log_softmax(logits, -1)
            t_logp = torch.cat([t_logp, t_logp.new_zeros(t_logp.shape[0], 1, t_logp.shape[2])], 1)
            kept.append(torch.cat([ids.float().unsqueeze(-1), t_logp], -1))
        step += 1
        yield kept[int(torch.randint(len(kept), (1,), generator=generator))]


def target_samples(
    target: Any,
    stream: torch.Tensor,
    *,
    count: int,
    prompt_len: int,
    new_tokens: int,
    greedy_share: float,
    eos_id: int,
    seed: int,
) -> torch.Tensor:
    """Text written by the target itself, as one stream (``int16``, every sample ends in EOS).

    Each sample continues a random ``prompt_len``-token window of ``stream`` by up to
    ``new_tokens`` tokens; the first ``greedy_share`` of them decode greedily, the others
    sample at temperature 1 (seeded from ``seed``). The draft then learns the target on the
    text it actually produces when decoding, loops and all, not only on human-written code.
    """
    from specsample.generate import target_generate

    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - prompt_len, (count, 1), generator=generator)
    prompts = (stream[starts + torch.arange(prompt_len)]).long()
    greedy = round(count * greedy_share)
    temperature = [0.0] * greedy + [1.0] * (count - greedy)
    watch = Stopwatch()
    logged = 0

    def progress(done: int, total: int, tokens: int) -> None:
        nonlocal logged
        if done - logged >= 64 or (done == total and done > logged):
            logged = done
            log(f"target samples: {done}/{total}, {tokens:,} tokens ({watch.elapsed():.0f} s)")

    out = target_generate(
        target,
        prompts,
        temperature=temperature,
        max_new_tokens=new_tokens,
        eos_token_id=eos_id,
        seeds=seed,
        max_batch_size=64,
        on_progress=progress,
    )
    ids: list[int] = []
    for prompt, sequence in zip(prompts.tolist(), out.sequences, strict=True):
        ids.extend(prompt + sequence)
        if not sequence or sequence[-1] != eos_id:
            ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.int16)


def mixed_batches(
    streams: tuple[torch.Tensor, torch.Tensor],
    share: float,
    batch_size: int,
    seq_len: int,
    seed: int,
) -> Iterator[torch.Tensor]:
    """Endless random windows, each from ``streams[1]`` with probability ``share``."""
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.arange(seq_len)
    while True:
        rows = []
        for _ in range(batch_size):
            pick = float(torch.rand((), generator=generator)) < share
            stream = streams[1] if pick else streams[0]
            start = int(torch.randint(0, stream.numel() - seq_len, (), generator=generator))
            rows.append(stream[start + offsets])
        yield torch.stack(rows).long()


def eval_windows(stream: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    """Up to ``count`` consecutive non-overlapping windows from the start of ``stream``."""
    n = min(count, stream.numel() // seq_len)
    return stream[: n * seq_len].view(n, seq_len).long()


# Models


def make_model(shape: ModelShape, vocab_size: int, eos_id: int, context: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return LlamaForCausalLM(config)


def n_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def optimizer_for(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


DECAY_FRACTION = 5
"""The learning rate decays over the last fifth of the steps."""


def decay_start(total: int) -> int:
    return total - total // DECAY_FRACTION


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, constant, then linear decay to a tenth over the last fifth of the steps.

    Until the decay starts the rate does not depend on ``total``, which lets a run decide its
    step count late, from the time it has used, and still be repeated exactly from that count.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    start = decay_start(total)
    if step < start:
        return peak
    return peak * (1.0 - 0.9 * (step - start + 1) / max(1, total - start))


def autocast(enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast for the matrix products (weights and optimizer stay float32)."""
    if enabled:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_phase(
    name: str,
    model: Any,
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    data: Iterator[torch.Tensor],
    *,
    steps: int | None,
    budget_s: float,
    hard_stop: float,
    peak_lr: float,
    warmup: int,
    tokens_per_step: int,
    log_every: int,
    bf16: bool,
) -> PhaseResult:
    """Train ``model`` for ``steps`` steps, or, with ``steps=None``, for about ``budget_s``.

    Without a step count the run trains at the peak rate until it has used
    ``1 - 1/DECAY_FRACTION`` of its budget, after ``s`` steps say; it then fixes the count at
    ``s + s // (DECAY_FRACTION - 1)`` so that the decay takes about the rest of the budget. As the
    schedule up to that point does not depend on the count, passing the resolved count as
    ``steps`` repeats the run exactly. The speed of this machine varies a lot with its load, so
    this works better than sizing from the speed of the first steps.
    """
    optimizer = optimizer_for(model, peak_lr, weight_decay=0.1)
    model.train()
    total = steps if steps is not None else sys.maxsize
    planned = total
    ema: float | None = None
    lines: list[str] = []
    watch = Stopwatch()
    step = 0
    stopped_early = False
    while step < total:
        elapsed = watch.elapsed()
        if steps is None and total == sys.maxsize:
            if step == 20:
                log(
                    f"{name}: {elapsed / step:.2f} s/step ({step * tokens_per_step / elapsed:.0f} "
                    f"tokens/s) over the first {step} steps; budget {budget_s / 60:.1f} min"
                )
            if step >= warmup and elapsed >= (1 - 1 / DECAY_FRACTION) * budget_s:
                total = step + max(1, step // (DECAY_FRACTION - 1))
                planned = total
                log(
                    f"{name}: {elapsed / 60:.1f} min used after {step} steps; "
                    f"decaying the learning rate until step {total}"
                )
        if now() > hard_stop:
            stopped_early = True
            log(f"{name}: time cap reached, stopping at step {step} of {total}")
            break
        lr = lr_at(step, total, peak_lr, warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast(bf16):
            loss = loss_fn(next(data))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        value = float(loss.detach())
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        step += 1
        if step % log_every == 0 or step == total:
            elapsed = watch.elapsed()
            shown = "?" if total == sys.maxsize else str(total)
            line = (
                f"{name} step {step}/{shown} loss {ema:.3f} lr {lr:.2e} "
                f"{step * tokens_per_step / elapsed:.0f} tokens/s {elapsed / 60:.1f} min"
            )
            lines.append(line)
            log(line)
    seconds = watch.elapsed()
    model.eval()
    return PhaseResult(
        steps=step,
        planned_steps=planned,
        seconds=seconds,
        final_loss=float("nan") if ema is None else ema,
        tokens_per_s=step * tokens_per_step / max(seconds, 1e-9),
        stopped_early=stopped_early,
        log=lines,
    )


def save_model(model: Any, tokenizer: Any, directory: Path) -> None:
    """Save with bfloat16 weights and a float32 config (so it loads back in float32)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        (directory / name).unlink(missing_ok=True)
    model.to(torch.bfloat16).save_pretrained(directory)
    model.to(torch.float32)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(directory)
    finish_directory(directory)


def finish_directory(directory: Path) -> None:
    """Portable metadata and permissions for a saved model directory.

    The tokenizer class is recorded under its name in every ``transformers`` version
    (``PreTrainedTokenizerFast``), and the files are made readable by everyone, as package data.
    """
    tokenizer_config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(0o644)


def load_model(directory: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    if model.dtype != torch.float32:
        raise RuntimeError(f"{directory} loaded as {model.dtype}, expected float32")
    return model.eval()


def dir_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


# Evaluation


@torch.inference_mode()
def evaluate(target: Any, draft: Any, windows: torch.Tensor, batch_size: int) -> dict[str, float]:
    """Held-out losses, greedy agreement and mean ``sum_x min(p, q)`` at temperature 1."""
    sums = dict.fromkeys(("target_ce", "draft_ce", "kl", "agree", "accept"), 0.0)
    count = 0
    for i in range(0, windows.shape[0], batch_size):
        ids = windows[i : i + batch_size]
        inputs, labels = ids[:, :-1], ids[:, 1:].reshape(-1)
        t_logp = F.log_softmax(target(input_ids=inputs).logits.float(), -1).flatten(0, 1)
        d_logp = F.log_softmax(draft(input_ids=inputs).logits.float(), -1).flatten(0, 1)
        sums["target_ce"] += float(F.nll_loss(t_logp, labels, reduction="sum"))
        sums["draft_ce"] += float(F.nll_loss(d_logp, labels, reduction="sum"))
        t_p = t_logp.exp()
        sums["kl"] += float((t_p * (t_logp - d_logp)).sum())
        sums["agree"] += float((t_logp.argmax(-1) == d_logp.argmax(-1)).sum())
        sums["accept"] += float(torch.minimum(t_p, d_logp.exp()).sum())
        count += labels.numel()
    return {key: value / count for key, value in sums.items()} | {"positions": float(count)}


@dataclass
class DecodeCosts:
    """Per-token costs in milliseconds: over all timed steps, and in the least loaded round."""

    median_ms: dict[str, float]
    quiet_ms: dict[str, float]
    steps: int

    def ratio(self, quiet: bool = False) -> float:
        costs = self.quiet_ms if quiet else self.median_ms
        return costs["target"] / costs["draft"]


@torch.inference_mode()
def decode_step_ms(
    models: dict[str, Any], prompt: torch.Tensor, rounds: int, steps: int
) -> DecodeCosts:
    """Time one decoding step (1 token, KV cache of the prompt's length, batch 1) per model.

    Rounds of ``steps`` steps alternate between the models (after a warm-up round) so that both
    see the same machine load. Returns the median over all timed steps and, per model, the
    smallest median of a round (the least loaded one).
    """
    from transformers import DynamicCache

    times: dict[str, list[list[float]]] = {name: [] for name in models}
    caches = {}
    for name, model in models.items():
        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else None
        caches[name] = (cache_arg or "past_key_values", DynamicCache(config=model.config))
        arg, cache = caches[name]
        model(input_ids=prompt, use_cache=True, **{arg: cache})
    token = prompt[:, -1:]
    position = torch.tensor([[prompt.shape[1]]])
    for r in range(rounds + 1):
        for name, model in models.items():
            arg, cache = caches[name]
            round_times = []
            for _ in range(steps):
                watch = Stopwatch()
                model(input_ids=token, position_ids=position, use_cache=True, **{arg: cache})
                round_times.append(watch.elapsed() * 1e3)
                cache.crop(-1)
            if r > 0:
                times[name].append(round_times)
    return DecodeCosts(
        median_ms={
            name: statistics.median(t for r in rounds_ for t in r)
            for name, rounds_ in times.items()
        },
        quiet_ms={
            name: min(statistics.median(r) for r in rounds_) for name, rounds_ in times.items()
        },
        steps=rounds * steps,
    )


# README


def _bullet(text: str) -> str:
    return textwrap.fill(
        " ".join(text.split()), width=100, initial_indent="- ", subsequent_indent="  "
    )


EVAL_ROWS = (
    ("target cross-entropy (nats/token)", "target_ce"),
    ("draft cross-entropy (nats/token)", "draft_ce"),
    ("KL(target \\|\\| draft) (nats/token)", "kl"),
    ("greedy agreement (argmaxes equal)", "agree"),
    ("mean acceptance `sum_x min(p, q)`, temperature 1", "accept"),
)


def write_readme(path: Path, facts: dict[str, Any]) -> None:
    f = facts
    ev = f["eval"]
    target: PhaseResult = f["target"]
    draft: PhaseResult = f["draft"]
    costs: DecodeCosts = f["costs"]
    med, quiet = costs.median_ms, costs.quiet_ms
    bullets = [
        f"""Data: {f["n_train_files"]} `.py` files of the Python {f["python"]} standard library
        (`sysconfig.get_paths()["stdlib"]`, sorted by path; directories named `test`, `tests`,
        `idle_test`, `site-packages` and files named `test_*.py` excluded), {f["train_mb"]:.1f} MB
        of text, {f["train_tokens"]:,} tokens. Every {HELD_OUT_EVERY}th file ({f["n_held_files"]}
        files, {f["held_tokens"]:,} tokens) is held out for evaluation. Each file is followed by
        the end-of-text token. The corpus differs between Python versions, and so would the
        models.""",
        f"""Tokenizer: byte-level BPE trained with `tokenizers` (vocabulary {f["vocab"]}, minimum
        pair frequency 2), one special token `{EOS}` used as EOS, BOS and padding; the same
        `tokenizer.json` in both directories.""",
        f"""Target: {f["target_shape"]}, tied embeddings, RoPE, no dropout,
        {f["target_params"]:,} parameters. Next-token cross-entropy on random {f["seq_len"]}-token
        windows, batch {f["batch"]}, AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak
        learning rate {f["target_lr"]} ({f["warmup"]} warm-up steps, constant, then a linear
        decay to a tenth over the last fifth of the steps), gradient clipping at 1;
        {target.steps} steps ({target.steps * f["tokens_per_step"]:,} tokens) in
        {target.seconds / 60:.1f} min ({target.tokens_per_s:.0f} tokens/s).""",
        f"""Draft: {f["draft_shape"]}, tied embeddings, {f["draft_params"]:,} parameters. Trained
        by distillation from the stored target (loaded back as shipped): loss = KL(target ||
        draft) of the next-token distributions at temperature 1{f["ce_note"]}, both computed
        under the same autocast as the training. Running the target costs far more than a draft
        step, so its outputs are reused: the last {f["draft_pool"]} batches of them are kept, a
        new batch joins every {f["draft_reuse"]} steps, and each step draws one of the kept
        batches at random.{f["samples_note"]} Same kind of windows and optimizer, peak learning
        rate {f["draft_lr"]}; {draft.steps} steps in {draft.seconds / 60:.1f} min.""",
        f"""Seed {f["seed"]}; {f["threads"]} CPU threads (`torch.set_num_threads`);
        {f["precision"]}.{f["omp_note"]} The step counts were {f["sizing"]}.
        {f["early_note"]}""",
    ]
    if f["reused"]:
        made = f"""The target was trained by `{f["target_command"]}` ({target.seconds / 60:.1f} min
of target training). The draft was then trained against that stored target by the command
below, run from the repository root, which kept the target (`--reuse-target`):

```
{f["command"]}
```

Its measured wall time: **{f["wall_min"]:.1f} min** on {f["machine"]}."""
    else:
        made = f"""Command, run from the repository root:

```
{f["command"]}
```

Measured wall time: **{f["wall_min"]:.1f} min** on {f["machine"]}."""
    samples = f["eval_samples"]
    if samples is None:
        columns, rule = "| | held-out files |", "|---|---|"
        rows = [(name, f"{ev[key]:.3f}") for name, key in EVAL_ROWS]
    else:
        columns = "| | held-out files | target's samples from held-out prompts |"
        rule = "|---|---|---|"
        rows = [(name, f"{ev[key]:.3f} | {samples[key]:.3f}") for name, key in EVAL_ROWS]
    table = "\n".join([columns, rule] + [f"| {name} | {values} |" for name, values in rows])
    text = f"""# Default models

`default/target` and `default/draft` are a small target/draft pair of Llama-style causal language
models (`transformers.LlamaForCausalLM`) sharing one byte-level BPE tokenizer. They ship inside the
package so that `specsample generate` works offline on a fresh machine. They write Python-like
text: they were trained only on the `.py` files of CPython's own standard library. Their purpose is
to exercise and time speculative decoding, not to be useful language models.

Load them with

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

from specsample.models import default_model_dir

tokenizer = AutoTokenizer.from_pretrained(default_model_dir("target"))
target = AutoModelForCausalLM.from_pretrained(default_model_dir("target"))
draft = AutoModelForCausalLM.from_pretrained(default_model_dir("draft"))
```

or try them with `specsample generate "def parse(text):" --compare`.

Weights are stored in bfloat16 to keep the package small; the configs say float32, so they load
(and run) in float32.

## How they were made

{made}

The same models again in one run (same step counts, no timing involved):

```
{f["repeat_command"]}
```

{chr(10).join(_bullet(b) for b in bullets)}

## Results

Final training losses (moving average over the last steps): target cross-entropy
**{target.final_loss:.3f}** nats/token; draft distillation loss (KL) **{draft.final_loss:.3f}**
nats/token.

Held out ({int(ev["positions"]):,} positions in {f["seq_len"]}-token windows of the held-out files,
and of the target's own continuations of prompts taken from them, when the draft saw such text):

{table}

Sizes and per-token costs. The cost is one decoding step (1 token against a 128-token KV cache,
batch 1, float32, `transformers`, {f["threads"]} threads), timed for {costs.steps} steps per model
in alternating rounds of 40 after a warm-up round: the median over all steps, and the median of
the least loaded round:

| | parameters | directory size | per-token cost, median | least loaded round |
|---|---|---|---|---|
| target | {f["target_params"]:,} | {f["target_mb"]:.2f} MB | {med["target"]:.2f} ms | \
{quiet["target"]:.2f} ms |
| draft | {f["draft_params"]:,} | {f["draft_mb"]:.2f} MB | {med["draft"]:.2f} ms | \
{quiet["draft"]:.2f} ms |
| both / ratio | | {f["total_mb"]:.2f} MB | {costs.ratio():.1f}x | {costs.ratio(quiet=True):.1f}x |

The costs depend on the machine and on its load: other work on the same cores slows the target's
multi-threaded matrix products far more than the draft's small ones, which inflates the median
ratio. The least loaded round is the better estimate of the unloaded costs.
"""
    path.write_text(text)


# Main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output directory (one inside the specsample package needs --overwrite-shipped)",
    )
    parser.add_argument(
        "--overwrite-shipped",
        action="store_true",
        help=f"allow --out {SHIPPED_OUT.relative_to(ROOT)} (the shipped pair) or another "
        "directory inside the package, and rewrite the shipped README",
    )
    parser.add_argument("--readme", type=Path, default=None, help="README to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="target steps (default: sized)")
    parser.add_argument("--draft-steps", type=int, default=None, help="default: sized")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-time budget and cap")
    parser.add_argument("--target-share", type=float, default=0.62, help="of the training time")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--context", type=int, default=1024, help="max_position_embeddings")
    parser.add_argument("--target-lr", type=float, default=2e-3)
    parser.add_argument("--draft-lr", type=float, default=3e-3)
    parser.add_argument("--draft-ce-weight", type=float, default=0.0)
    parser.add_argument(
        "--draft-pool", type=int, default=8, help="batches of target outputs kept for the draft"
    )
    parser.add_argument(
        "--draft-reuse", type=int, default=3, help="draft steps per new batch of target outputs"
    )
    parser.add_argument(
        "--reuse-target",
        action="store_true",
        help=f"keep the target in --out (its training as recorded in {RECORD}); train the draft",
    )
    parser.add_argument(
        "--target-samples", type=int, default=1536, help="continuations written by the target"
    )
    parser.add_argument("--sample-new-tokens", type=int, default=192)
    parser.add_argument(
        "--greedy-share", type=float, default=0.6, help="of the target samples, decoded greedily"
    )
    parser.add_argument(
        "--sample-share", type=float, default=0.7, help="of the draft's windows, from samples"
    )
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train with bfloat16 autocast",
    )
    parser.add_argument(
        "--passive-omp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"train with {OMP_POLICY}=PASSIVE (unless it is set)",
    )
    parser.add_argument("--eval-windows", type=int, default=64)
    parser.add_argument("--measure-costs", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompt-ids", default="", help=argparse.SUPPRESS)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args(argv)
    if args.measure_costs is None and not args.overwrite_shipped:
        for name, path in (("--out", args.out), ("--readme", args.readme)):
            if path is not None and in_package(path):
                parser.error(
                    f"{name} {path} lies inside the specsample package and would overwrite "
                    f"the shipped models: write elsewhere (e.g. --out {REPEAT_OUT}), or pass "
                    "--overwrite-shipped to replace them"
                )
    if args.readme is None and args.out.resolve() == SHIPPED_OUT.resolve():
        args.readme = SHIPPED_README
    return args


def in_package(path: Path) -> bool:
    """``path`` lies inside this checkout's ``specsample`` package or the imported one."""
    import specsample

    resolved = path.resolve()
    packages = {(ROOT / "specsample").resolve(), Path(specsample.__file__).resolve().parent}
    return any(resolved.is_relative_to(package) for package in packages)


def measure_costs(directory: Path, prompt_ids: str, threads: int) -> None:
    """Print, as JSON, the per-token costs of ``directory``'s target and draft."""
    torch.set_num_threads(threads)
    lms = {name: load_model(directory / name) for name in ("target", "draft")}
    prompt = torch.tensor([[int(i) for i in prompt_ids.split(",")]])
    costs = decode_step_ms(lms, prompt, rounds=12, steps=40)
    print(json.dumps(asdict(costs)))


def costs_in_subprocess(directory: Path, prompt: torch.Tensor, threads: int) -> DecodeCosts:
    """Measure the per-token costs in a fresh process with the default OpenMP settings."""
    env = {k: v for k, v in os.environ.items() if k not in (OMP_POLICY, START_ENV)}
    ids = ",".join(str(int(i)) for i in prompt.flatten())
    command = [sys.executable, __file__, "--threads", str(threads)]
    command += ["--out", str(directory), "--measure-costs", str(directory), "--prompt-ids", ids]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return DecodeCosts(**json.loads(done.stdout.strip().splitlines()[-1]))


def train_target(
    args: argparse.Namespace,
    vocab: int,
    eos_id: int,
    train_stream: torch.Tensor,
    train_seconds: float,
) -> PhaseResult:
    """Train the target on next-token cross-entropy; the model is in ``result.model``."""
    torch.manual_seed(args.seed)
    target = make_model(TARGET_SHAPE, vocab, eos_id, args.context)
    log(f"target: {TARGET_SHAPE.describe()}, {n_params(target):,} parameters")

    def target_loss(ids: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = target(input_ids=ids, labels=ids).loss
        return loss

    target_budget = args.target_share * train_seconds
    result = run_phase(
        "target",
        target,
        target_loss,
        batches(train_stream, args.batch_size, args.seq_len, args.seed),
        steps=args.steps,
        budget_s=target_budget,
        hard_stop=now() + 1.05 * target_budget,
        peak_lr=args.target_lr,
        warmup=args.warmup,
        tokens_per_step=args.batch_size * args.seq_len,
        log_every=args.log_every,
        bf16=args.bf16,
    )
    result.model = target
    return result


def reused_target(out: Path, raw_tokenizer: Any) -> tuple[PhaseResult, str]:
    """The target phase recorded in ``out/training.json``, checked against the tokenizer."""
    from tokenizers import Tokenizer

    record_path = out / RECORD
    if not record_path.is_file():
        raise SystemExit(f"--reuse-target needs {record_path}, written by a full run")
    stored = Tokenizer.from_file(str(out / "target" / "tokenizer.json"))
    if stored.get_vocab() != raw_tokenizer.get_vocab():
        raise SystemExit("--reuse-target: the stored target's tokenizer differs from this one")
    record = json.loads(record_path.read_text())
    return PhaseResult(**record["target"]), record["target_command"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure_costs is not None:
        measure_costs(args.measure_costs, args.prompt_ids, args.threads)
        return
    if args.passive_omp and OMP_POLICY not in os.environ:
        # OpenMP reads its settings when torch is loaded: run again with them in place. Waiting
        # threads then sleep instead of spinning, which keeps training fast when other work
        # shares the cores (a spinning thread holds a core that the thread it waits for needs).
        env = os.environ | {OMP_POLICY: "PASSIVE", START_ENV: repr(time.time())}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    began = float(os.environ.get(START_ENV, repr(time.time())))
    start = now() - (time.time() - began)
    deadline = start + args.minutes * 60
    command = "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    root, files = stdlib_files()
    held = [p for i, p in enumerate(files) if i % HELD_OUT_EVERY == 0]
    train = [p for i, p in enumerate(files) if i % HELD_OUT_EVERY != 0]
    train_texts = [read_text(p) for p in train]
    held_texts = [read_text(p) for p in held]
    train_mb = sum(len(t.encode()) for t in train_texts) / 1e6
    log(f"{len(files)} files under {root}: {len(train)} for training ({train_mb:.1f} MB)")

    raw_tokenizer = train_tokenizer(train_texts, args.vocab_size)
    tokenizer = wrap_tokenizer(raw_tokenizer, args.context)
    eos_id = raw_tokenizer.token_to_id(EOS)
    vocab = raw_tokenizer.get_vocab_size()
    train_stream = encode_stream(raw_tokenizer, train_texts, eos_id)
    held_stream = encode_stream(raw_tokenizer, held_texts, eos_id)
    log(
        f"tokenizer: {vocab} tokens; {train_stream.numel():,} training tokens, "
        f"{held_stream.numel():,} held-out tokens ({now() - start:.0f} s)"
    )

    tokens_per_step = args.batch_size * args.seq_len
    train_seconds = deadline - RESERVE_S - now()

    target_dir, draft_dir = args.out / "target", args.out / "draft"
    if args.reuse_target:
        target_result, target_command = reused_target(args.out, raw_tokenizer)
        log(f"target: reusing {target_dir} ({target_result.steps} steps, by {target_command})")
    else:
        target_result = train_target(args, vocab, eos_id, train_stream, train_seconds)
        save_model(target_result.model, tokenizer, target_dir)
        target_result.model = None
        target_command = "HF_HUB_OFFLINE=1 " + command
    target = load_model(target_dir)
    for p in target.parameters():
        p.requires_grad_(False)

    draft_data: Iterator[torch.Tensor]
    window = args.seq_len + 1
    samples = held_samples = None
    if args.target_samples:
        log(f"sampling {args.target_samples} continuations from the target")
        samples = target_samples(
            target,
            train_stream,
            count=args.target_samples,
            prompt_len=SAMPLE_PROMPT_LEN,
            new_tokens=args.sample_new_tokens,
            greedy_share=args.greedy_share,
            eos_id=eos_id,
            seed=args.seed + 3,
        )
        held_samples = target_samples(
            target,
            held_stream,
            count=HELD_SAMPLES,
            prompt_len=SAMPLE_PROMPT_LEN,
            new_tokens=args.sample_new_tokens,
            greedy_share=args.greedy_share,
            eos_id=eos_id,
            seed=args.seed + 4,
        )
        log(f"target samples: {samples.numel():,} tokens, {held_samples.numel():,} held out")
        draft_data = mixed_batches(
            (train_stream, samples), args.sample_share, args.batch_size, window, args.seed + 1
        )
    else:
        draft_data = batches(train_stream, args.batch_size, window, args.seed + 1)

    torch.manual_seed(args.seed + 1)
    draft = make_model(DRAFT_SHAPE, vocab, eos_id, args.context)
    log(f"draft: {DRAFT_SHAPE.describe()}, {n_params(draft):,} parameters")
    ce_weight = args.draft_ce_weight

    def draft_loss(ids: torch.Tensor) -> torch.Tensor:
        # ``ids`` holds a window and, stacked under it, the target's log-probabilities.
        window, t_logp = ids[:, :, 0].long(), ids[:, :-1, 1:]
        d_logp = F.log_softmax(draft(input_ids=window[:, :-1]).logits.float(), -1)
        loss = (t_logp.exp() * (t_logp - d_logp)).sum(-1).mean()
        if ce_weight > 0:
            ce = F.nll_loss(d_logp.flatten(0, 1), window[:, 1:].reshape(-1))
            loss = (1 - ce_weight) * loss + ce_weight * ce
        return loss

    draft_budget = deadline - RESERVE_S - now()
    draft_result = run_phase(
        "draft",
        draft,
        draft_loss,
        teacher_batches(
            target,
            draft_data,
            pool=args.draft_pool,
            reuse=args.draft_reuse,
            seed=args.seed + 2,
        ),
        steps=args.draft_steps,
        budget_s=draft_budget,
        hard_stop=deadline - RESERVE_S + 20,
        peak_lr=args.draft_lr,
        warmup=args.warmup,
        tokens_per_step=tokens_per_step,
        log_every=args.log_every,
        bf16=args.bf16,
    )
    save_model(draft, tokenizer, draft_dir)
    del draft
    draft = load_model(draft_dir)

    log("evaluating on held-out files")
    windows = eval_windows(held_stream, args.seq_len, args.eval_windows)
    ev = evaluate(target, draft, windows, args.batch_size)
    log(
        "held out: target CE {target_ce:.3f}, draft CE {draft_ce:.3f}, KL {kl:.3f}, "
        "greedy agreement {agree:.3f}, mean acceptance {accept:.3f}".format(**ev)
    )
    ev_samples = None
    if held_samples is not None:
        sample_windows = eval_windows(held_samples, args.seq_len, args.eval_windows)
        ev_samples = evaluate(target, draft, sample_windows, args.batch_size)
        log(
            "held-out target samples: KL {kl:.3f}, greedy agreement {agree:.3f}, "
            "mean acceptance {accept:.3f}".format(**ev_samples)
        )

    log("timing one decoding step of each model (default OpenMP settings)")
    params = {"target": n_params(target), "draft": n_params(draft)}
    costs = costs_in_subprocess(args.out, held_stream[:128], args.threads)
    med, quiet = costs.median_ms, costs.quiet_ms
    log(
        f"per-token cost: target {med['target']:.2f} ms, draft {med['draft']:.2f} ms "
        f"(least loaded round: {quiet['target']:.2f} ms, {quiet['draft']:.2f} ms)"
    )

    wall = now() - start
    # A full run with these step counts: the target phase, then this run's other phases.
    repeat_minutes = args.minutes
    if args.reuse_target:
        repeat_minutes = (target_result.seconds + wall) / 60 + 5
    sizes = {name: dir_size(d) / 1e6 for name, d in (("target", target_dir), ("draft", draft_dir))}
    repeat = [
        "python",
        "scripts/train_default_models.py",
        "--out",
        REPEAT_OUT,
        "--seed",
        str(args.seed),
        "--steps",
        str(target_result.steps),
        "--draft-steps",
        str(draft_result.steps),
        "--target-samples",
        str(args.target_samples),
        "--sample-new-tokens",
        str(args.sample_new_tokens),
        "--greedy-share",
        f"{args.greedy_share:g}",
        "--sample-share",
        f"{args.sample_share:g}",
        "--minutes",
        f"{math.ceil(repeat_minutes):d}",
    ]
    if not args.bf16:
        repeat.append("--no-bf16")
    (args.out / RECORD).write_text(
        json.dumps(
            {
                "target_command": target_command,
                "target": target_result.record(),
                "draft_command": "HF_HUB_OFFLINE=1 " + command,
                "draft": draft_result.record(),
                "held_out": ev,
                "held_out_target_samples": ev_samples,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    phases = (("target", target_result), ("draft", draft_result))
    early = [name for name, result in phases if result.stopped_early]
    facts: dict[str, Any] = {
        "command": "HF_HUB_OFFLINE=1 " + command,
        "repeat_command": "HF_HUB_OFFLINE=1 " + shlex.join(repeat),
        "wall_min": wall / 60,
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}",
        "python": platform.python_version(),
        "n_train_files": len(train),
        "n_held_files": len(held),
        "train_mb": train_mb,
        "train_tokens": train_stream.numel(),
        "held_tokens": held_stream.numel(),
        "vocab": vocab,
        "seq_len": args.seq_len,
        "batch": args.batch_size,
        "warmup": args.warmup,
        "target_lr": args.target_lr,
        "draft_lr": args.draft_lr,
        "draft_pool": args.draft_pool,
        "draft_reuse": args.draft_reuse,
        "ce_note": (
            f", mixed with cross-entropy at weight {ce_weight}" if ce_weight > 0 else " (no CE)"
        ),
        "seed": args.seed,
        "precision": (
            "float32 weights and optimizer, bfloat16 autocast for the matrix products"
            if args.bf16
            else "float32 throughout"
        ),
        "threads": args.threads,
        "omp_note": (
            f" Training ran with `{OMP_POLICY}=PASSIVE` (waiting threads sleep instead of"
            " spinning, which keeps training fast when other work shares the cores); the"
            " per-token costs were timed in a separate process with the default settings."
            if os.environ.get(OMP_POLICY) == "PASSIVE"
            else ""
        ),
        "early_note": (
            f"The time cap stopped the {' and '.join(early)} phase early." if early else ""
        ),
        "target_shape": TARGET_SHAPE.describe(),
        "draft_shape": DRAFT_SHAPE.describe(),
        "target_params": params["target"],
        "draft_params": params["draft"],
        "target": target_result,
        "draft": draft_result,
        "eval": ev,
        "eval_samples": ev_samples,
        "target_command": target_command,
        "reused": args.reuse_target,
        "samples_note": (
            f""" The draft's windows come from two sources: with probability
            {args.sample_share:g}, text the target wrote itself ({args.target_samples}
            continuations of random {SAMPLE_PROMPT_LEN}-token windows of the training text, up to
            {args.sample_new_tokens} new tokens each, {args.greedy_share:.0%} decoded greedily and
            the rest sampled at temperature 1: {samples.numel():,} tokens), otherwise the training
            text. The draft thus also learns the target on the text it produces when decoding,
            repetition loops included."""
            if samples is not None
            else ""
        ),
        "target_mb": sizes["target"],
        "draft_mb": sizes["draft"],
        "total_mb": sizes["target"] + sizes["draft"],
        "costs": costs,
        "tokens_per_step": tokens_per_step,
        "sizing": (
            "given on the command line"
            if args.steps is not None and args.draft_steps is not None
            else "decided by the script from the time it had used (see `run_phase`)"
        ),
    }
    if args.readme is not None:
        write_readme(args.readme, facts)
        log(f"wrote {args.readme}")
    print()
    print(f"command: {facts['command']}")
    print(f"repeat with: {facts['repeat_command']}")
    print(f"wall time: {wall / 60:.1f} min")
    print(
        f"final training losses: target CE {target_result.final_loss:.3f} "
        f"({target_result.steps} steps), draft KL {draft_result.final_loss:.3f} "
        f"({draft_result.steps} steps)"
    )
    print(
        f"held out: target CE {ev['target_ce']:.3f}, draft CE {ev['draft_ce']:.3f}, "
        f"KL {ev['kl']:.3f}, greedy agreement {ev['agree']:.3f}, "
        f"mean acceptance {ev['accept']:.3f}"
    )
    print(
        f"per-token cost (median): target {med['target']:.2f} ms, draft {med['draft']:.2f} ms, "
        f"ratio {costs.ratio():.1f}x"
    )
    print(
        f"per-token cost (least loaded round): target {quiet['target']:.2f} ms, "
        f"draft {quiet['draft']:.2f} ms, ratio {costs.ratio(quiet=True):.1f}x"
    )
    print(
        f"sizes: target {sizes['target']:.2f} MB, draft {sizes['draft']:.2f} MB, "
        f"total {facts['total_mb']:.2f} MB"
    )


if __name__ == "__main__":
    main()
