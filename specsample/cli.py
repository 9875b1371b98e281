"""The ``specsample`` command: ``demo``, ``bench``, ``compare`` and ``generate``.

``demo`` checks :class:`specsample.sampler.RejectionSampler` for exactness on several toy
draft/target families (see :mod:`specsample.testing`), printing one table of statistical
tests per family, then prints a short cold-cache speed table (see :mod:`specsample.bench`).
``bench`` runs the full benchmark. ``compare`` verifies the same drafts with every rule and
reports tokens per verification step (see :mod:`specsample.compare`). ``generate`` runs
batched speculative decoding with a target/draft pair of causal LMs, or prompt lookup (see
:mod:`specsample.generate`), streams the text and prints the run's statistics. Errors are
reported on one line and give a non-zero exit status.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specsample import bench, compare, models
from specsample.methods import METHODS, chain_methods
from specsample.sampler import RejectionSampler
from specsample.testing import exactness_report, make_family

DEMO_FAMILIES = ("random", "sparse", "equal", "markov", "peaked")
"""Toy families the demo checks (see :func:`specsample.testing.make_family`)."""

_DEMO_SHAPES = ((8, 4, 32000), (64, 4, 128256))


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {value}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specsample",
        description="Exact, fast verification for speculative decoding.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    _add_demo_parser(commands)
    _add_bench_parser(commands)
    _add_compare_parser(commands)
    _add_generate_parser(commands)
    return parser


def _add_demo_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="check exactness on toy families, then print a short speed table",
        description="Check RejectionSampler for exactness on toy draft/target families "
        f"({', '.join(DEMO_FAMILIES)}), then time it on "
        + " and ".join("x".join(map(str, s)) for s in _DEMO_SHAPES)
        + " with cold caches.",
    )
    positive = bench.parse_positive_int
    demo.add_argument(
        "--rows", type=positive, default=100_000, help="sequences per family (default 100000)"
    )
    demo.add_argument("--k", type=positive, default=4, help="drafts per sequence (default 4)")
    demo.add_argument(
        "--vocab", type=positive, default=8, help="vocabulary of the toy families (default 8)"
    )
    demo.add_argument(
        "--alpha",
        type=_probability,
        default=1e-4,
        help="family-wise false-failure rate of each family's tests (default 1e-4)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of families and draws (default 0)")
    demo.add_argument("--no-speed", action="store_true", help="skip the speed table")


def _add_bench_parser(commands: Any) -> None:
    bench_parser = commands.add_parser(
        "bench",
        help="cold-cache latency and peak memory against the naive reference",
        description="Time RejectionSampler, the naive reference, transformers' "
        "_speculative_sampling (when installed) and the memory-read floor, with cold caches.",
    )
    bench.add_arguments(bench_parser)


def _add_compare_parser(commands: Any) -> None:
    rules = ", ".join(compare.RULES[:-1]) + " and " + compare.RULES[-1]
    compare_parser = commands.add_parser(
        "compare",
        help=f"tokens per verification step of {rules} verification",
        description="Verify the same drafts with every rule and report the mean tokens per "
        "verification step (95% CI) against k, with the exact value where known.",
    )
    positive = bench.parse_positive_int
    compare_parser.add_argument(
        "--families",
        nargs="+",
        default=["random", "markov", "peaked", "zipf"],
        help="toy families (see specsample.testing.make_family)",
    )
    compare_parser.add_argument(
        "--k", nargs="+", type=positive, default=[1, 2, 3, 4, 5], help="draft lengths"
    )
    compare_parser.add_argument("--rows", type=positive, default=20_000, help="steps per point")
    compare_parser.add_argument("--vocab", type=positive, default=8, help="vocabulary (default 8)")
    compare_parser.add_argument(
        "--branching", type=positive, default=2, help="children per tree node"
    )
    compare_parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    compare_parser.add_argument("--plot", metavar="FILE.png", help="save tokens per step against k")


def _add_generate_parser(commands: Any) -> None:
    """The ``generate`` command's arguments."""
    generate = commands.add_parser(
        "generate",
        help="generate text with batched speculative decoding",
        description="Generate from a target causal LM with speculative decoding: a draft model "
        "(--draft) or prompt lookup (--ngram) proposes k tokens, one target forward scores them "
        "and exact verification keeps the target's distribution. Without --target, the default "
        "pair installed under specsample/models/default is used.",
    )
    _add_drafting_arguments(generate)
    _add_sampling_arguments(generate)
    positive = bench.parse_positive_int
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
        type=positive,
        default=None,
        help="CPU threads for torch (default: torch's choice; 1 is often fastest on a busy "
        "machine)",
    )


def _add_drafting_arguments(generate: argparse.ArgumentParser) -> None:
    """The prompt, the models, the drafts per step and the verification rule."""
    positive = bench.parse_positive_int
    generate.add_argument("prompt", help="the prompt text")
    generate.add_argument("--target", metavar="DIR", help="target model directory")
    generate.add_argument("--draft", metavar="DIR", help="draft model directory")
    generate.add_argument(
        "--ngram", action="store_true", help="draft by prompt lookup instead of a draft model"
    )
    generate.add_argument("-k", type=positive, default=4, help="drafts per step (default 4)")
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
    positive = bench.parse_positive_int
    generate.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)"
    )
    generate.add_argument("--top-k", type=int, default=0, help="top-k filter (default 0: off)")
    generate.add_argument("--top-p", type=float, default=1.0, help="top-p filter (default 1: off)")
    generate.add_argument(
        "--batch-size", type=positive, default=1, help="copies of the prompt decoded together"
    )
    generate.add_argument(
        "--max-new-tokens", type=positive, default=128, help="tokens per sequence (default 128)"
    )
    generate.add_argument(
        "--seed", type=int, default=None, help="seed of sequence i is SEED + i (default: unseeded)"
    )


def _compare(args: argparse.Namespace) -> int:
    results = compare.compare_rules(
        args.families,
        args.k,
        rows=args.rows,
        vocab=args.vocab,
        branching=args.branching,
        seed=args.seed,
    )
    print(compare.format_comparison(results))
    if args.plot:
        print(f"plot written to {compare.plot_comparison(results, args.plot)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    print(
        f"Exactness of RejectionSampler: {args.rows} sequences per family, k={args.k}, "
        f"vocab={args.vocab}; each family passes when all its tests pass at family-wise "
        f"false-failure rate {args.alpha:g}.\n"
    )
    failed = []
    for index, name in enumerate(DEMO_FAMILIES):
        family = make_family(name, k=args.k, vocab=args.vocab, seed=args.seed + index)
        report = exactness_report(RejectionSampler(), family, rows=args.rows, seed=args.seed)
        print(report.format(args.alpha), end="\n\n", flush=True)
        if not report.passed(args.alpha):
            failed.append(name)
    print(
        f"exactness: {len(DEMO_FAMILIES) - len(failed)}/{len(DEMO_FAMILIES)} families passed"
        + (f" (failed: {', '.join(failed)})" if failed else ""),
        end="\n\n",
        flush=True,
    )
    if not args.no_speed:
        rows = bench.run_benchmark(_DEMO_SHAPES, repeats=3, slow_repeats=1)
        print(bench.format_table(rows))
    return 1 if failed else 0


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
    from specsample.generate import hf

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
    from specsample.generate import NGramDrafter, hf

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


def _warm_up(
    args: argparse.Namespace, target: Any, drafter: Any, prompt_ids: list[int], common: Any
) -> None:
    """Run both loops on two tokens, so that the timed runs compare warm code paths."""
    from specsample.generate import speculative_generate, target_generate

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


def _generate(args: argparse.Namespace) -> int:
    from specsample.generate import speculative_generate, target_generate

    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    target_dir, draft_dir = _model_dirs(args)
    _prepare_runtime(args.threads)
    tokenizer, target, drafter = _load_models(target_dir, draft_dir)
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty once tokenized")
    common = _sampling_options(args, tokenizer, target)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``specsample`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments after the program name (``sys.argv[1:]`` by default).

    Returns
    -------
    int
        Exit status: 0 on success (and for ``--help``), 1 when the demo finds a family that
        fails its exactness tests or the command fails, 2 for a usage error, 130 when
        interrupted.

    Examples
    --------
    >>> main(["bench", "--shapes", "2x0x8"])
    2
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "generate":
            return _generate(args)
        return bench.run_from_args(args)
    except KeyboardInterrupt:
        print("specsample: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, RuntimeError, OSError, ImportError) as exc:
        print(f"specsample {args.command}: error: {exc}", file=sys.stderr)
        return 1
