"""The ``specsample generate`` command: its options, and the run they describe.

The run loads a target and a draft model (or prompt lookup) from local directories, streams
the text of the first sequence (batch 1) or reports progress on stderr, prints the run's
statistics and, with ``--compare``, the wall-clock speedup over target-only decoding.

Every option that sizes the work is bounded (``--help`` states each bound): ``-k`` by
:data:`specsample.generate.MAX_K`, ``--max-new-tokens`` by
:data:`specsample.generate.MAX_NEW_TOKENS` (and the target's context), ``--batch-size`` by
:data:`MAX_BATCH_SIZE`, ``--threads`` by :data:`specsample.MAX_THREADS`; the copies of
the prompt are decoded at most ``STEP_VALUES // ((k + 1) * vocab)`` at a time, so one step
never holds more than :data:`STEP_VALUES` logits.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from specsample import models
from specsample.bench.command import MAX_THREADS, int_in_range
from specsample.generate import hf
from specsample.generate.inputs import MAX_NEW_TOKENS
from specsample.generate.loop import MAX_K, speculative_generate, target_generate
from specsample.generate.ngram import NGramDrafter
from specsample.methods import METHODS, chain_methods

MAX_BATCH_SIZE = 1024
"""Most copies of the prompt ``--batch-size`` may ask for."""

STEP_VALUES = 1 << 24
"""Most logits one step holds: the copies are decoded
``max(1, STEP_VALUES // ((k + 1) * vocab))`` at a time (64 MiB of float32 logits per step)."""


def add_arguments(generate: argparse.ArgumentParser) -> None:
    """Add the ``generate`` command's options to ``generate``; read back by :func:`run_from_args`.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> args = parser.parse_args(["def f():", "--ngram", "-k", "8"])
    >>> args.k, args.batch_size, args.max_new_tokens
    (8, 1, 128)
    """
    _add_drafting_arguments(generate)
    _add_sampling_arguments(generate)
    generate.add_argument(
        "--compare",
        action="store_true",
        help="also run target-only decoding and report the wall-clock speedup",
    )
    generate.add_argument(
        "--plot", metavar="FILE.png", help="save a bar chart of acceptance by position"
    )
    generate.add_argument(
        "--threads",
        type=int_in_range(1, MAX_THREADS),
        default=None,
        help="CPU threads for torch (default: torch's choice; 1 is often fastest on a busy "
        f"machine; at most {MAX_THREADS})",
    )


def _add_drafting_arguments(generate: argparse.ArgumentParser) -> None:
    """The prompt, the models, the drafts per step and the verification rule."""
    generate.add_argument(
        "prompt", help="the prompt text (its tokens must leave room in the target's context)"
    )
    generate.add_argument("--target", metavar="DIR", help="target model directory")
    generate.add_argument("--draft", metavar="DIR", help="draft model directory")
    generate.add_argument(
        "--ngram", action="store_true", help="draft by prompt lookup instead of a draft model"
    )
    generate.add_argument(
        "-k",
        type=int_in_range(1, MAX_K),
        default=4,
        help=f"drafts per step (default 4, at most {MAX_K} and below the target's context)",
    )
    generate.add_argument(
        "--adaptive",
        action="store_true",
        help="choose each step's draft length in 0..k from the acceptance and step times seen "
        "so far (exact either way; off by default)",
    )
    exact = chain_methods()
    lossy = [name for name in chain_methods(lossy=True) if name not in exact]
    generate.add_argument(
        "--method",
        choices=chain_methods(lossy=True),
        default="chain",
        help=f"verification rule: {' or '.join(exact)} (exact), {', '.join(lossy)} (LOSSY: the "
        "output does not follow the target's distribution)",
    )


def _add_sampling_arguments(generate: argparse.ArgumentParser) -> None:
    """Sampling parameters, batch size, length and seed."""
    generate.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)"
    )
    generate.add_argument("--top-k", type=int, default=0, help="top-k filter (default 0: off)")
    generate.add_argument("--top-p", type=float, default=1.0, help="top-p filter (default 1: off)")
    generate.add_argument(
        "--batch-size",
        type=int_in_range(1, MAX_BATCH_SIZE),
        default=1,
        help=f"copies of the prompt decoded together (default 1, at most {MAX_BATCH_SIZE}; "
        f"at most {STEP_VALUES} // ((k + 1) * vocab) of them at a time, so that a step holds "
        f"at most {STEP_VALUES} logits)",
    )
    generate.add_argument(
        "--max-new-tokens",
        type=int_in_range(1, MAX_NEW_TOKENS),
        default=128,
        help=f"tokens per sequence (default 128, at most {MAX_NEW_TOKENS}; fewer where the "
        "target's context ends)",
    )
    generate.add_argument(
        "--seed", type=int, default=None, help="seed of sequence i is SEED + i (default: unseeded)"
    )


class _Stream:
    """Print the prompt, then the text of sequence 0 as its tokens arrive.

    The whole sequence is decoded each time and only the new suffix printed, so tokens that
    merge with their neighbours (spaces, multi-byte characters) print correctly.
    """

    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        self.printed = tokenizer.decode(self.ids, skip_special_tokens=True)
        sys.stdout.write(self.printed)
        sys.stdout.flush()

    def __call__(self, index: int, token_ids: list[int]) -> None:
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.printed):
            return
        sys.stdout.write(text[len(self.printed) :])
        sys.stdout.flush()
        self.printed = text


class _Progress:
    """Report progress on stderr every couple of seconds."""

    def __init__(self, label: str, every: float = 2.0) -> None:
        self.label = label
        self.every = every
        self.start = time.perf_counter()
        self.last = self.start

    def __call__(self, finished: int, total: int, tokens: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.every:
            return
        self.last = now
        rate = tokens / (now - self.start)
        print(
            f"[{self.label}] {finished}/{total} sequences done, {tokens} tokens, "
            f"{rate:.1f} tokens/s",
            file=sys.stderr,
            flush=True,
        )


def _model_dirs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The target and draft directories (``None``: prompt lookup) the arguments ask for."""
    if args.draft is not None and args.ngram:
        raise ValueError("pass --draft DIR or --ngram, not both")
    if args.target is None:
        pair = hf.default_pair()
        if pair is None:
            raise ValueError(
                "no default model pair is installed (expected "
                f"{models.DEFAULT_DIR}/target and .../draft): pass --target DIR with "
                "--draft DIR or --ngram"
            )
        if args.draft is not None:
            return pair[0], Path(args.draft)
        return pair[0], None if args.ngram else pair[1]
    if args.draft is None and not args.ngram:
        raise ValueError("--target needs --draft DIR or --ngram")
    return Path(args.target), None if args.ngram else Path(args.draft)


def _plot_acceptance(stats: Any, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "--plot needs matplotlib; install it with: pip install 'specsample[plot]'"
        ) from None
    rates = stats.acceptance_by_position
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.bar(range(1, len(rates) + 1), rates, color="tab:blue")
    axes.set_xlabel("draft position")
    axes.set_ylabel("fraction accepted")
    axes.set_ylim(0, 1)
    axes.set_xticks(range(1, len(rates) + 1))
    axes.set_title(f"acceptance by position: {stats.drafter}, k={stats.k}, {stats.method}")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _prepare_runtime(threads: int | None) -> None:
    """Check that transformers is installed, silence its progress bars, set torch's threads."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ImportError(
            "generate needs transformers; install it with: pip install 'specsample[hf]'"
        ) from None
    hf_logging.disable_progress_bar()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _load_models(target_dir: Path, draft_dir: Path | None) -> tuple[Any, Any, Any]:
    """The tokenizer, the target model and the drafter (a draft model, or prompt lookup)."""
    if not target_dir.is_dir():
        raise ValueError(f"target model directory does not exist: {target_dir}")
    if draft_dir is not None and not draft_dir.is_dir():
        raise ValueError(f"draft model directory does not exist: {draft_dir}")
    tokenizer = hf.load_tokenizer(target_dir)
    if draft_dir is not None:
        hf.check_same_tokenizer(tokenizer, hf.load_tokenizer(draft_dir))
    target = hf.load_model(target_dir, role="target")
    hf.check_masked_cache(target, role="target")
    if draft_dir is None:
        return tokenizer, target, NGramDrafter()
    draft = hf.load_model(draft_dir, role="draft")
    hf.check_masked_cache(draft, role="draft")
    return tokenizer, target, draft


def _sampling_options(args: argparse.Namespace, tokenizer: Any, target: Any) -> dict[str, Any]:
    """Keyword arguments both decoding loops share: sampling, length, EOS and seeds."""
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    return {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": eos,
        "seeds": None if args.seed is None else [args.seed + i for i in range(args.batch_size)],
    }


def _step_batch(k: int, target: Any) -> int:
    """Copies decoded at once: as many as keep one step's logits under :data:`STEP_VALUES`."""
    return max(1, STEP_VALUES // ((k + 1) * hf.vocab_size(target)))


def _warm_up(
    args: argparse.Namespace, target: Any, drafter: Any, prompt_ids: list[int], common: Any
) -> None:
    """Run both loops on two tokens, so that the timed runs compare warm code paths."""
    warm = {**common, "max_new_tokens": 2, "seeds": None}
    speculative_generate(target, [prompt_ids], drafter, k=args.k, method=args.method, **warm)
    target_generate(target, [prompt_ids], **warm)


def _print_sequences(
    output: Any, streamed: bool, tokenizer: Any, prompt_ids: list[int], method: str
) -> None:
    """End the streamed sequence, or print every sequence; then the run's statistics."""
    if streamed:
        print("\n")
    else:
        for i, ids in enumerate(output.sequences):
            print(f"[{i}] {tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)}")
        print()
    print(output.stats.format_table())
    if not METHODS[method].exact:
        print(f"note: {method} acceptance is lossy; this output is not a sample of the target")


def _print_speedup(output: Any, baseline: Any) -> None:
    """The target-only statistics, then the wall-clock speedup of speculative decoding."""
    print()
    print(baseline.stats.format_table())
    speedup = output.stats.tokens_per_s / baseline.stats.tokens_per_s
    print(
        f"\nwall-clock speedup: {speedup:.2f}x ({baseline.stats.tokens_per_s:.1f} tokens/s "
        f"target-only -> {output.stats.tokens_per_s:.1f} tokens/s speculative; tokens per "
        "second, since sampled runs may stop at EOS after different lengths)"
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``specsample generate`` as :func:`add_arguments` configured it.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options.

    Returns
    -------
    int
        The exit status, 0.

    Raises
    ------
    ValueError
        An empty prompt, missing or mismatched models, a prompt that fills the context, or
        any argument :func:`specsample.generate.speculative_generate` refuses.
    ImportError
        transformers (or, for ``--plot``, matplotlib) is not installed.
    """
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    target_dir, draft_dir = _model_dirs(args)
    _prepare_runtime(args.threads)
    tokenizer, target, drafter = _load_models(target_dir, draft_dir)
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty once tokenized")
    common = _sampling_options(args, tokenizer, target)
    common["max_batch_size"] = _step_batch(args.k, target)
    prompts = [prompt_ids] * args.batch_size
    if args.compare:
        _warm_up(args, target, drafter, prompt_ids, common)
    stream = _Stream(tokenizer, prompt_ids) if args.batch_size == 1 else None
    output = speculative_generate(
        target,
        prompts,
        drafter,
        k=args.k,
        method=args.method,
        adaptive=args.adaptive,
        on_tokens=stream,
        on_progress=None if stream is not None else _Progress("speculative"),
        **common,
    )
    _print_sequences(output, stream is not None, tokenizer, prompt_ids, args.method)
    if args.compare:
        baseline = target_generate(target, prompts, on_progress=_Progress("target-only"), **common)
        _print_speedup(output, baseline)
    if args.plot:
        _plot_acceptance(output.stats, args.plot)
        print(f"acceptance by position saved to {args.plot}")
    return 0
