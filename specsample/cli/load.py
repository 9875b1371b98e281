"""What ``specsample generate`` loads: the model pair, the tokenizer and how prompts are encoded.

Models come from local model directories or GGUF files (with ``--quantize`` their linear
layers kept in a weight-only format, see :mod:`specsample.adapter.loading`). What the run
needs before the weights is read first: the target's context from its config alone
(:func:`context_length`), then the tokenizers (:func:`load_tokenizers`), so that a prompt
the context cannot hold is refused before any model loads (:func:`load_models`). Each model
loaded is described on stderr (parameters, dtype, memory, the forward that runs it), while
transformers' progress bars and log messages are silenced (set ``TRANSFORMERS_VERBOSITY`` to
see its messages again). With ``--chat`` each prompt becomes the user message of a
conversation (after the ``--system`` message, if given) laid out by the tokenizer's chat
template. Generation stops at every end-of-sequence id of the tokenizer and of the target's
generation config (:func:`eos_token_ids`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from specsample import adapter, models
from specsample.adapter.gguf import read_gguf
from specsample.extras import install_command
from specsample.generate.inputs import eos_ids
from specsample.generate.ngram import NGramDrafter

VERBOSITY = "TRANSFORMERS_VERBOSITY"
"""The environment variable that, when set, leaves transformers' messages during loading to
transformers (which reads it)."""


def model_paths(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The target and draft paths (``None``: prompt lookup) the options ask for.

    Without ``--target`` the default pair installed under
    :data:`specsample.models.DEFAULT_DIR` is used (its draft replaced by ``--draft`` or
    ``--ngram``). The options are those
    :func:`specsample.cli.generate_args.check_arguments` accepted (one drafter).

    Raises
    ------
    ValueError
        No ``--target`` and no default pair installed.
    """
    if args.target is None:
        pair = adapter.default_pair()
        if pair is None:
            raise ValueError(
                "no default model pair is installed (expected "
                f"{models.DEFAULT_DIR}/target and .../draft): pass --target PATH with "
                "--draft PATH or --ngram"
            )
        if args.draft is not None:
            return pair[0], Path(args.draft)
        return pair[0], None if args.ngram else pair[1]
    return Path(args.target), None if args.ngram else Path(args.draft)


def prepare_runtime(threads: int | None) -> None:
    """Check that transformers is installed, silence its progress bars, set torch's threads.

    Raises
    ------
    ImportError
        transformers is not installed.
    """
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ImportError(
            f"generate needs transformers; install it with: {install_command('hf')}"
        ) from None
    hf_logging.disable_progress_bar()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep transformers to its errors while models and tokenizers load: no log messages
    below errors and no Python warnings, unless ``TRANSFORMERS_VERBOSITY`` is set, so that
    nothing interleaves with what the command prints."""
    from transformers.utils import logging as hf_logging

    if VERBOSITY in os.environ:
        yield
        return
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(before)


def _load_model(path: Path, role: str, quantize: str) -> Any:
    """Load one model (its linear layers as ``quantize`` asks), check its cache handling and
    say on stderr what was loaded and which forward runs it."""
    model = adapter.load_model(path, role=role, quantize=quantize)
    lm = adapter.CachedLM(model, role=role)
    description = adapter.describe_model(model, adapter.model_source(path, role=role))
    print(f"{role}: {path}: {description}; {lm.runs} ({lm.choice})", file=sys.stderr, flush=True)
    return model


def context_length(path: Path) -> int | None:
    """The target's context, in positions, read from its config alone: no weights load.

    A model directory's ``config.json`` is read by transformers' ``AutoConfig``, which names
    every architecture's context ``max_position_embeddings`` (GPT-2's ``n_positions``
    included; a multimodal model's is its text config's); a GGUF file's is its
    ``{architecture}.context_length`` metadata. Either is the value the loaded model's
    config will hold, and the decoding loop stops at.

    Parameters
    ----------
    path : Path
        The target: a model directory or a ``.gguf`` file (checked first,
        :func:`specsample.adapter.model_source`).

    Returns
    -------
    int or None
        The context; ``None`` when the config sets none.

    Raises
    ------
    ValueError
        ``path`` is neither a model directory nor a GGUF file, or transformers cannot make
        sense of its ``config.json``.
    OSError
        The config or the file cannot be read.
    """
    source = adapter.model_source(path, role="target")
    if source.gguf_file is not None:
        file = read_gguf(source.gguf_file)
        value = file.metadata.get(f"{file.architecture}.context_length")
    else:
        from transformers import AutoConfig

        with _quiet():
            config = AutoConfig.from_pretrained(source.directory, local_files_only=True)
        text = config.get_text_config(decoder=True)
        value = getattr(text, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def load_tokenizers(
    target_path: Path, draft_path: Path | None, args: argparse.Namespace
) -> tuple[Any, Callable[[str], list[int]]]:
    """The target's tokenizer and its prompt encoder, checked against the draft's tokenizer.

    Both paths are checked (:func:`specsample.adapter.model_source`) before anything is
    loaded. While the tokenizers load or encode, transformers reports errors only, unless
    ``TRANSFORMERS_VERBOSITY`` is set (so a prompt longer than the tokenizer's maximum
    length is reported by the command alone).

    Parameters
    ----------
    target_path, draft_path : Path
        From :func:`model_paths` (``draft_path`` ``None``: prompt lookup, no draft tokenizer).
    args : argparse.Namespace
        The options (``--chat``, ``--system``).

    Returns
    -------
    tuple
        ``(tokenizer, encode)``.

    Raises
    ------
    ValueError
        A path that is neither a model directory nor a GGUF file, tokenizers that differ,
        ``--chat`` with a tokenizer without a chat template.
    """
    adapter.model_source(target_path, role="target")
    if draft_path is not None:
        adapter.model_source(draft_path, role="draft")
    with _quiet():
        tokenizer = adapter.load_tokenizer(target_path, role="target")
        plain = prompt_encoder(tokenizer, chat=args.chat, system=args.system)
        if draft_path is not None:
            draft_tokenizer = adapter.load_tokenizer(draft_path, role="draft")
            adapter.check_same_tokenizer(tokenizer, draft_tokenizer)

    def encode(text: str) -> list[int]:
        with _quiet():
            return plain(text)

    return tokenizer, encode


def load_models(
    target_path: Path, draft_path: Path | None, args: argparse.Namespace
) -> tuple[Any, Any]:
    """The target model and the drafter: the draft model, or prompt lookup when
    ``draft_path`` is ``None``.

    While they load, transformers reports errors only, unless ``TRANSFORMERS_VERBOSITY``
    is set; each model loaded is described on stderr.

    Parameters
    ----------
    target_path, draft_path : Path
        From :func:`model_paths`, checked by :func:`load_tokenizers`.
    args : argparse.Namespace
        The options (``--quantize``: ``"none"`` when absent).

    Returns
    -------
    tuple
        ``(target, drafter)``.
    """
    quantize = getattr(args, "quantize", "none")
    with _quiet():
        target = _load_model(target_path, "target", quantize)
        if draft_path is None:
            return target, NGramDrafter()
        return target, _load_model(draft_path, "draft", quantize)


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
