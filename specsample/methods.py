"""The one registry of verification methods: what each name means and where it applies.

Every entry point that takes a ``method`` (:class:`specsample.RejectionSampler`,
:func:`specsample.verify`, the generation loop, the CLI, :mod:`specsample.compare`) checks it
against :data:`METHODS` through :func:`check_method`, so a name exists in one place only.

Examples
--------
>>> chain_methods()
('chain', 'block')
>>> chain_methods(lossy=True)
('chain', 'block', 'typical')
>>> METHODS["block"].needs_draft_probs
True
>>> tree_methods()
('mss', 'rrs', 'onehot', 'traversal')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Method:
    """One verification method.

    Attributes
    ----------
    name : str
        The name entry points accept.
    drafts : {"chain", "tree"}
        The shape of the drafts it verifies.
    exact : bool
        Whether the emitted tokens follow the target distribution exactly.
    needs_draft_probs : bool
        Whether it needs the draft distributions (one-hot drafts are not enough).
    summary : str
        One line for help texts and tables.
    """

    name: str
    drafts: Literal["chain", "tree"]
    exact: bool
    needs_draft_probs: bool
    summary: str


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("chain", "chain", True, False, "token-by-token rejection sampling"),
        Method("block", "chain", True, True, "block verification: whole-prefix acceptance"),
        Method("typical", "chain", False, False, "typical acceptance (Medusa), LOSSY"),
        Method("mss", "tree", True, True, "multi-step speculative sampling (with replacement)"),
        Method("rrs", "tree", True, True, "recursive rejection sampling (without replacement)"),
        Method("onehot", "tree", True, False, "one-hot drafts (deterministic children)"),
        Method(
            "traversal", "tree", True, True, "traversal verification: leaf to root, whole paths"
        ),
    )
}
"""Every verification method, by name."""


def chain_methods(*, lossy: bool = False) -> tuple[str, ...]:
    """Names of the methods that verify a chain of drafts (exact ones only by default)."""
    return tuple(m.name for m in METHODS.values() if m.drafts == "chain" and (lossy or m.exact))


def tree_methods() -> tuple[str, ...]:
    """Names of the methods that verify a token tree."""
    return tuple(m.name for m in METHODS.values() if m.drafts == "tree")


def check_method(method: object, allowed: tuple[str, ...], name: str = "method") -> str:
    """Return ``method`` if it is one of ``allowed``, else raise naming the argument.

    Raises
    ------
    TypeError
        When ``method`` is not a string.
    ValueError
        When it names no method, or one that does not apply here.

    Examples
    --------
    >>> check_method("block", chain_methods())
    'block'
    """
    if not isinstance(method, str):
        raise TypeError(f"{name} must be a str, one of {allowed}, got {type(method).__name__}")
    if method not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {method!r}")
    return method
