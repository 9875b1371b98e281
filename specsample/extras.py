"""How to install an optional part of specsample: an extra of its ``pyproject.toml``.

specsample is installed from its source checkout, not from a package index, so the command
that adds an extra is an install of the checkout itself; messages that name a missing
package quote :func:`install_command`. (``make demo`` also sets up ``.venv`` in the checkout
with every extra.)
"""

from __future__ import annotations

EXTRAS = ("hf", "plot", "triton", "cpu", "vllm", "vllm-cpu", "test", "dev")
"""The optional dependency groups of ``pyproject.toml``."""


def install_command(extra: str) -> str:
    """The command that installs ``extra`` from the checkout, to quote in a message.

    Parameters
    ----------
    extra : str
        One of :data:`EXTRAS`.

    Raises
    ------
    ValueError
        ``extra`` is not an extra of the project.

    Examples
    --------
    >>> install_command("hf")
    "pip install -e '.[hf]' (run in the specsample source checkout)"
    """
    if extra not in EXTRAS:
        raise ValueError(f"extra must be one of {EXTRAS}, got {extra!r}")
    return f"pip install -e '.[{extra}]' (run in the specsample source checkout)"
