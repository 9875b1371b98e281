"""What the benchmark scripts that run models share: transformers kept quiet, the shipped pair.

transformers' weight-loading bars and its warnings would interleave with the tables the
scripts print, so :func:`quiet_transformers` switches both off before anything is loaded.
A script whose optional package (or GPU) is missing prints one ``skipped: ...`` line on
stdout and exits with status 0 (:func:`skip`), so a run over every script finishes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from specsample import adapter

HF_EXTRA = "pip install 'specsample[hf]'"
"""How to install transformers and what loading models needs."""


def skip(reason: str) -> int:
    """Print ``skipped: <script>: reason`` on stdout; return 0, a skipped script's status."""
    print(f"skipped: {Path(sys.argv[0]).name}: {reason}", flush=True)
    return 0


def quiet_transformers() -> bool:
    """Switch off transformers' progress bars and its log records below errors.

    Returns ``False`` when transformers is not installed.
    """
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return False
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    return True


def load_default_pair() -> tuple[Any, Any, Any] | None:
    """The shipped default pair's tokenizer, target and draft, loaded quietly.

    Without transformers, prints a ``skipped`` line (:func:`skip`) and returns ``None``.

    Raises
    ------
    SystemExit
        The default pair is not installed (a broken installation: it ships in the package).
    """
    if not quiet_transformers():
        skip(f"the models need transformers: {HF_EXTRA}")
        return None
    pair = adapter.default_pair()
    if pair is None:
        raise SystemExit("the default model pair is not installed")
    tokenizer = adapter.load_tokenizer(pair[0])
    target = adapter.load_model(pair[0], role="target")
    draft = adapter.load_model(pair[1], role="draft")
    return tokenizer, target, draft
