"""``specsample generate``: batched speculative decoding of a prompt, or of a JSONL file.

The run loads a target and a draft model (or prompt lookup) from local model directories or
GGUF files, says on stderr what it loaded (:mod:`specsample.cli.load`), streams the text of
the first sequence (batch 1) or reports progress on stderr, prints the run's statistics and,
with ``--compare``, the wall-clock speedup over target-only decoding
(:mod:`specsample.cli.output`). With ``--chat`` only the reply is printed.

With ``--input prompts.jsonl --output out.jsonl`` it decodes every prompt of a JSONL file
instead (per-prompt parameters, the command-line options as defaults; see
:mod:`specsample.cli.jsonl`), ``--batch-size`` of them at a time (default 8), appends one
result line per prompt as soon as it finishes, shows a progress bar on stderr, and resumes an
interrupted run: prompts whose result the output already holds (same id, prompt and sampling
parameters) are skipped, and a stored result that contradicts the input is refused
(:mod:`specsample.cli.resume`). Both files are checked in full before any model loads.

Prompts are tokenized before the models load, and checked against the target's context as
its config gives it (:func:`specsample.cli.load.context_length`): a prompt that is empty
once tokenized, or leaves no room in the context, is refused before any weights are read.

The draft length is adaptive by default: each step drafts between 0 and ``k`` tokens, as the
acceptance and step times seen so far suggest (exact either way); ``--fixed-k`` always
drafts ``k``. The options and their bounds: :mod:`specsample.cli.generate_args`. The
models run on the CPU, each in the dtype it loads in (float32 for the default pair and for
GGUF files), their linear layers' weights in the format ``--quantize`` gives (by default a
``llama`` GGUF file's 4-bit blocks are kept as int4 and its ``Q8_0`` ones as int8 or
bfloat16, a model directory's weights as they load).

On Ctrl-C the streamed line is ended, the statistics of the steps that ran are printed and
the command exits with status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from specsample.bench.measure import CpuShare
from specsample.cli import jsonl, resume
from specsample.cli.generate_args import (
    add_arguments,
    batch_size,
    check_arguments,
    draft_length,
    step_batch,
    tree_shape,
)
from specsample.cli.load import (
    context_length,
    eos_token_ids,
    load_models,
    load_tokenizers,
    model_paths,
    prepare_runtime,
)
from specsample.cli.output import (
    Stream,
    plot_acceptance,
    print_sequences,
    print_speedup,
    print_stats,
)
from specsample.cli.progress import Progress, import_tqdm
from specsample.generate.decoder import speculative_generate, target_generate
from specsample.generate.policy import PolicyMemory
from specsample.generate.stats import GenerationInterrupted

_HELP = "generate text with batched speculative decoding"
"""The command's line in ``specsample --help``."""

_DESCRIPTION = (
    "Generate from a target causal LM with speculative decoding: a draft model (--draft) or "
    "prompt lookup (--ngram) proposes k tokens, one target forward scores them and exact "
    "verification keeps the target's distribution. Without --target, the default pair "
    "installed under specsample/models/default is used. Generation runs on the CPU, the "
    "linear layers' weights as --quantize says: by default a model directory in the dtype it "
    "loads in (float32 for the default pair), and a .gguf file of the llama architecture in "
    "float32 with its 4-bit weights kept as int4 and its Q8_0 weights as int8 or bfloat16 "
    "(see --quantize)."
)
"""What ``specsample generate --help`` says of the command."""


def add_parser(commands: Any) -> None:
    """Add the ``generate`` command to the subparsers ``commands``."""
    add_arguments(commands.add_parser("generate", help=_HELP, description=_DESCRIPTION))


def check(args: argparse.Namespace) -> None:
    """Refuse options that make no sense together, before anything is read or loaded.

    Raises
    ------
    ValueError
        As :func:`specsample.cli.generate_args.check_arguments`.
    """
    check_arguments(args)


def run(args: argparse.Namespace) -> int:
    """Run ``specsample generate`` as :func:`add_parser` configured it.

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
        Options :func:`specsample.cli.generate_args.check_arguments` refuses; an empty
        prompt, bad lines of the input file (``"{path}:{line}: "``, all of them, nothing
        written), an ``--input`` or ``--output`` path that cannot serve, a malformed output
        file or one whose results contradict the input, a model path that is neither a
        model directory nor a GGUF file, mismatched models, ``--chat`` with a tokenizer
        without a chat template, a prompt the target's context cannot hold (refused before
        the models load), or any argument
        :func:`specsample.generate.speculative_generate` refuses.
    KeyboardInterrupt
        Ctrl-C, once the statistics of what ran are printed.
    ImportError
        transformers (or, for ``--plot``, matplotlib; for ``--input``, tqdm; for a GGUF
        file, gguf or accelerate) is not installed.
    """
    check_arguments(args)
    if args.input is not None:
        return _run_file(args)
    target_path, draft_path = model_paths(args)
    prepare_runtime(args.threads)
    context = context_length(target_path)
    tokenizer, encode = load_tokenizers(target_path, draft_path, args)
    prompt_ids = _encode_prompt(args, encode, context)
    target, drafter = load_models(target_path, draft_path, args)
    copies = batch_size(args)
    common = _sampling_options(args, eos_token_ids(tokenizer, target), copies)
    common["max_batch_size"] = step_batch(args, target)
    prompts = [prompt_ids] * copies
    memory = PolicyMemory()
    if args.compare:
        _warm_up(args, target, drafter, prompt_ids, common, memory)
    shown = [] if args.chat else prompt_ids
    stream = Stream(tokenizer, shown) if copies == 1 else None
    with CpuShare() as contention:
        with _statistics_if_interrupted(stream is not None):
            output = speculative_generate(
                target,
                prompts,
                drafter,
                **_drafting_options(args),
                on_tokens=stream,
                on_progress=None if stream is not None else Progress("speculative"),
                memory=memory,
                **common,
            )
        print_sequences(output, stream is not None, tokenizer, shown, args.method)
        baseline = None
        if args.compare:
            with _statistics_if_interrupted(False):
                progress = Progress("target-only")
                baseline = target_generate(target, prompts, on_progress=progress, **common)
    if baseline is not None:
        print_speedup(output, baseline, contention.share)
    if args.plot:
        plot_acceptance(output.stats, args.plot)
    return 0


@contextlib.contextmanager
def _statistics_if_interrupted(line_open: bool) -> Iterator[None]:
    """On Ctrl-C in a decoding loop: end the streamed line (``line_open``), print the
    statistics of the steps that ran, and let the interrupt go on."""
    try:
        yield
    except GenerationInterrupted as interrupted:
        print("\n" if line_open else "")
        print("statistics of the steps that ran before the interrupt:")
        print(interrupted.stats.format_table(), flush=True)
        raise


def _encode_prompt(
    args: argparse.Namespace, encode: Callable[[str], list[int]], context: int | None
) -> list[int]:
    """The prompt's token ids, refusing a prompt or drafts that the target's ``context``
    cannot hold (named as the options are)."""
    prompt_ids = encode(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty once tokenized")
    if context is not None and len(prompt_ids) >= context:
        laid_out = " laid out by the chat template" if args.chat else ""
        raise ValueError(
            f"argument prompt: the prompt has {len(prompt_ids)} tokens{laid_out} but the "
            f"target's context is {context} positions: nothing can be generated (give at "
            f"most {context - 1} tokens)"
        )
    _check_drafts_fit(args, context)
    return prompt_ids


def _check_drafts_fit(args: argparse.Namespace, context: int | None) -> None:
    """Refuse a ``-k`` (or a ``--tree``) that one step of the target's ``context`` cannot score."""
    shape = tree_shape(args)
    drafts = draft_length(args) if shape is None else shape.nodes
    if context is not None and drafts >= context:
        asked = f"-k {drafts}" if shape is None else f"a tree of {drafts} nodes (--tree)"
        raise ValueError(
            f"{asked} must be below the target's context ({context} positions): a step "
            "scores the drafts and one more slot"
        )


def _drafting_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of :func:`specsample.generate.speculative_generate` on the drafts."""
    return {
        "k": draft_length(args),
        "method": args.method,
        "adaptive": not args.fixed_k,
        "tree": tree_shape(args),
    }


def _sampling_options(args: argparse.Namespace, eos: list[int], count: int) -> dict[str, Any]:
    """Keyword arguments both decoding loops share for ``count`` copies of the prompt."""
    return {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": eos,
        "seeds": None if args.seed is None else [args.seed + i for i in range(count)],
    }


def _warm_up(
    args: argparse.Namespace,
    target: Any,
    drafter: Any,
    prompt_ids: list[int],
    common: Any,
    memory: PolicyMemory,
) -> None:
    """Run both loops on two tokens, so that the timed runs compare warm code paths (the
    speculative one with ``memory``, the draft-length policy's memory of the timed run)."""
    warm = {**common, "max_new_tokens": 2, "seeds": None}
    speculative_generate(
        target, [prompt_ids], drafter, **_drafting_options(args), memory=memory, **warm
    )
    target_generate(target, [prompt_ids], **warm)


def _file_requests(args: argparse.Namespace) -> tuple[list[jsonl.Request], int]:
    """The prompts of ``--input`` that ``--output`` does not hold yet, and the length of
    ``--output`` to keep: :func:`specsample.cli.resume.pending`, the command-line options
    giving the defaults."""
    defaults = {name: getattr(args, name) for name in jsonl.PARAMETERS}
    return resume.pending(args.input, args.output, defaults)


def _encode_requests(
    requests: list[jsonl.Request],
    encode: Callable[[str], list[int]],
    context: int | None,
    source: str,
) -> list[list[int]]:
    """The token ids of every prompt, refusing (by line) one that is empty or fills the
    target's ``context``."""
    prompts = []
    for request in requests:
        ids = encode(request.prompt)
        if not ids:
            raise ValueError(f"{source}:{request.line}: prompt is empty once tokenized")
        if context is not None and len(ids) >= context:
            raise ValueError(
                f"{source}:{request.line}: prompt has {len(ids)} tokens but the target's "
                f"context is {context} positions: nothing can be generated (give at most "
                f"{context - 1} tokens)"
            )
        prompts.append(ids)
    return prompts


def _request_options(requests: list[jsonl.Request]) -> dict[str, Any]:
    """Keyword arguments of the decoding loop: each sampling parameter, one per request."""
    return {
        "temperature": [request.temperature for request in requests],
        "top_k": [request.top_k for request in requests],
        "top_p": [request.top_p for request in requests],
        "min_p": [request.min_p for request in requests],
        "max_new_tokens": [request.max_new_tokens for request in requests],
        "seeds": [request.seed for request in requests],
    }


def _run_file(args: argparse.Namespace) -> int:
    """Decode every prompt of ``--input`` not yet in ``--output``, appending each result."""
    todo, keep_bytes = _file_requests(args)
    if not todo:
        return 0
    target_path, draft_path = model_paths(args)
    prepare_runtime(args.threads)
    tqdm = import_tqdm()
    context = context_length(target_path)
    tokenizer, encode = load_tokenizers(target_path, draft_path, args)
    prompts = _encode_requests(todo, encode, context, args.input)
    _check_drafts_fit(args, context)
    target, drafter = load_models(target_path, draft_path, args)
    eos = eos_token_ids(tokenizer, target)
    ends = set(eos)
    with (
        _statistics_if_interrupted(False),
        jsonl.ResultWriter(args.output, keep_bytes) as writer,
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
            **_drafting_options(args),
            **_request_options(todo),
            eos_token_id=eos,
            max_batch_size=min(batch_size(args), step_batch(args, target)),
            on_progress=Progress(every=0.5, bar=bar),
            on_finish=on_finish,
        )
    print(f"wrote {writer.written} results to {args.output}\n")
    print_stats(output, args.method)
    if args.plot:
        plot_acceptance(output.stats, args.plot)
    return 0
