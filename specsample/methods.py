"""The one registry of verification methods and tree drafting modes: names and where they apply.

Every entry point that takes a ``method`` (:class:`specsample.RejectionSampler`,
:func:`specsample.verify`, the generation loop, the CLI, :mod:`specsample.testing.compare`)
checks it against :data:`METHODS` through :func:`check_method`, and every one that takes a
tree's ``drafting`` reads :data:`TREE_DRAFTINGS` (through :func:`tree_method` or
:func:`check_traversal_drafting`), so a name, the rule a drafting mode calls for and the
reason a rule is refused for it exist in one place only. The verification rules themselves
live in :mod:`specsample.rules`.

Examples
--------
>>> chain_methods()
('chain', 'block', 'gumbel')
>>> chain_methods(lossy=True)
('chain', 'block', 'gumbel', 'typical')
>>> METHODS["block"].needs_draft_probs
True
>>> tree_methods()
('mss', 'rrs', 'onehot', 'traversal')
>>> tree_methods(top_down=True)
('mss', 'rrs', 'onehot')
>>> tree_draftings(), tree_draftings("traversal")
(('iid', 'without_replacement', 'deterministic'), ('iid', 'without_replacement'))
>>> TREE_DRAFTINGS["deterministic"].rule, TREE_DRAFTINGS["deterministic"].exact
('onehot', ('onehot',))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

Drafting = Literal["iid", "without_replacement", "deterministic"]
"""How the children of a tree node were drafted (the keys of :data:`TREE_DRAFTINGS`)."""

TreeMethod = Literal["mss", "rrs", "onehot"]
"""The top-down tree rules, those :func:`specsample.rules.tree.tree_verify` runs."""

MAX_STEP_TREE_NODES = 64
"""Most drafted nodes of the tree one generation step drafts (the ``--tree`` budget).

The target scores every node in one forward, ``nodes + 1`` slots per sequence under a
``[slots, slots]`` tree attention mask, and the draft model runs one forward per level: the
bound keeps a step's cost near a chain step's. It is not :data:`MAX_SIMULATED_TREE_NODES`,
which bounds synthetic trees that no model scores."""

MAX_SIMULATED_TREE_NODES = 1024
"""Most drafted nodes of the synthetic trees :mod:`specsample.testing.compare` verifies,
``branching + branching**2 + ... + branching**k`` (with ``branching = 2``, ``k <= 9``; with
``branching = 1``, any ``k``).

No model runs there: the bound keeps the host loops of the rules over a tree's nodes (and the
``[rows, nodes, vocab]`` rows of a chunk) small, far above what a generation step drafts
(:data:`MAX_STEP_TREE_NODES`)."""


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
    top_down : bool
        For a tree method: whether it walks from the root, child after child
        (:func:`specsample.rules.tree.tree_verify`); traversal verification goes leaf to
        root and has its own entry point.
    keyed : bool
        Whether it reads keyed Gumbel noise (:mod:`specsample.noise`, row keys in its plan)
        instead of uniforms.
    """

    name: str
    drafts: Literal["chain", "tree"]
    exact: bool
    needs_draft_probs: bool
    summary: str
    top_down: bool = False
    keyed: bool = False


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("chain", "chain", True, False, "token-by-token rejection sampling"),
        Method("block", "chain", True, True, "block verification: whole-prefix acceptance"),
        Method(
            "gumbel",
            "chain",
            True,
            False,
            "keyed Gumbel-max: the target's own seeded sample, whatever the drafter",
            keyed=True,
        ),
        Method("typical", "chain", False, False, "typical acceptance (Medusa), LOSSY"),
        Method(
            "mss",
            "tree",
            True,
            True,
            "multi-step speculative sampling (with replacement)",
            top_down=True,
        ),
        Method(
            "rrs",
            "tree",
            True,
            True,
            "recursive rejection sampling (without replacement)",
            top_down=True,
        ),
        Method(
            "onehot", "tree", True, False, "one-hot drafts (deterministic children)", top_down=True
        ),
        Method(
            "traversal", "tree", True, True, "traversal verification: leaf to root, whole paths"
        ),
    )
}
"""Every verification method, by name."""


@dataclass(frozen=True)
class TreeDrafting:
    """How the children of a tree node were drafted, and which tree rules are exact for it.

    Attributes
    ----------
    name : str
        The ``drafting`` entry points accept.
    rule : str
        The top-down rule it calls for (the default of
        :func:`specsample.rules.tree.tree_verify`).
    summary : str
        How the children of a node are chosen.
    refused : tuple of (str, str)
        ``(method, reason)`` for each tree method that is biased (or cannot run) on such
        children; every other tree method is exact for it.
    """

    name: str
    rule: str
    summary: str
    refused: tuple[tuple[str, str], ...]

    @property
    def exact(self) -> tuple[str, ...]:
        """The tree methods that are exact for this drafting, in registry order."""
        refused = dict(self.refused)
        return tuple(m for m in tree_methods() if m not in refused)

    def reason(self, method: str) -> str | None:
        """Why ``method`` is refused for this drafting (``None``: it is not)."""
        return dict(self.refused).get(method)


_NOT_SAMPLES = (
    "treats each child as a sample from draft_probs, which deterministic children (top-k, "
    "n-gram, ...) are not; the output would be badly biased"
)

TREE_DRAFTINGS: dict[str, TreeDrafting] = {
    d.name: d
    for d in (
        TreeDrafting(
            "iid",
            "mss",
            "drawn independently, with replacement, from the draft distribution",
            (
                (
                    "rrs",
                    "RRS removes each rejected token from the draft distribution, which "
                    "describes children drawn without replacement; i.i.d. children can repeat "
                    "a token, so the output would be biased",
                ),
            ),
        ),
        TreeDrafting(
            "without_replacement",
            "rrs",
            "drawn from the draft distribution without replacement, in order",
            (
                (
                    "mss",
                    "MSS tests every child against the unchanged draft distribution, but a "
                    "child drawn without replacement follows the draft with its earlier "
                    "siblings removed, so the output would be biased; use the derived rule "
                    "'rrs'",
                ),
            ),
        ),
        TreeDrafting(
            "deterministic",
            "onehot",
            "chosen without the verifier's randomness (draft top-k, n-gram or suffix lookup)",
            (
                (
                    "mss",
                    f"MSS {_NOT_SAMPLES} (a total variation of 0.3 in the first token on small "
                    "examples); use the derived rule 'onehot'",
                ),
                ("rrs", f"RRS {_NOT_SAMPLES}; use the derived rule 'onehot'"),
                (
                    "traversal",
                    "traversal verification weighs every child by q(x) / p(x), as a sample "
                    "from draft_probs, which deterministic children (top-k, n-gram, ...) are "
                    "not: the output would be badly biased; verify them with "
                    "tree_verify(drafting='deterministic'), the one-hot rule",
                ),
            ),
        ),
    )
}
"""Every tree drafting mode, by name."""


def chain_methods(*, lossy: bool = False) -> tuple[str, ...]:
    """Names of the methods that verify a chain of drafts (exact ones only by default)."""
    return tuple(m.name for m in METHODS.values() if m.drafts == "chain" and (lossy or m.exact))


def tree_methods(*, top_down: bool = False) -> tuple[str, ...]:
    """Names of the methods that verify a token tree (with ``top_down``: the top-down ones)."""
    return tuple(
        m.name for m in METHODS.values() if m.drafts == "tree" and (m.top_down or not top_down)
    )


def tree_draftings(method: str | None = None) -> tuple[Drafting, ...]:
    """Names of the tree drafting modes (with ``method``: those it is exact for).

    Examples
    --------
    >>> tree_draftings("mss")
    ('iid',)
    """
    names = (d.name for d in TREE_DRAFTINGS.values() if method is None or method in d.exact)
    return tuple(cast(Drafting, name) for name in names)


def _drafting(drafting: object, method: str | None = None) -> TreeDrafting:
    """The registry entry of ``drafting``, refusing a non-string or an unknown name.

    The messages list the modes ``method`` is exact for (all of them for ``None``).
    """
    if isinstance(drafting, str) and drafting in TREE_DRAFTINGS:
        return TREE_DRAFTINGS[drafting]
    allowed = tree_draftings(method)
    if not isinstance(drafting, str):
        raise TypeError(f"drafting must be a str, one of {allowed}, got {type(drafting).__name__}")
    raise ValueError(f"drafting must be one of {allowed}, got {drafting!r}")


def check_drafting(drafting: object) -> Drafting:
    """``drafting`` if it names a tree drafting mode, else raise naming the argument.

    Examples
    --------
    >>> check_drafting("without_replacement")
    'without_replacement'
    """
    return cast(Drafting, _drafting(drafting).name)


def tree_method(drafting: str, method: str | None = None) -> TreeMethod:
    """The top-down verification rule for a drafting mode, refusing biased combinations.

    Parameters
    ----------
    drafting : str
        How the children were drafted: one of :func:`tree_draftings`.
    method : str, optional
        An explicit rule (one of ``tree_methods(top_down=True)``). It must be exact for
        ``drafting``: the derived rule, or ``"onehot"`` (exact for every drafting mode).

    Returns
    -------
    str
        The rule to run.

    Raises
    ------
    TypeError
        When ``drafting`` or ``method`` is not a string.
    ValueError
        For an unknown name, or a rule that is biased for ``drafting`` (the message says why).

    Examples
    --------
    >>> tree_method("iid"), tree_method("without_replacement"), tree_method("deterministic")
    ('mss', 'rrs', 'onehot')
    >>> tree_method("iid", "onehot")
    'onehot'
    >>> tree_method("deterministic", "mss")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: method='mss' is biased with drafting='deterministic': MSS treats each child ...
    """
    entry = _drafting(drafting)
    if method is None:
        return cast(TreeMethod, entry.rule)
    rules = tree_methods(top_down=True)
    if not isinstance(method, str):
        raise TypeError(
            f"method must be a str, one of {rules}, or None, got {type(method).__name__}"
        )
    if method in METHODS and METHODS[method].drafts == "tree" and method not in rules:
        raise ValueError(
            f"method={method!r} has its own entry point, traversal_verify (its uniforms are "
            f"laid out per node); tree_verify runs the top-down rules {rules}"
        )
    if method not in rules:
        raise ValueError(f"method must be one of {rules} or None, got {method!r}")
    reason = entry.reason(method)
    if reason is not None:
        raise ValueError(f"method={method!r} is biased with drafting={drafting!r}: {reason}")
    return cast(TreeMethod, method)


def check_traversal_drafting(drafting: object) -> Drafting:
    """``drafting`` if traversal verification is exact for it, else the reason it is not.

    Parameters
    ----------
    drafting : str
        How the children were drafted: one of :func:`tree_draftings`.

    Returns
    -------
    str
        ``drafting``, one of ``tree_draftings("traversal")``.

    Raises
    ------
    TypeError
        ``drafting`` is not a string.
    ValueError
        An unknown mode, or ``"deterministic"`` (the message says why).

    Examples
    --------
    >>> check_traversal_drafting("iid")
    'iid'
    >>> check_traversal_drafting("deterministic")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: drafting='deterministic' is refused: traversal verification weighs every ...
    """
    entry = _drafting(drafting, "traversal")
    reason = entry.reason("traversal")
    if reason is not None:
        raise ValueError(f"drafting={entry.name!r} is refused: {reason}")
    return cast(Drafting, entry.name)


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
