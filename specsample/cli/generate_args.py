"""The options of ``specsample generate``, and what they ask for once parsed.

:func:`add_arguments` adds them, each checked as it is parsed (the sampling parameters in
the ranges :class:`specsample.params.SamplingParams` accepts); :func:`check_arguments`
refuses, in flag syntax, the combinations that make no sense before anything is read or
loaded; :func:`draft_length`, :func:`batch_size`, :func:`tree_shape` and :func:`step_batch`
read back what the run needs. The command runs on the CPU, each model in the dtype it loads
in (float32 for the default pair and for GGUF files), its linear layers in the weight-only
format ``--quantize`` asks for (:mod:`specsample.adapter.quantize`).

Every option that sizes the work is bounded (``--help`` states each bound): ``-k`` by
:data:`specsample.generate.MAX_K`, ``--max-new-tokens`` by
:data:`specsample.generate.MAX_NEW_TOKENS` (and the target's context), ``--batch-size`` by
:data:`MAX_BATCH_SIZE`, ``--threads`` by :data:`specsample.cli.args.MAX_THREADS`; the copies
of the prompt are decoded at most ``STEP_VALUES // ((k + 1) * vocab)`` at a time, so one step
never holds more than :data:`STEP_VALUES` logits.

Examples
--------
>>> parser = argparse.ArgumentParser()
>>> add_arguments(parser)
>>> args = parser.parse_args(["def f():", "--ngram", "-k", "8"])
>>> draft_length(args), args.fixed_k, args.max_new_tokens, batch_size(args)
(8, False, 128, 1)
"""

from __future__ import annotations

import argparse
from typing import Any

from specsample import adapter
from specsample.adapter.quantize import MODES
from specsample.cli.args import (
    add_seed_and_plot_arguments,
    add_threads_argument,
    int_in_range,
    number_in_range,
)
from specsample.generate.decoder import MAX_K
from specsample.generate.inputs import MAX_NEW_TOKENS
from specsample.generate.tree import TreeShape
from specsample.methods import (
    MAX_STEP_TREE_NODES,
    METHODS,
    TREE_DRAFTINGS,
    TreeDrafting,
    chain_methods,
    tree_draftings,
    tree_methods,
)

MAX_BATCH_SIZE = 1024
"""Most copies of the prompt (or, with ``--input``, sequences at once) ``--batch-size`` may
ask for."""

FILE_BATCH_SIZE = 8
"""Sequences decoded at once with ``--input`` when ``--batch-size`` is not given."""

STEP_VALUES = 1 << 24
"""Most logits one step holds: the copies are decoded
``max(1, STEP_VALUES // ((k + 1) * vocab))`` at a time (64 MiB of float32 logits per step)."""

TREE_RULES = tree_methods()
"""The rules ``--method`` accepts with ``--tree``."""

DEFAULT_K = 4
"""``-k`` when it is not given."""

MAX_TOP_K = (1 << 63) - 1
"""Largest ``--top-k``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``generate`` command's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser; :func:`specsample.cli.generate.run` reads the options back.
    """
    _add_source_arguments(parser)
    _add_drafting_arguments(parser)
    _add_sampling_arguments(parser)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run target-only decoding and report the wall-clock speedup",
    )
    add_seed_and_plot_arguments(parser, plot="a bar chart of acceptance by position")
    parser.add_argument(
        "--input",
        metavar="FILE.jsonl",
        help="generate for every prompt of a JSONL file instead of PROMPT: one object per "
        'line, {"prompt": str, "id": str or int (default: the line number), and optionally '
        '"max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed"} (missing fields '
        "take the command-line values; a line without a seed gets SEED + its index, and "
        '"seed": null is unseeded; a seeded sampled prompt is reproducible with '
        "--method gumbel, or with --fixed-k); every bad line is reported before any model "
        "loads; needs --output",
    )
    parser.add_argument(
        "--output",
        metavar="FILE.jsonl",
        help="with --input: append one JSON line per finished prompt (id, line, prompt, "
        "completion, completion_tokens, finish_reason and the sampling parameters); a prompt "
        "whose id, text and parameters it already holds is skipped, so an interrupted run "
        "resumes, and a stored result whose id names an input line with another prompt or "
        'parameters is refused (lines without an "id" are known by their line number, so '
        "give ids to insert, delete or move lines between runs)",
    )
    add_threads_argument(
        parser, "for torch", "default: torch's choice; 1 is often fastest on a busy machine; "
    )


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The prompt, the models and how the prompt is laid out."""
    parser.add_argument(
        "prompt",
        nargs="?",
        help="the prompt text (its tokens must leave room in the target's context); or pass "
        "--input",
    )
    parser.add_argument(
        "--target",
        metavar="PATH",
        help="target model: a directory (config.json, weights, tokenizer) or a .gguf file "
        "(local files only; see --quantize for what becomes of its quantized tensors)",
    )
    parser.add_argument(
        "--draft", metavar="PATH", help="draft model: a directory or a .gguf file, as --target"
    )
    parser.add_argument(
        "--ngram", action="store_true", help="draft by prompt lookup instead of a draft model"
    )
    parser.add_argument(
        "--quantize",
        choices=MODES,
        default="auto",
        help="weights of both models' linear layers (default: %(default)s): auto keeps the "
        "quantization of a .gguf file of the llama architecture (Q4_0, Q4_1 and Q4_K as "
        "int4a8 on a CPU with AVX512-VNNI, else int4; Q8_0 as int8a8 there, else bfloat16; "
        "other quantized types as bfloat16; the rest float32) and a model directory's "
        "weights in the dtype they load in (float32 for the default pair; a checkpoint's "
        "own dtype, often bfloat16); none: no quantization (a .gguf file dequantized to "
        "float32); int4a8, int8a8 (integer weights in groups of 32 times activations "
        "quantized to int8, by integer dot products; need numba), bfloat16, int8 or int4: "
        "every linear layer in that format, the LM head in bfloat16. The output follows the "
        "quantized model exactly",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="lay out the prompt (with --input: every prompt) as a user message with the "
        "tokenizer's chat template (add_generation_prompt) and print only the reply; needs a "
        "tokenizer with a chat template",
    )
    parser.add_argument(
        "--system", metavar="MESSAGE", help="with --chat: a system message before each prompt"
    )


def _add_drafting_arguments(parser: argparse.ArgumentParser) -> None:
    """The drafts per step, the verification rule and the token tree."""
    _add_count(
        parser,
        "-k",
        MAX_K,
        f"most drafts per step, or with --fixed-k drafts per step (default {DEFAULT_K}, "
        f"at most {MAX_K} and below the target's context; not with --tree, whose depth is "
        "the draft length)",
    )
    parser.add_argument(
        "--fixed-k",
        action="store_true",
        help="always draft k tokens (default: choose each step's draft length in 0..k, k "
        "being the maximum, from the acceptance and step times seen so far; exact either "
        "way); not with --tree, which drafts its whole tree every step",
    )
    exact = chain_methods()
    lossy = [name for name in chain_methods(lossy=True) if name not in exact]
    parser.add_argument(
        "--method",
        choices=[*chain_methods(lossy=True), *TREE_RULES],
        default=exact[0],
        help=f"verification rule: {' or '.join(exact)} (exact), {', '.join(lossy)} (LOSSY: the "
        "output does not follow the target's distribution); with --tree, one of "
        f"{', '.join(TREE_RULES)} (default: the rule --tree-drafting calls for). "
        + "; ".join(
            f"{name}: {METHODS[name].summary}" for name in (*chain_methods(lossy=True), *TREE_RULES)
        ),
    )
    parser.add_argument(
        "--tree",
        metavar="NODES",
        type=int_in_range(2, MAX_STEP_TREE_NODES),
        help="draft a token tree of at most NODES nodes per step with the draft model (two "
        "branches from the root, each a chain), scored in one target forward; every step "
        "drafts the whole tree, so -k and --fixed-k do not apply",
    )
    parser.add_argument(
        "--tree-shape",
        metavar="C1,C2,...",
        help="with --tree: children per node at each depth instead (e.g. 3,2,1)",
    )
    parser.add_argument(
        "--tree-drafting",
        choices=tree_draftings(),
        default=None,
        help="with --tree: how children are drawn: "
        + "; ".join(f"{d.name}, {d.summary}" for d in TREE_DRAFTINGS.values())
        + f" (default {tree_draftings()[0]}; temperature 0 always takes the draft's most likely "
        "tokens)",
    )


def _add_count(parser: argparse.ArgumentParser, flag: str, most: int, help: str) -> None:
    """Add ``flag``, a count in ``1..most`` that parses to ``None`` when not given: its
    default depends on other options (:func:`draft_length`, :func:`batch_size`)."""
    parser.add_argument(flag, type=int_in_range(1, most), default=None, help=help)


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """Sampling parameters, batch size, length and seed."""
    parser.add_argument(
        "--temperature",
        type=number_in_range(0.0),
        default=0.0,
        help="sampling temperature, a finite number >= 0 (default 0: greedy)",
    )
    parser.add_argument(
        "--top-k",
        type=int_in_range(0, MAX_TOP_K),
        default=0,
        help="top-k filter, an integer >= 0 (default 0: off)",
    )
    parser.add_argument(
        "--top-p",
        type=number_in_range(0.0, 1.0, open_low=True),
        default=1.0,
        help="top-p filter, in (0, 1] (default 1: off)",
    )
    parser.add_argument(
        "--min-p",
        type=number_in_range(0.0, 1.0),
        default=0.0,
        help="min-p filter, in [0, 1] (default 0: off)",
    )
    _add_count(
        parser,
        "--batch-size",
        MAX_BATCH_SIZE,
        f"copies of the prompt decoded together (default 1), or with --input the "
        f"sequences decoded at once (default {FILE_BATCH_SIZE}); at most {MAX_BATCH_SIZE}, and "
        f"at most {STEP_VALUES} // ((k + 1) * vocab) at a time, so that a step holds at most "
        f"{STEP_VALUES} logits",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int_in_range(1, MAX_NEW_TOKENS),
        default=128,
        help=f"tokens per sequence (default 128, at most {MAX_NEW_TOKENS}; fewer where the "
        "target's context ends)",
    )
    parser.add_argument(
        "--seed",
        type=int_in_range(0, (1 << 64) - 1),
        default=None,
        help="seed of sequence i (with --input: of the file's i-th prompt, from 0) is SEED + i "
        "(default: unseeded). With --method gumbel a seeded sequence is the one target-only "
        "decoding gives for its seed, whatever the drafter, k, batch or threads; with the other "
        "methods only --fixed-k (or --tree) runs are reproducible: the adaptive draft length, "
        "the default, follows the measured step times, so two seeded runs without --fixed-k "
        "may differ (each is an exact sample either way)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, in flag syntax, options that make no sense together, before anything loads.

    Raises
    ------
    ValueError
        Neither or both of a prompt and ``--input``, ``--input`` without ``--output`` (or
        the reverse), ``--compare`` with ``--input``, ``--system`` without ``--chat``, a
        prompt that is empty or, like a system message, not text; ``--draft`` with
        ``--ngram``, ``--target`` with neither; a ``--method`` that needs the draft's
        distributions with ``--ngram``; drafting options :func:`tree_shape` refuses.
    """
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
    if args.prompt is not None and not args.prompt.strip():
        raise ValueError("the prompt is empty")
    _check_drafter(args)
    tree_shape(args)


def _check_drafter(args: argparse.Namespace) -> None:
    """Refuse a drafter asked for twice or not at all, or a rule it cannot serve."""
    if args.draft is not None and args.ngram:
        raise ValueError("pass --draft PATH or --ngram, not both")
    if args.target is not None and args.draft is None and not args.ngram:
        raise ValueError("--target needs --draft PATH or --ngram")
    if args.ngram and METHODS[args.method].needs_draft_probs:
        raise ValueError(
            f"--method {args.method} needs the draft's distributions, which prompt lookup "
            "(--ngram) does not have: use --method chain, or a draft model (--draft PATH)"
        )


def _is_text(value: str) -> bool:
    """Whether ``value`` is text (command-line bytes that were not UTF-8 decode to surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def draft_length(args: argparse.Namespace) -> int:
    """``-k`` of the parsed options, or its default :data:`DEFAULT_K`: the most drafts per
    step (with ``--fixed-k``, the drafts per step)."""
    return DEFAULT_K if args.k is None else int(args.k)


def tree_shape(args: argparse.Namespace) -> TreeShape | None:
    """The tree ``--tree`` and ``--tree-shape`` ask for (``None``: chain drafting).

    Raises
    ------
    ValueError
        A tree option without ``--tree``; ``--tree`` with ``--ngram``, ``-k`` or
        ``--fixed-k``; a chain-only ``--method``, or a tree rule that is biased for
        ``--tree-drafting``; a malformed shape or one of more nodes than ``--tree`` allows.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> tree_shape(parser.parse_args(["x", "--tree", "6"])).branching
    (2, 1, 1)
    """
    if args.tree is None:
        for flag, value in (
            ("--tree-shape", args.tree_shape),
            ("--tree-drafting", args.tree_drafting),
        ):
            if value is not None:
                raise ValueError(f"{flag} needs --tree NODES")
        if args.method in TREE_RULES:
            raise ValueError(f"--method {args.method} verifies token trees: it needs --tree NODES")
        return None
    if args.ngram:
        raise ValueError("--tree drafts with the draft model; it cannot be used with --ngram")
    for flag, given in (("-k", args.k is not None), ("--fixed-k", args.fixed_k)):
        if given:
            raise ValueError(
                f"{flag} does not apply with --tree: every step drafts the whole tree, as deep "
                "as its shape (set it with --tree NODES or --tree-shape)"
            )
    drafting = TREE_DRAFTINGS[args.tree_drafting or tree_draftings()[0]]
    _check_tree_method(args.method, drafting)
    if args.tree_shape is None:
        return TreeShape.for_budget(args.tree, drafting.name)
    try:
        counts = [int(part) for part in args.tree_shape.split(",")]
    except ValueError:
        raise ValueError(
            f"--tree-shape must be comma-separated counts such as 3,2,1, got {args.tree_shape!r}"
        ) from None
    if min(counts) < 1:
        raise ValueError(f"--tree-shape counts must be at least 1, got {args.tree_shape}")
    nodes = TreeShape(tuple(counts), drafting.name).nodes
    if nodes > args.tree:
        raise ValueError(
            f"--tree-shape {args.tree_shape} has {nodes} nodes, more than --tree {args.tree}"
        )
    return TreeShape.build(counts, drafting.name)


def _check_tree_method(method: str, drafting: TreeDrafting) -> None:
    """Refuse a ``--method`` that does not verify trees, or is biased for ``drafting``."""
    exact = " or ".join(drafting.exact)
    if method not in (chain_methods()[0], *TREE_RULES):
        raise ValueError(
            f"--method {method} verifies chains; with --tree use {', '.join(TREE_RULES)} "
            f"(or leave --method out for the rule --tree-drafting calls for)"
        )
    if method in TREE_RULES and drafting.reason(method) is not None:
        raise ValueError(
            f"--method {method} is biased with --tree-drafting {drafting.name}: with it use "
            f"--method {exact} (or leave --method out)"
        )


def step_batch(args: argparse.Namespace, target: Any) -> int:
    """Sequences decoded at once: as many as keep one step's logits under :data:`STEP_VALUES`.

    A step scores ``k + 1`` slots per sequence, or with a tree its nodes and root, each a row
    of the target's vocabulary.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options.
    target : transformers.PreTrainedModel
        The target model (its vocabulary size).

    Returns
    -------
    int
        At least 1.
    """
    shape = tree_shape(args)
    slots = draft_length(args) + 1 if shape is None else shape.nodes + 1
    return max(1, STEP_VALUES // (slots * adapter.vocab_size(target)))
