"""Compare verification rules on the same drafts: mean tokens per verification step.

For a draft/target pair (a :class:`specsample.testing.Family`: rows that depend on the
position and on the previous token; the pair for a shorter ``k`` is the first ``k``
positions of the longest) and each draft length ``k``, one set of chains is
drafted and verified by every chain rule (token-by-token, block, typical acceptance); keyed
Gumbel-max verification (``"gumbel"``) verifies chains the draft proposes with its noise (each
draft the argmax of its row's log-probabilities plus the step's keyed noise), as a draft model
does in a ``method="gumbel"`` run; one
set of trees of i.i.d. children (``branching`` per node, ``k`` levels, drafted from the same
draft rows) is verified by the top-down rule for i.i.d. drafting (``"mss"``) and by
traversal verification (``"traversal"``, :func:`specsample.rules.tree.traversal_verify`).
The rule names are those of :mod:`specsample.methods`. The mean number of tokens emitted per
step is reported with a 95% confidence interval, next to its exact value where it is known
(:func:`specsample.testing.exact_values.exact_tokens_per_step`).

Typical acceptance is NOT exact: it is listed for its speed, not as an alternative that
preserves the target distribution.

:func:`compare_rules` computes the table, :func:`format_comparison` prints it and
:func:`plot_comparison` saves tokens per step against ``k`` as a PNG (matplotlib).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specsample.extras import install_command
from specsample.methods import (
    MAX_SIMULATED_TREE_NODES,
    METHODS,
    TREE_DRAFTINGS,
    Drafting,
    chain_methods,
    tree_method,
)
from specsample.noise import gumbel_noise
from specsample.params.checks import check_int
from specsample.params.seeding import seeding_from
from specsample.rules.block import block_verify
from specsample.rules.chain import chain_verify
from specsample.rules.tree import traversal_verify, tree_verify
from specsample.rules.typical import typical_acceptance
from specsample.testing.exact_values import exact_tokens_per_step
from specsample.testing.families import (
    EXTRA_FAMILIES,
    FAMILIES,
    Family,
    check_table_size,
    make_family,
)
from specsample.testing.simulation import derived_seed, draw_inputs

_TREE_DRAFTING: Drafting = "iid"

TREE_RULES = tuple(
    name for name in TREE_DRAFTINGS[_TREE_DRAFTING].exact if METHODS[name].needs_draft_probs
)
"""The rules run on the trees (the same trees for all): the tree methods of the registry that
are exact for i.i.d. children and use the draft rows, in its order."""

RULES = (
    *chain_methods(),
    *TREE_RULES,
    *(name for name in chain_methods(lossy=True) if not METHODS[name].exact),
)
"""Rules compared, in table order: the exact chain rules, the tree rules, the lossy ones."""

MAX_K = 64
"""Longest draft (deepest tree) :func:`compare_rules` takes."""

MAX_ROWS = 10**7
"""Most verification steps per family, ``k`` and rule."""

CHUNK_VALUES = 1 << 23
"""Probabilities per tensor verified at once: steps are simulated in chunks of
``min(CHUNK_ROWS, max(1, CHUNK_VALUES // (width * vocab)))`` rows (``width``: ``k + 1`` for
chains, the tree's nodes plus the root for the tree), so memory does not grow with ``rows``."""

CHUNK_ROWS = 1 << 16
"""Most steps simulated at once (their per-step temporaries are bounded too)."""


@dataclass(frozen=True)
class RuleResult:
    """Tokens per verification step of one rule at one draft length.

    Attributes
    ----------
    family, rule : str
        The toy pair and the rule (a name of :data:`specsample.methods.METHODS`).
    k : int
        Draft length (tree depth for the tree rule).
    drafted : int
        Draft tokens per step (nodes for the tree).
    mean, half_width : float
        Mean tokens emitted per step and the half-width of its 95% confidence interval.
    theory : float
        Exact expectation, ``nan`` where unknown.
    exact : bool
        Whether the rule preserves the target distribution.
    """

    family: str
    rule: str
    k: int
    drafted: int
    mean: float
    half_width: float
    theory: float
    exact: bool


class _Moments:
    """Count, sum and sum of squares of the tokens emitted per step, chunk after chunk."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.squares = 0.0

    def add(self, emitted: torch.Tensor) -> None:
        """Add the ``[rows]`` tokens emitted by ``rows`` steps."""
        values = emitted.to(torch.float64)
        self.count += values.numel()
        self.total += float(values.sum())
        self.squares += float((values * values).sum())

    def summary(self) -> tuple[float, float]:
        """The mean and the half-width of its 95% confidence interval."""
        count = max(self.count, 1)
        mean = self.total / count
        spread = 0.0
        if self.count > 1:
            spread = math.sqrt(max(self.squares - count * mean * mean, 0.0) / (count - 1))
        return mean, 1.96 * spread / math.sqrt(count)


def _chunks(rows: int, width: int, vocab: int, seed: int) -> list[tuple[int, int]]:
    """``(seed, rows)`` of each chunk of ``rows`` steps, a step being ``[width, vocab]``.

    Chunk 0 keeps ``seed`` (so a single chunk is the unchunked computation); the others get
    seeds of their own, derived from it.
    """
    size = min(CHUNK_ROWS, max(1, CHUNK_VALUES // (width * vocab)))
    return [
        (seed if index == 0 else derived_seed(seed, index), min(size, rows - begin))
        for index, begin in enumerate(range(0, rows, size))
    ]


def _tree_nodes(k: int, branching: int) -> int:
    """Drafted nodes of a full tree: ``branching + branching**2 + ... + branching**k``."""
    return sum(branching**depth for depth in range(1, k + 1))


def _tree_layout(k: int, branching: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``parents`` and ``depth`` ``[nodes + 1]`` int64 of the full tree, breadth first."""
    parents, depth = [torch.tensor([-1])], [torch.tensor([0])]
    count, width = 1, 1
    for level in range(1, k + 1):
        parents.append((count - width + torch.arange(width)).repeat_interleave(branching))
        count, width = count + width * branching, width * branching
        depth.append(torch.full((width,), level))
    return torch.cat(parents), torch.cat(depth)


def _tree_inputs(
    family: Family, rows: int, branching: int, generator: torch.Generator
) -> tuple[torch.Tensor, ...]:
    """An i.i.d. tree per row: ``branching`` children per node, ``k`` levels, breadth first."""
    vocab = family.vocab
    tokens = [torch.full((rows, 1), family.start)]
    for depth in range(family.k):
        rows_p = family.draft[depth, tokens[-1]].reshape(-1, vocab).to(torch.float64)
        drawn = torch.multinomial(rows_p, branching, replacement=True, generator=generator)
        tokens.append(drawn.view(rows, -1))
    node_tokens = torch.cat(tokens, dim=1)
    parents, depth_of = _tree_layout(family.k, branching)
    target = family.target[depth_of, node_tokens]
    draft = family.draft[depth_of.clamp(max=family.k - 1), node_tokens]
    return target, node_tokens, parents, draft


def _chain_rules(family: Family, rows: int, seed: int) -> dict[str, torch.Tensor]:
    """``[rows]`` tokens emitted per step by every chain rule, on one set of chains."""
    inputs = draw_inputs(family, rows, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    uniforms = torch.rand(rows, family.k + 1, dtype=torch.float64, generator=generator)
    args = (inputs.target_probs, inputs.draft_probs, inputs.draft_token_ids, inputs.bonus_token_ids)
    context = torch.cat([torch.full((rows, 1), family.start), inputs.draft_token_ids], dim=1)
    with_bonus = family.target[torch.arange(family.k + 1), context]
    return {
        "chain": chain_verify(*args, uniforms).num_accepted + 1,
        "block": block_verify(*args, uniforms).num_accepted + 1,
        "gumbel": _gumbel_chains(family, rows, seed),
        "typical": typical_acceptance(with_bonus, inputs.draft_token_ids).num_accepted + 1,
    }


def _gumbel_chains(family: Family, rows: int, seed: int) -> torch.Tensor:
    """``[rows]`` tokens emitted per step by keyed Gumbel-max verification of chains the draft
    proposes with the same noise (a fresh key per row and position)."""
    generator = torch.Generator().manual_seed(seed + 3)
    keys = torch.randint(0, 1 << 32, (rows, family.k), generator=generator)
    previous = torch.full((rows,), family.start)
    agreeing = torch.ones(rows, dtype=torch.bool)
    emitted = torch.ones(rows, dtype=torch.int64)
    for depth in range(family.k):
        noise = gumbel_noise(keys[:, depth], 0, family.vocab)
        draft = (family.draft[depth, previous].double().log() + noise).argmax(dim=-1)
        target = (family.target[depth, previous].double().log() + noise).argmax(dim=-1)
        agreeing &= draft == target
        emitted += agreeing.to(torch.int64)
        previous = draft
    return emitted


def _tree_rules(family: Family, rows: int, branching: int, seed: int) -> dict[str, torch.Tensor]:
    """``[rows]`` tokens emitted per step by every tree rule, on one set of trees."""
    generator = torch.Generator().manual_seed(seed + 2)
    target, tokens, parents, draft = _tree_inputs(family, rows, branching, generator)
    emitted = {}
    for rule in TREE_RULES:
        seeding = seeding_from(rows, target.device, generator=generator)
        if METHODS[rule].top_down:
            result = tree_verify(
                target,
                tokens,
                parents,
                drafting=_TREE_DRAFTING,
                draft_probs=draft,
                method=tree_method(_TREE_DRAFTING, rule),
                seeding=seeding,
            )
        else:
            result = traversal_verify(
                target,
                tokens,
                parents,
                drafting=_TREE_DRAFTING,
                draft_probs=draft,
                seeding=seeding,
            )
        emitted[rule] = result.num_emitted
    return emitted


def _family_results(family: Family, rows: int, branching: int, seed: int) -> list[RuleResult]:
    """One :class:`RuleResult` per rule of :data:`RULES` on ``family``, chunk by chunk."""
    moments = {rule: _Moments() for rule in RULES}
    for chunk_seed, size in _chunks(rows, family.k + 1, family.vocab, seed):
        for rule, emitted in _chain_rules(family, size, chunk_seed).items():
            moments[rule].add(emitted)
    nodes = _tree_nodes(family.k, branching)
    for chunk_seed, size in _chunks(rows, nodes + 1, family.vocab, seed):
        for rule, emitted in _tree_rules(family, size, branching, chunk_seed).items():
            moments[rule].add(emitted)
    results = []
    for rule in RULES:
        mean, half = moments[rule].summary()
        drafted = nodes if METHODS[rule].drafts == "tree" else family.k
        theory = exact_tokens_per_step(family, rule, branching)
        exact = METHODS[rule].exact
        results.append(RuleResult(family.name, rule, family.k, drafted, mean, half, theory, exact))
    return results


def _check_arguments(
    families: Sequence[str], ks: Sequence[int], rows: int, vocab: int, branching: int
) -> None:
    """Refuse every argument of :func:`compare_rules` out of its documented range."""
    if isinstance(families, str) or not families:
        raise TypeError(f"families must be a non-empty sequence of names, got {families!r}")
    for name in families:
        if name not in FAMILIES + EXTRA_FAMILIES:
            known = ", ".join(FAMILIES + EXTRA_FAMILIES)
            raise ValueError(f"families: {name!r} is unknown; choose from {known}")
    if isinstance(ks, (str, int)) or not ks:
        raise TypeError(f"ks must be a non-empty sequence of draft lengths, got {ks!r}")
    for k in ks:
        check_int("every k", k, 1, MAX_K)
    check_int("rows", rows, 2, MAX_ROWS)
    check_int("branching", branching, 1, MAX_SIMULATED_TREE_NODES)
    nodes = _tree_nodes(max(ks), branching)
    if nodes > MAX_SIMULATED_TREE_NODES:
        raise ValueError(
            f"branching={branching} with k={max(ks)} makes trees of {nodes} nodes, more than "
            f"MAX_SIMULATED_TREE_NODES = {MAX_SIMULATED_TREE_NODES}: lower branching or k"
        )
    check_int("vocab", vocab, 2)
    check_table_size(max(ks), vocab)


def compare_rules(
    families: Sequence[str] = ("random", "markov", "peaked"),
    ks: Sequence[int] = (1, 2, 3, 4, 5),
    *,
    rows: int = 20_000,
    vocab: int = 8,
    branching: int = 2,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[RuleResult]:
    """Mean tokens per verification step of every rule, per family and draft length.

    Parameters
    ----------
    families : sequence of str
        Names accepted by :func:`specsample.testing.make_family`.
    ks : sequence of int
        Draft lengths (tree depths), each in ``[1, MAX_K]`` (64).
    rows : int
        Verification steps simulated per family, ``k`` and rule, in ``[2, MAX_ROWS]``
        (``10**7``). They run in chunks (see :data:`CHUNK_VALUES`), so memory does not grow
        with ``rows``.
    vocab : int
        Vocabulary of the toy families, ``>= 2`` with ``(max(ks) + 1) * vocab**2 <=``
        :data:`specsample.testing.MAX_TABLE_ENTRIES` (``vocab <= 836`` at ``k = 5``).
    branching : int
        Children per tree node (the tree has ``branching ** d`` nodes at depth ``d``), with
        at most :data:`specsample.methods.MAX_SIMULATED_TREE_NODES` (1024) drafted nodes at
        ``max(ks)``.
    seed : int
        Seeds the families, drafts and verifiers.
    on_progress : callable, optional
        ``on_progress(done, total)`` after each family and draft length, ``total`` being
        ``len(families) * len(ks)``.

    Returns
    -------
    list of RuleResult
        One per family, draft length and rule of :data:`RULES`, in that order.

    Raises
    ------
    TypeError
        ``families`` or ``ks`` is not a non-empty sequence, or a size is not an int.
    ValueError
        A size is out of the range above (the message names it), or a family name is
        unknown.

    Examples
    --------
    >>> rows = compare_rules(["random"], [2], rows=500)
    >>> [r.rule for r in rows], rows[0].drafted, rows[3].drafted
    (['chain', 'block', 'gumbel', 'mss', 'traversal', 'typical'], 2, 6)
    """
    _check_arguments(families, ks, rows, vocab, branching)
    results: list[RuleResult] = []
    for name in families:
        largest = make_family(name, k=max(ks), vocab=vocab, seed=seed)
        for k in ks:
            family = Family(name, largest.target[: k + 1], largest.draft[:k], largest.start)
            results += _family_results(family, rows, branching, seed)
            if on_progress is not None:
                on_progress(len(results) // len(RULES), len(families) * len(ks))
    return results


def format_comparison(results: Sequence[RuleResult]) -> str:
    """A plain-text table of :func:`compare_rules` results."""
    lines = [
        "Mean tokens per verification step (95% CI), the same chains for every chain rule "
        "and the same trees for every tree rule",
        f"{'family':<8} {'k':>2} {'rule':<9} {'drafted':>7} {'tokens/step':>18} {'exact value':>12}"
        "  note",
        "-" * 73,
    ]
    for r in results:
        theory = "-" if math.isnan(r.theory) else f"{r.theory:.4f}"
        note = "" if r.exact else "NOT exact (lossy)"
        lines.append(
            f"{r.family:<8} {r.k:>2} {r.rule:<9} {r.drafted:>7} "
            f"{r.mean:>9.4f} +- {r.half_width:<6.4f} {theory:>12}  {note}"
        )
    return "\n".join(lines)


def plot_comparison(results: Sequence[RuleResult], path: str | Path) -> Path:
    """Save tokens per step against ``k``, one panel per family, as a PNG.

    Raises
    ------
    RuntimeError
        matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError(f"plotting needs matplotlib: {install_command('plot')}") from error
    families = list(dict.fromkeys(r.family for r in results))
    figure, axes = plt.subplots(1, len(families), figsize=(4.5 * len(families), 3.8), squeeze=False)
    for axis, family in zip(axes[0], families, strict=True):
        for rule in RULES:
            points = [r for r in results if r.family == family and r.rule == rule]
            if not points:
                continue
            exact = METHODS[rule].exact
            label = rule if exact else f"{rule} (lossy)"
            axis.errorbar(
                [r.k for r in points],
                [r.mean for r in points],
                yerr=[r.half_width for r in points],
                marker="o",
                capsize=3,
                label=label,
                linestyle="--" if not exact else "-",
            )
        axis.set_title(family)
        axis.set_xticks(sorted({r.k for r in results}))
        axis.set_xlabel("k (draft length / tree depth)")
        axis.set_ylabel("tokens per verification step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
