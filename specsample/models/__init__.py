"""The default target/draft model pair shipped with the package.

``default/target`` and ``default/draft`` are Hugging Face model directories (config, weights and
a shared tokenizer) for ``transformers.AutoModelForCausalLM`` and ``AutoTokenizer``. How they
were trained is described in this package's ``README.md``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_DIR", "MODEL_NAMES", "default_model_dir"]

DEFAULT_DIR = Path(__file__).resolve().parent / "default"
"""Directory holding the ``target`` and ``draft`` model directories: the one place the default
pair is looked for (:func:`default_model_dir`, :func:`specsample.adapter.default_pair`, the
``generate`` command)."""

MODEL_NAMES = ("target", "draft")
"""The models of the default pair."""


def default_model_dir(name: str) -> Path:
    """The directory of the shipped default ``"target"`` or ``"draft"`` model.

    Raises
    ------
    ValueError
        ``name`` is neither ``"target"`` nor ``"draft"``.
    FileNotFoundError
        The model directory (or its ``config.json``) is missing from this installation.

    Examples
    --------
    >>> default_model_dir("draft").relative_to(DEFAULT_DIR).as_posix()
    'draft'
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown default model {name!r}; expected 'target' or 'draft'")
    directory = DEFAULT_DIR / name
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"the default {name} model is not installed: {directory} has no config.json. "
            "Reinstall specsample with its package data (from the checkout: "
            "`pip install -e '.[hf]'`), or recreate the models there with "
            "`python scripts/train_default_models.py --out specsample/models/default "
            "--overwrite-shipped`."
        )
    return directory
