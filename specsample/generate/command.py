"""The ``specsample generate`` command: its options, and the run they describe.

The run loads a target and a draft model (or prompt lookup) from local model directories or
GGUF files (quantized GGUF tensors are dequantized by transformers at load time; see
:mod:`specsample.generate.loading`), says on stderr what it loaded (parameters, dtype,
memory), streams the text of the first sequence (batch 1) or reports progress on stderr,
prints the run's statistics and, with ``--compare``, the wall-clock speedup over target-only
decoding.

With ``--chat`` each prompt becomes the user message of a conversation (after the
``--system`` message, if given) laid out by the tokenizer's chat template, and only the reply
is printed. Generation stops at every end-of-sequence id of the tokenizer and of the
target's generation config (chat models often list several, such as an end-of-turn token).

With ``--input prompts.jsonl --output out.jsonl`` it decodes every prompt of a JSONL file
instead (per-prompt parameters, the command-line options as defaults; see
:mod:`specsample.generate.jsonl`), ``--batch-size`` of them at a time (default 8), appends
one result line per prompt as soon as it finishes, shows a progress bar on stderr, and
resumes an interrupted run: prompts already in the output are skipped.

The draft length is adaptive by default: each step drafts between 0 and ``k`` tokens, as the
acceptance and step times seen so far suggest (exact either way); ``--fixed-k`` always
drafts ``k``.

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specsample import models
from specsample.bench.command import MAX_THREADS, int_in_range
from specsample.generate import hf, jsonl, loading
from specsample.generate.inputs import MAX_NEW_TOKENS, eos_ids
from specsample.generate.loop import MAX_K, speculative_generate, target_generate
from specsample.generate.ngram import NGramDrafter
from specsample.generate.tree import DRAFTINGS, MAX_TREE_NODES, TreeShape
from specsample.methods import METHODS, chain_methods, tree_methods

MAX_BATCH_SIZE = 1024
"""Most copies of the prompt (or, with ``--input``, sequences at once) ``--batch-size`` may
ask for."""

FILE_BATCH_SIZE = 8
"""Sequences decoded at once with ``--input`` when ``--batch-size`` is not given."""

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
    >>> args.k, args.fixed_k, args.max_new_tokens, batch_size(args)
    (8, False, 128, 1)
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
        "--input",
        metavar="FILE.jsonl",
        help="generate for every prompt of a JSONL file instead of PROMPT: one object per "
        'line, {"prompt": str, "id": str or int (default: the line number), and optionally '
        '"max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed"} (missing fields '
        "take the command-line values; a line without a seed gets SEED + its index); needs "
        "--output",
    )
    generate.add_argument(
        "--output",
        metavar="FILE.jsonl",
        help="with --input: append one JSON line per finished prompt (id, line, prompt, "
        "completion, completion_tokens, finish_reason); prompts whose id it already holds "
        "are skipped, so an interrupted run resumes",
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
        "prompt",
        nargs="?",
        help="the prompt text (its tokens must leave room in the target's context); or pass "
        "--input",
    )
    generate.add_argument(
        "--target",
        metavar="PATH",
        help="target model: a directory (config.json, weights, tokenizer) or a .gguf file "
        "(quantized tensors are dequantized by transformers at load time; local files only)",
    )
    generate.add_argument(
        "--draft", metavar="PATH", help="draft model: a directory or a .gguf file, as --target"
    )
    generate.add_argument(
        "--ngram", action="store_true", help="draft by prompt lookup instead of a draft model"
    )
    generate.add_argument(
        "--chat",
        action="store_true",
        help="lay out the prompt (with --input: every prompt) as a user message with the "
        "tokenizer's chat template (add_generation_prompt) and print only the reply; needs a "
        "tokenizer with a chat template",
    )
    generate.add_argument(
        "--system", metavar="MESSAGE", help="with --chat: a system message before each prompt"
    )
    generate.add_argument(
        "-k",
        type=int_in_range(1, MAX_K),
        default=4,
        help=f"most drafts per step, or with --fixed-k drafts per step (default 4, at most "
        f"{MAX_K} and below the target's context)",
    )
    generate.add_argument(
        "--fixed-k",
        action="store_true",
        help="always draft k tokens (default: choose each step's draft length in 0..k, k "
        "being the maximum, from the acceptance and step times seen so far; exact either way)",
    )
    exact = chain_methods()
    lossy = [name for name in chain_methods(lossy=True) if name not in exact]
    generate.add_argument(
        "--method",
        choices=[*chain_methods(lossy=True), *TREE_RULES],
        default="chain",
        help=f"verification rule: {' or '.join(exact)} (exact), {', '.join(lossy)} (LOSSY: the "
        "output does not follow the target's distribution); with --tree, one of "
        f"{', '.join(TREE_RULES)} (default: the rule --tree-drafting calls for)",
    )
    generate.add_argument(
        "--tree",
        metavar="NODES",
        type=int_in_range(2, MAX_TREE_NODES),
        help="draft a token tree of at most NODES nodes per step with the draft model (two "
        "branches from the root, each a chain), scored in one target forward",
    )
    generate.add_argument(
        "--tree-shape",
        metavar="C1,C2,...",
        help="with --tree: children per node at each depth instead (e.g. 3,2,1)",
    )
    generate.add_argument(
        "--tree-drafting",
        choices=DRAFTINGS,
        default="iid",
        help="with --tree: how children are drawn (default iid; temperature 0 always takes the "
        "draft's most likely tokens)",
    )


def _add_sampling_arguments(generate: argparse.ArgumentParser) -> None:
    """Sampling parameters, batch size, length and seed."""
    generate.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)"
    )
    generate.add_argument("--top-k", type=int, default=0, help="top-k filter (default 0: off)")
    generate.add_argument("--top-p", type=float, default=1.0, help="top-p filter (default 1: off)")
    generate.add_argument("--min-p", type=float, default=0.0, help="min-p filter (default 0: off)")
    generate.add_argument(
        "--batch-size",
        type=int_in_range(1, MAX_BATCH_SIZE),
        default=None,
        help=f"copies of the prompt decoded together (default 1), or with --input the "
        f"sequences decoded at once (default {FILE_BATCH_SIZE}); at most {MAX_BATCH_SIZE}, and "
        f"at most {STEP_VALUES} // ((k + 1) * vocab) at a time, so that a step holds at most "
        f"{STEP_VALUES} logits",
    )
    generate.add_argument(
        "--max-new-tokens",
        type=int_in_range(1, MAX_NEW_TOKENS),
        default=128,
        help=f"tokens per sequence (default 128, at most {MAX_NEW_TOKENS}; fewer where the "
        "target's context ends)",
    )
    generate.add_argument(
        "--seed",
        type=int_in_range(0, (1 << 64) - 1),
        default=None,
        help="seed of sequence i (with --input: of the file's i-th prompt, from 0) is SEED + i "
        "(default: unseeded)",
    )


class _Stream:
    """Print the prompt (none when ``prompt_ids`` is empty), then sequence 0 as it arrives.

    The whole sequence is decoded each time and only the new suffix printed, so tokens that
    merge with their neighbours (spaces, multi-byte characters) print correctly.
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


def _model_paths(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The target and draft paths (``None``: prompt lookup) the arguments ask for."""
    if args.draft is not None and args.ngram:
        raise ValueError("pass --draft PATH or --ngram, not both")
    if args.target is None:
        pair = hf.default_pair()
        if pair is None:
            raise ValueError(
                "no default model pair is installed (expected "
                f"{models.DEFAULT_DIR}/target and .../draft): pass --target PATH with "
                "--draft PATH or --ngram"
            )
        if args.draft is not None:
            return pair[0], Path(args.draft)
        return pair[0], None if args.ngram else pair[1]
    if args.draft is None and not args.ngram:
        raise ValueError("--target needs --draft PATH or --ngram")
    return Path(args.target), None if args.ngram else Path(args.draft)


def _plot_acceptance(stats: Any, path: str) -> None:
    """Save a bar chart of the acceptance by draft position to ``path``, and say so."""
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
    print(f"acceptance by position saved to {path}")


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


def _load_model(path: Path, role: str) -> Any:
    """Load one model, check its cache handling and say on stderr what was loaded and which
    forward runs it."""
    model = hf.load_model(path, role=role)
    runs = hf.CachedLM(model, role=role).runs
    description = loading.describe_model(model, loading.model_source(path, role=role))
    print(f"{role}: {path}: {description}; {runs}", file=sys.stderr, flush=True)
    return model


def _load_models(
    target_path: Path, draft_path: Path | None, args: argparse.Namespace
) -> tuple[Any, Callable[[str], list[int]], Any, Any]:
    """The tokenizer, its prompt encoder, the target model and the drafter.

    The drafter is the draft model, or prompt lookup when ``draft_path`` is ``None``. Both
    paths are checked (:func:`specsample.generate.loading.model_source`) before anything is
    loaded, and the tokenizers (``--chat`` included) before the models.
    """
    loading.model_source(target_path, role="target")
    if draft_path is not None:
        loading.model_source(draft_path, role="draft")
    tokenizer = hf.load_tokenizer(target_path, role="target")
    encode = prompt_encoder(tokenizer, chat=args.chat, system=args.system)
    if draft_path is not None:
        hf.check_same_tokenizer(tokenizer, hf.load_tokenizer(draft_path, role="draft"))
    target = _load_model(target_path, "target")
    if draft_path is None:
        return tokenizer, encode, target, NGramDrafter()
    return tokenizer, encode, target, _load_model(draft_path, "draft")


def eos_token_ids(tokenizer: Any, target: Any) -> list[int]:
    """Every end-of-sequence id: the tokenizer's, then those of the target's generation config.

    A generation config's ``eos_token_id`` may be one id or a list of them (chat models list
    their end-of-turn tokens there); duplicates are dropped.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        Its ``eos_token_id`` (an int or ``None``).
    target : transformers.PreTrainedModel
        Its ``generation_config.eos_token_id``, if any.

    Returns
    -------
    list of int
        The ids, in that order (empty: generation stops only at its length).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 7]))
    >>> eos_token_ids(SimpleNamespace(eos_token_id=7), model)
    [7, 2]
    """
    config = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    found = eos_ids(tokenizer.eos_token_id) + eos_ids(config)
    return list(dict.fromkeys(found))


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` laid out by the chat template, ready for the reply."""
    from jinja2 import TemplateError

    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except TemplateError as error:
        raise ValueError(f"--chat: the tokenizer's chat template failed: {error}") from None
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [int(t) for t in ids]


def prompt_encoder(
    tokenizer: Any, *, chat: bool = False, system: str | None = None
) -> Callable[[str], list[int]]:
    """How prompts become token ids: plain encoding, or with ``chat`` the chat template.

    With ``chat`` a prompt becomes the user message of a conversation, after the ``system``
    message when one is given, laid out by ``tokenizer.apply_chat_template`` with
    ``add_generation_prompt=True`` (so the ids end where the assistant's reply begins).

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        The target's tokenizer.
    chat : bool
        Apply the chat template (``--chat``).
    system : str, optional
        The system message (``--system``); only with ``chat``.

    Returns
    -------
    callable
        ``encode(prompt) -> list[int]``.

    Raises
    ------
    ValueError
        ``system`` without ``chat``, or ``chat`` with a tokenizer that has no chat template.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> tokenizer = SimpleNamespace(encode=lambda text: [ord(c) for c in text])
    >>> prompt_encoder(tokenizer)("ab")
    [97, 98]
    """
    if system is not None and not chat:
        raise ValueError("--system needs --chat")
    if not chat:
        return lambda text: list(tokenizer.encode(text))
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "--chat needs a tokenizer with a chat template, and the target's tokenizer has "
            "none (its tokenizer_config.json, or the GGUF file, sets no chat_template)"
        )
    head = [] if system is None else [{"role": "system", "content": system}]
    return lambda text: _chat_ids(tokenizer, [*head, {"role": "user", "content": text}])


def _sampling_options(
    args: argparse.Namespace, tokenizer: Any, target: Any, count: int
) -> dict[str, Any]:
    """Keyword arguments both decoding loops share for ``count`` copies of the prompt."""
    return {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": eos_token_ids(tokenizer, target),
        "seeds": None if args.seed is None else [args.seed + i for i in range(count)],
    }


def _slots(args: argparse.Namespace) -> int:
    """Target slots a step scores per sequence: ``k + 1``, or the tree's nodes and root."""
    shape = tree_shape(args)
    return args.k + 1 if shape is None else shape.nodes + 1


def _step_batch(k: int, target: Any) -> int:
    """Copies decoded at once: as many as keep one step's logits under :data:`STEP_VALUES`."""
    return max(1, STEP_VALUES // ((k + 1) * hf.vocab_size(target)))


def _warm_up(
    args: argparse.Namespace, target: Any, drafter: Any, prompt_ids: list[int], common: Any
) -> None:
    """Run both loops on two tokens, so that the timed runs compare warm code paths."""
    warm = {**common, "max_new_tokens": 2, "seeds": None}
    speculative_generate(
        target, [prompt_ids], drafter, k=args.k, method=args.method, tree=tree_shape(args), **warm
    )
    target_generate(target, [prompt_ids], **warm)


def _print_sequences(
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
    _print_stats(output, method)


def _print_stats(output: Any, method: str) -> None:
    """The run's statistics, and a note when the rule is lossy."""
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


def batch_size(args: argparse.Namespace) -> int:
    """``--batch-size``, or its default: 1, or :data:`FILE_BATCH_SIZE` with ``--input``.

    Parameters
    ----------
    args : argparse.Namespace
        Options parsed by a parser :func:`add_arguments` configured.

    Returns
    -------
    int
        Copies of the prompt, or with ``--input`` sequences decoded at once.
    """
    if args.batch_size is not None:
        return int(args.batch_size)
    return FILE_BATCH_SIZE if args.input is not None else 1


TREE_RULES = (*tree_methods(),)
"""The rules ``--method`` accepts with ``--tree``."""


def tree_shape(args: argparse.Namespace) -> TreeShape | None:
    """The tree ``--tree`` and ``--tree-shape`` ask for (``None``: chain drafting).

    Raises
    ------
    ValueError
        A tree option without ``--tree``, with ``--ngram``, a chain-only ``--method``, a
        malformed shape or one of more nodes than ``--tree`` allows.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> tree_shape(parser.parse_args(["x", "--tree", "6"])).branching
    (2, 1, 1)
    """
    if args.tree is None:
        if args.tree_shape is not None:
            raise ValueError("--tree-shape needs --tree NODES")
        if args.method in TREE_RULES:
            raise ValueError(f"--method {args.method} verifies token trees: it needs --tree NODES")
        return None
    if args.ngram:
        raise ValueError("--tree drafts with the draft model; it cannot be used with --ngram")
    if args.method not in ("chain", *TREE_RULES):
        raise ValueError(f"--method {args.method} verifies chains; with --tree use {TREE_RULES}")
    if args.tree_shape is None:
        return TreeShape.for_budget(args.tree, args.tree_drafting)
    try:
        counts = [int(part) for part in args.tree_shape.split(",")]
    except ValueError:
        raise ValueError(
            f"--tree-shape must be comma-separated counts such as 3,2,1, got {args.tree_shape!r}"
        ) from None
    shape = TreeShape.build(counts, args.tree_drafting)
    if shape.nodes > args.tree:
        raise ValueError(
            f"--tree-shape {args.tree_shape} has {shape.nodes} nodes, more than --tree {args.tree}"
        )
    return shape


def _check_sources(args: argparse.Namespace) -> None:
    """Refuse a prompt together with ``--input`` (or neither), and unpaired file options."""
    if args.input is not None and args.prompt is not None:
        raise ValueError("pass a prompt or --input FILE.jsonl, not both")
    if args.input is None and args.prompt is None:
        raise ValueError("pass a prompt, or --input FILE.jsonl with --output FILE.jsonl")
    if args.output is not None and args.input is None:
        raise ValueError("--output needs --input FILE.jsonl")
    if args.input is not None and args.output is None:
        raise ValueError("--input needs --output FILE.jsonl (where the results are appended)")
    if args.input is not None and args.compare:
        raise ValueError("--compare is not supported with --input")
    if args.system is not None and not args.chat:
        raise ValueError("--system needs --chat")
    for name, text in (("the prompt", args.prompt), ("--system", args.system)):
        if text is not None and not _is_text(text):
            raise ValueError(f"{name} is not valid text: it holds bytes that are not UTF-8")
    tree_shape(args)


def _is_text(value: str) -> bool:
    """Whether ``value`` is text (command-line bytes that were not UTF-8 decode to surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
        Neither or both of a prompt and ``--input``, ``--input`` without ``--output`` (or
        the reverse), ``--compare`` with ``--input``, ``--system`` without ``--chat``; an
        empty prompt, a bad line of the input file (``"{path}:{line}: "``, nothing written),
        a malformed output file, a model path that is neither a model directory nor a GGUF
        file, mismatched models, ``--chat`` with a tokenizer without a chat template, a
        prompt that fills the context, or any argument
        :func:`specsample.generate.speculative_generate` refuses.
    ImportError
        transformers (or, for ``--plot``, matplotlib; for ``--input``, tqdm; for a GGUF
        file, gguf or accelerate) is not installed.
    """
    _check_sources(args)
    if args.input is not None:
        return _run_file(args)
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    target_path, draft_path = _model_paths(args)
    _prepare_runtime(args.threads)
    tokenizer, encode, target, drafter = _load_models(target_path, draft_path, args)
    prompt_ids = encode(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty once tokenized")
    copies = batch_size(args)
    common = _sampling_options(args, tokenizer, target, copies)
    common["max_batch_size"] = _step_batch(_slots(args) - 1, target)
    prompts = [prompt_ids] * copies
    if args.compare:
        _warm_up(args, target, drafter, prompt_ids, common)
    shown = [] if args.chat else prompt_ids
    stream = _Stream(tokenizer, shown) if copies == 1 else None
    output = speculative_generate(
        target,
        prompts,
        drafter,
        k=args.k,
        method=args.method,
        adaptive=not args.fixed_k,
        tree=tree_shape(args),
        on_tokens=stream,
        on_progress=None if stream is not None else _Progress("speculative"),
        **common,
    )
    _print_sequences(output, stream is not None, tokenizer, shown, args.method)
    if args.compare:
        baseline = target_generate(target, prompts, on_progress=_Progress("target-only"), **common)
        _print_speedup(output, baseline)
    if args.plot:
        _plot_acceptance(output.stats, args.plot)
    return 0


class _FileProgress:
    """A tqdm bar over the prompts to do, advanced as each finishes, showing tokens/s."""

    def __init__(self, bar: Any, every: float = 0.5) -> None:
        self.bar = bar
        self.every = every
        self.start = time.perf_counter()
        self.last = self.start

    def __call__(self, finished: int, total: int, tokens: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.every:
            return
        self.last = now
        self.bar.set_postfix_str(f"{tokens / (now - self.start):.1f} tokens/s")


def _file_requests(args: argparse.Namespace) -> tuple[list[jsonl.Request], jsonl.Resume]:
    """Every prompt of ``--input`` (all validated), and what ``--output`` already holds."""
    source, destination = Path(args.input), Path(args.output)
    if destination.exists() and destination.resolve() == source.resolve():
        raise ValueError("--output must be another file than --input")
    defaults = {name: getattr(args, name) for name in jsonl.PARAMETERS}
    requests = jsonl.read_requests(source, defaults)
    return requests, jsonl.read_results(destination)


def _encode_requests(
    requests: list[jsonl.Request], encode: Callable[[str], list[int]], target: Any, source: str
) -> list[list[int]]:
    """The token ids of every prompt, refusing (by line) one that is empty or fills the context."""
    context = getattr(getattr(target, "config", None), "max_position_embeddings", None)
    prompts = []
    for request in requests:
        ids = encode(request.prompt)
        if not ids:
            raise ValueError(f"{source}:{request.line}: prompt is empty once tokenized")
        if context is not None and len(ids) >= context:
            raise ValueError(
                f"{source}:{request.line}: prompt has {len(ids)} tokens but the target's "
                f"context is {context} positions: nothing can be generated"
            )
        prompts.append(ids)
    return prompts


def _import_tqdm() -> Any:
    """The ``tqdm`` progress bar class, or an ``ImportError`` saying how to install it."""
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError(
            "--input needs tqdm; install it with: pip install 'specsample[hf]'"
        ) from None
    return tqdm


def _run_file(args: argparse.Namespace) -> int:
    """Decode every prompt of ``--input`` not yet in ``--output``, appending each result."""
    requests, resume = _file_requests(args)
    if resume.dropped_line is not None:
        print(
            f"{args.output}: line {resume.dropped_line} was cut short by an interrupted write; "
            "dropping it",
            file=sys.stderr,
        )
    todo = [request for request in requests if request.id not in resume.done]
    if len(todo) < len(requests):
        print(
            f"{args.output}: skipping {len(requests) - len(todo)} of {len(requests)} prompts "
            "already done",
            file=sys.stderr,
        )
    if not todo:
        print(f"all {len(requests)} prompts of {args.input} are already in {args.output}")
        return 0
    target_path, draft_path = _model_paths(args)
    _prepare_runtime(args.threads)
    tqdm = _import_tqdm()
    tokenizer, encode, target, drafter = _load_models(target_path, draft_path, args)
    prompts = _encode_requests(todo, encode, target, args.input)
    eos = eos_token_ids(tokenizer, target)
    ends = set(eos)
    with (
        jsonl.ResultWriter(args.output, resume.keep_bytes) as writer,
        tqdm(total=len(todo), unit="prompt", file=sys.stderr) as bar,
    ):

        def on_finish(index: int, token_ids: list[int]) -> None:
            text = tokenizer.decode(token_ids, skip_special_tokens=True)
            writer.write(todo[index], text, token_ids, jsonl.finish_reason(token_ids, ends))
            bar.update(1)

        output = speculative_generate(
            target,
            prompts,
            drafter,
            k=args.k,
            method=args.method,
            adaptive=not args.fixed_k,
            tree=tree_shape(args),
            temperature=[request.temperature for request in todo],
            top_k=[request.top_k for request in todo],
            top_p=[request.top_p for request in todo],
            min_p=[request.min_p for request in todo],
            max_new_tokens=[request.max_new_tokens for request in todo],
            eos_token_id=eos,
            seeds=[request.seed for request in todo],
            max_batch_size=min(batch_size(args), _step_batch(_slots(args) - 1, target)),
            on_progress=_FileProgress(bar),
            on_finish=on_finish,
        )
    print(f"wrote {writer.written} results to {args.output}\n")
    _print_stats(output, args.method)
    if args.plot:
        _plot_acceptance(output.stats, args.plot)
    return 0
