"""Tree verification: exact enumeration, sampling tests, refusals and the greedy walk.

Covers the top-down tree rules: :mod:`specsample.rules.tree` (:mod:`~specsample.rules.tree.verify`,
:mod:`~specsample.rules.tree.structure`, :mod:`~specsample.rules.tree.uniforms`).

The toy models are context-dependent: the target row ``q(. | path)`` and the draft row
``p(. | path)`` are seeded Dirichlet(0.5) rows keyed by the whole path of tokens from the root
(so every node of every tree reads its own rows, and reading the row of the wrong node, of
the parent, or of the wrong depth changes the answer). Three families: "dirichlet" (target
and draft independent, low acceptance), "close" (draft row ``0.7 q + 0.3 r`` with ``r`` another
Dirichlet row: high acceptance, small residuals), and "sparse" (as "dirichlet", with one
entry of each target row and another of each draft row set to zero).

Exactness criterion. A step emits a sequence ``s`` (accepted tokens, then one more); the
decoding loop then continues from ``s`` with the target. The step is exact iff, for every
sequence ``t`` of length ``m = max_depth + 1`` (the longest possible emission),
``sum_{s prefix of t} P(emit s) q(t[len(s):] | s) = Q(t)``, the target's own joint law of ``t``.
The enumeration tests compute the left-hand side exactly (every draft tree with its
probability, every accept/reject branch with its probability) in float64 for a reference
implementation of each rule written here, and compare it with ``Q`` (max abs error < 1e-9).
The library's vectorised implementation is tied to that reference in two ways: on injected
uniforms it must take exactly the same decisions, tree after tree; and sampled on 120_000
trees, the same stream statistic (the emitted tokens, continued with target draws up to
``m`` tokens) must pass chi-square tests against ``Q``.

False failures and power: every sampling test fails a correct rule with probability at most
``ALPHA = 1e-4`` (two chi-square tests at 5e-5 each) and detects, with probability >= 99%, a
deviation of TV >= 0.0119 in the first-two-token law or >= 0.0147 in the three-token law
(asserted); the sampled mean tokens per step allows 5 standard errors (false failure < 1e-6).
"""

from __future__ import annotations

import inspect
import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from specsample.methods import Drafting, TreeMethod, tree_draftings, tree_method, tree_methods
from specsample.params.seeding import Seeding, seeding_from
from specsample.random import Stream, counter_uniform
from specsample.rules.tree import (
    TREE_STRIDE,
    TreeVerifyResult,
    traversal_verify,
    tree_bounds,
    tree_uniforms,
    tree_verify,
    tree_verify_greedy,
)
from specsample.rules.tree.verify import _verify
from specsample.testing import chi2_sf, detectable_tv

VOCAB = 4
EXACT_TOL = 1e-9
ALPHA = 1e-4
"""Per-test false-failure rate of every sampling test (split over its chi-square tests)."""
ROWS = 120_000

FAMILIES = ("dirichlet", "close", "sparse")

SHAPES: dict[str, list[int]] = {
    "binary": [-1, 0, 0, 1, 1, 2, 2],
    "chain": [-1, 0, 1, 2],
    "ragged": [-1, 0, 1, 0, -1, 1, 3],
    "wide": [-1, 0, 0, 0, 2],
}
"""Tree topologies (parent of each node). ``ragged`` is not in breadth-first order and has a
padding node (4); ``wide`` has three children at the root."""

RULE_OF = {"iid": "mss", "without_replacement": "rrs", "deterministic": "onehot"}

Row = list[float]
Law = dict[tuple[int, ...], float]


# --------------------------------------------------------------------------------------
# Toy models
# --------------------------------------------------------------------------------------


@dataclass
class Toy:
    """Target and draft rows keyed by the path from the root (float64, cached)."""

    vocab: int = VOCAB
    seed: int = 0
    family: str = "dirichlet"
    _rows: dict[tuple[int, tuple[int, ...]], Row] = field(default_factory=dict)

    def _row(self, kind: int, path: tuple[int, ...]) -> Row:
        key = (kind, path)
        if key not in self._rows:
            rng = np.random.default_rng([self.seed, kind, len(path), *path])
            row = rng.dirichlet([0.5] * self.vocab)
            if self.family == "sparse":
                row[(kind + sum(path) + 3 * len(path)) % self.vocab] = 0.0
            if self.family == "close" and kind == 2:
                row = 0.7 * np.array(self.target(path)) + 0.3 * row
            self._rows[key] = [float(v) for v in row / row.sum()]
        return self._rows[key]

    def target(self, path: tuple[int, ...]) -> Row:
        return self._row(1, path)

    def draft(self, path: tuple[int, ...]) -> Row:
        return self._row(2, path)

    def joint(self, length: int) -> Law:
        """The target's joint law of the first ``length`` tokens."""
        law: Law = {(): 1.0}
        for _ in range(length):
            law = {(*s, y): w * qy for s, w in law.items() for y, qy in enumerate(self.target(s))}
        return law

    def continue_to(self, emitted: Law, length: int) -> Law:
        """Extend each emitted sequence with target draws up to ``length`` tokens."""
        out: Law = defaultdict(float)
        stack = list(emitted.items())
        while stack:
            s, w = stack.pop()
            if len(s) == length:
                out[s] += w
                continue
            for y, qy in enumerate(self.target(s)):
                if qy > 0.0:
                    stack.append(((*s, y), w * qy))
        return dict(out)

    def tables(self, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Target and draft rows of every path of length <= depth, indexed by path code."""
        paths = [
            p for n in range(depth + 1) for p in itertools.product(range(self.vocab), repeat=n)
        ]
        target = torch.tensor([self.target(p) for p in paths], dtype=torch.float64)
        draft = torch.tensor([self.draft(p) for p in paths], dtype=torch.float64)
        return target, draft


def _offset(vocab: int, length: int) -> int:
    return sum(vocab**n for n in range(length))


def _child_code(code: torch.Tensor, length: int, token: torch.Tensor, vocab: int) -> torch.Tensor:
    """Code of ``path + (token,)`` from the code of a path of ``length`` tokens."""
    return _offset(vocab, length + 1) + (code - _offset(vocab, length)) * vocab + token


# --------------------------------------------------------------------------------------
# Trees and their drafting
# --------------------------------------------------------------------------------------


def _children(parents: Sequence[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, parent in enumerate(parents):
        if i >= 1 and 0 <= parent < i:
            kids[parent].append(i)
    return kids


def _depths(parents: Sequence[int]) -> list[int]:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1 if parents[i] >= 0 else 0
    return depth


@dataclass
class Tree:
    parents: list[int]
    tokens: list[int]

    def context(self, node: int) -> tuple[int, ...]:
        path: list[int] = []
        while node > 0:
            path.append(self.tokens[node])
            node = self.parents[node]
        return tuple(reversed(path))


def _draft_trees(toy: Toy, parents: list[int], drafting: str) -> list[tuple[Tree, float]]:
    """Every draft tree with its probability under ``drafting``."""
    kids = _children(parents)
    n = len(parents)
    out: list[tuple[Tree, float]] = []

    def assign(i: int, tokens: list[int], weight: float) -> None:
        if i == n:
            out.append((Tree(parents, list(tokens)), weight))
            return
        parent = parents[i]
        if i == 0 or parent < 0:
            tokens.append(-1)
            assign(i + 1, tokens, weight)
            tokens.pop()
            return
        p = toy.draft(Tree(parents, tokens).context(parent))
        rank = kids[parent].index(i)
        earlier = [tokens[c] for c in kids[parent][:rank]]
        if drafting == "deterministic":
            order = sorted(range(toy.vocab), key=lambda x: (-p[x], x))
            choices = [(order[rank], 1.0)]
        elif drafting == "iid":
            choices = [(x, p[x]) for x in range(toy.vocab)]
        else:
            left = 1.0 - sum(p[x] for x in earlier)
            choices = [(x, p[x] / left) for x in range(toy.vocab) if x not in earlier]
        for x, w in choices:
            if w > 0.0:
                tokens.append(x)
                assign(i + 1, tokens, weight * w)
                tokens.pop()

    assign(0, [], 1.0)
    return out


# --------------------------------------------------------------------------------------
# Reference rules (float64, written for enumeration)
# --------------------------------------------------------------------------------------


def _normalise(row: Row, fallback: Row) -> Row:
    total = sum(row)
    return [v / total for v in row] if total > 0.0 else list(fallback)


def _accept_probability(rule: str, qx: float, px: float) -> float:
    """``P(u * p < q)`` for ``u ~ U[0, 1)`` (``p = 1`` for the one-hot rule)."""
    if rule == "onehot":
        return min(1.0, qx)
    if px > 0.0:
        return min(1.0, qx / px)
    return 1.0 if qx > 0.0 else 0.0


def _update(rule: str, q: Row, p: Row, x: int) -> tuple[Row, Row]:
    """Target and draft rows after rejecting ``x``."""
    if rule == "onehot":
        return _normalise([0.0 if y == x else v for y, v in enumerate(q)], q), p
    residual = _normalise([max(a - b, 0.0) for a, b in zip(q, p, strict=True)], q)
    if rule == "rrs":
        p = _normalise([0.0 if y == x else v for y, v in enumerate(p)], [0.0] * len(p))
    return residual, p


def _emitted_law(toy: Toy, tree: Tree, rule: str, node: int = 0) -> Law:
    """Exact law of what a step emits from ``node`` on (accepted tokens, then one more)."""
    context = tree.context(node)
    q, p = toy.target(context), toy.draft(context)
    law: Law = defaultdict(float)
    reach = 1.0
    for child in _children(tree.parents)[node]:
        x = tree.tokens[child]
        accept = _accept_probability(rule, q[x], p[x])
        if accept > 0.0:
            for s, w in _emitted_law(toy, tree, rule, child).items():
                key = (x, *s)
                law[key] += reach * accept * w
        reach *= 1.0 - accept
        q, p = _update(rule, q, p, x)
    for y, qy in enumerate(q):
        law[(y,)] += reach * qy
    return law


def _step_law(toy: Toy, shape: str, drafting: str, rule: str) -> Law:
    """Exact law of the emitted stream continued to ``max_depth + 1`` tokens."""
    parents = SHAPES[shape]
    emitted: Law = defaultdict(float)
    for tree, weight in _draft_trees(toy, parents, drafting):
        for s, w in _emitted_law(toy, tree, rule).items():
            emitted[s] += weight * w
    return toy.continue_to(emitted, max(_depths(parents)) + 1)


def _max_error(law: Law, target: Law) -> float:
    keys = set(law) | set(target)
    return max(abs(law.get(k, 0.0) - target.get(k, 0.0)) for k in keys)


def _tv(law: Law, target: Law) -> float:
    keys = set(law) | set(target)
    return 0.5 * sum(abs(law.get(k, 0.0) - target.get(k, 0.0)) for k in keys)


def _expected_emitted(toy: Toy, shape: str, drafting: str, rule: str) -> float:
    total = 0.0
    for tree, weight in _draft_trees(toy, SHAPES[shape], drafting):
        total += weight * sum(len(s) * w for s, w in _emitted_law(toy, tree, rule).items())
    return total


# --------------------------------------------------------------------------------------
# Enumeration: every exact combination is exact, every refused one is biased
# --------------------------------------------------------------------------------------

EXACT_CASES = [
    (drafting, rule)
    for drafting in tree_draftings()
    for rule in tree_methods(top_down=True)
    if (drafting, rule) in {*RULE_OF.items(), ("iid", "onehot"), ("without_replacement", "onehot")}
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("drafting", "rule"), EXACT_CASES)
def test_enumeration_is_exact(drafting: str, rule: str, shape: str, family: str) -> None:
    """Stream law of every allowed (drafting, rule) pair equals the target's, to 1e-9."""
    toy = Toy(seed=11, family=family)
    law = _step_law(toy, shape, drafting, rule)
    m = max(_depths(SHAPES[shape])) + 1
    assert abs(sum(law.values()) - 1.0) < EXACT_TOL
    assert _max_error(law, toy.joint(m)) < EXACT_TOL
    assert tree_method(drafting, rule) == rule


BIASED_TV = {
    ("iid", "rrs"): 1e-3,
    ("without_replacement", "mss"): 1e-4,
    ("deterministic", "mss"): 0.05,
    ("deterministic", "rrs"): 0.05,
}
"""Lower bounds on the stream TV of each refused pair on the binary toy (seed 11)."""


@pytest.mark.parametrize(("drafting", "rule"), list(BIASED_TV))
def test_refused_pairs_are_biased(drafting: str, rule: str) -> None:
    """Each pair the API refuses is biased on the toy, and the API refuses exactly these."""
    toy = Toy(seed=11)
    tv = _tv(_step_law(toy, "binary", drafting, rule), toy.joint(3))
    assert tv > BIASED_TV[(drafting, rule)]
    with pytest.raises(ValueError, match="biased"):
        tree_method(drafting, rule)


def test_refusal_table_is_complete() -> None:
    pairs = {(d, m) for d in tree_draftings() for m in tree_methods(top_down=True)}
    refused = {(d, m) for d, m in pairs if not _allowed(d, m)}
    assert refused == set(BIASED_TV)
    assert pairs - refused == set(EXACT_CASES)


def _allowed(drafting: str, method: str) -> bool:
    try:
        tree_method(drafting, method)
    except ValueError:
        return False
    return True


def test_mss_on_top_k_children_is_badly_biased() -> None:
    """The case that motivates ``drafting``: MSS on deterministic top-2 children.

    On a single node with two top-k children (the first emitted token only) the TV is large,
    and the biased rule emits the draft's favourites too often.
    """
    toy = Toy(seed=11)
    first: dict[str, Law] = {}
    for rule in ("mss", "onehot"):
        law = _step_law(toy, "binary", "deterministic", rule)
        marginal: Law = defaultdict(float)
        for s, w in law.items():
            marginal[s[:1]] += w
        first[rule] = dict(marginal)
    target: Law = {(y,): v for y, v in enumerate(toy.target(()))}
    assert _max_error(first["onehot"], target) < EXACT_TOL
    assert _tv(first["mss"], target) > 0.05


def test_acceptance_order_of_rules() -> None:
    """Exact expected tokens per step: MSS and RRS beat one-hot on sampled children."""
    toy = Toy(seed=11, family="close")
    mss = _expected_emitted(toy, "binary", "iid", "mss")
    rrs = _expected_emitted(toy, "binary", "without_replacement", "rrs")
    onehot_iid = _expected_emitted(toy, "binary", "iid", "onehot")
    top_k = _expected_emitted(toy, "binary", "deterministic", "onehot")
    assert 1.0 < onehot_iid < mss <= 3.0
    assert 1.0 < rrs <= 3.0 and 1.0 < top_k <= 3.0


# --------------------------------------------------------------------------------------
# The vectorised implementation against the reference
# --------------------------------------------------------------------------------------


def _draw_trees(
    toy: Toy, shape: str, drafting: str, rows: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rows`` trees drafted from the toy: codes, tokens, target and draft rows."""
    parents = SHAPES[shape]
    depth = _depths(parents)
    vocab = toy.vocab
    target_tab, draft_tab = toy.tables(max(depth))
    codes = torch.zeros(rows, len(parents), dtype=torch.int64)
    tokens = torch.full((rows, len(parents)), -1, dtype=torch.int64)
    for node, kids in _children(parents).items():
        if not kids:
            continue
        p = draft_tab[codes[:, node]]
        k = len(kids)
        if drafting == "iid":
            u = torch.rand(rows, k, 1, dtype=torch.float64, generator=generator)
            cum = p.cumsum(-1).unsqueeze(1)
            picked = (cum <= u * cum[..., -1:]).sum(-1).clamp(max=vocab - 1)
        elif drafting == "without_replacement":
            gumbel = -torch.log(-torch.log(torch.rand(rows, vocab, generator=generator).double()))
            picked = (p.log() + gumbel).topk(k, dim=-1).indices
        else:
            picked = p.topk(k, dim=-1).indices
        for j, child in enumerate(kids):
            tokens[:, child] = picked[:, j]
            codes[:, child] = _child_code(codes[:, node], depth[node], picked[:, j], vocab)
    return codes, tokens, target_tab[codes], draft_tab[codes]


def _reference_run(
    toy: Toy, tree: Tree, rule: str, u: list[float], max_depth: int, max_children: int
) -> tuple[list[int], list[int]]:
    """The rule driven by the same uniforms as the library: (path, emitted tokens).

    Child ``j`` of the node reached at depth ``level`` reads uniform ``level * max_children + j``;
    a child with an out-of-vocabulary token is skipped (its uniform unused).
    """
    kids = _children(tree.parents)
    node, path, emitted = 0, [0], []
    q, p = toy.target(()), toy.draft(())
    for level in range(max_depth):
        nxt = None
        for j, child in enumerate(kids[node][:max_children]):
            x = tree.tokens[child]
            if not 0 <= x < toy.vocab:
                continue
            test = u[level * max_children + j]
            passed = test < q[x] if rule == "onehot" else test * p[x] < q[x]
            if passed:
                nxt = child
                break
            q, p = _update(rule, q, p, x)
        if nxt is None:
            break
        node = nxt
        path.append(node)
        emitted.append(tree.tokens[node])
        q, p = toy.target(tree.context(node)), toy.draft(tree.context(node))
    cum = np.cumsum(q)
    x = u[max_depth * max_children] * cum[-1]
    last_positive = int(np.searchsorted(cum, cum[-1], side="left"))
    emitted.append(min(int(np.searchsorted(cum, x, side="right")), last_positive))
    return path, emitted


def _padded(values: list[int], width: int) -> list[int]:
    return values + [-1] * (width - len(values))


@pytest.mark.parametrize(
    ("shape", "drafting", "method", "corrupt"),
    [
        ("binary", "iid", None, False),
        ("binary", "without_replacement", None, False),
        ("binary", "deterministic", None, False),
        ("ragged", "iid", "onehot", False),
        ("wide", "without_replacement", None, False),
        ("chain", "iid", None, False),
        ("binary", "iid", None, True),
        ("ragged", "deterministic", None, True),
    ],
)
def test_matches_reference_on_injected_uniforms(
    shape: str, drafting: Drafting, method: TreeMethod | None, corrupt: bool
) -> None:
    """Same uniforms, same decisions: 2000 sparse-toy trees, no disagreement allowed.

    With ``corrupt``, one node in ten gets an out-of-vocabulary token (-1 or ``VOCAB``).
    """
    toy = Toy(seed=5, family="sparse")
    g = torch.Generator().manual_seed(3)
    rows = 2000
    parents = torch.tensor(SHAPES[shape])
    depth, width = tree_bounds(parents)
    _, tokens, target, draft = _draw_trees(toy, shape, drafting, rows, g)
    if corrupt:
        hit = torch.rand(tokens.shape, generator=g) < 0.1
        bad = torch.where(torch.rand(tokens.shape, generator=g) < 0.5, -1, VOCAB)
        tokens = torch.where(hit, bad, tokens)
    u = torch.rand(rows, depth * width + 1, dtype=torch.float64, generator=g)
    out = tree_verify(
        target, tokens, parents, drafting=drafting, draft_probs=draft, method=method, uniforms=u
    )
    rule = tree_method(drafting, method)
    for b in range(rows):
        tree = Tree(SHAPES[shape], tokens[b].tolist())
        path, emitted = _reference_run(toy, tree, rule, u[b].tolist(), depth, width)
        assert out.path[b].tolist() == _padded(path, depth + 1), b
        assert out.token_ids[b].tolist() == _padded(emitted, depth + 1), b
        assert int(out.num_emitted[b]) == len(emitted)


def _stream_cells(
    toy: Toy, out: TreeVerifyResult, length: int, generator: torch.Generator
) -> torch.Tensor:
    """Cell ``sum_n t_n V^(length-1-n)`` of each row's stream continued to ``length`` tokens."""
    vocab = toy.vocab
    target_tab, _ = toy.tables(length - 1)
    rows = out.token_ids.shape[0]
    code = torch.zeros(rows, dtype=torch.int64)
    cell = torch.zeros(rows, dtype=torch.int64)
    for n in range(length):
        q = target_tab[code]
        u = torch.rand(rows, 1, dtype=torch.float64, generator=generator)
        cum = q.cumsum(-1)
        drawn = (cum <= u * cum[:, -1:]).sum(-1).clamp(max=vocab - 1)
        emitted = out.token_ids[:, n] if n < out.token_ids.shape[1] else drawn
        token = torch.where(out.num_emitted > n, emitted, drawn)
        cell = cell * vocab + token
        if n + 1 < length:
            code = _child_code(code, n, token, vocab)
    return cell


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """p-value and df of a chi-square test; cells expected below 5 are pooled into one."""
    n = counts.sum()
    expected = probs * n
    if np.any((probs == 0) & (counts > 0)):
        return 0.0, 1
    small = expected < 5.0
    obs = list(counts[~small]) + ([counts[small].sum()] if small.any() else [])
    exp = list(expected[~small]) + ([expected[small].sum()] if small.any() else [])
    obs_a, exp_a = np.array(obs, dtype=float), np.array(exp, dtype=float)
    keep = exp_a > 0
    statistic = float(((obs_a[keep] - exp_a[keep]) ** 2 / exp_a[keep]).sum())
    df = int(keep.sum()) - 1
    return chi2_sf(statistic, df), df


def _joint_array(toy: Toy, length: int) -> np.ndarray:
    law = toy.joint(length)
    return np.array([law[t] for t in itertools.product(range(toy.vocab), repeat=length)])


SAMPLING_CASES = [
    ("binary", "iid", None, "close"),
    ("binary", "without_replacement", None, "close"),
    ("binary", "deterministic", None, "close"),
    ("binary", "deterministic", None, "dirichlet"),
    ("ragged", "iid", None, "sparse"),
    ("wide", "without_replacement", None, "sparse"),
    ("chain", "iid", None, "close"),
    ("binary", "iid", "onehot", "dirichlet"),
]


@pytest.mark.parametrize(("shape", "drafting", "method", "family"), SAMPLING_CASES)
def test_sampling_matches_target(
    shape: str, drafting: Drafting, method: TreeMethod | None, family: str
) -> None:
    """120_000 trees through the real implementation; stream law vs the target's joint.

    Two chi-square tests, each at level ``ALPHA / 2 = 5e-5`` (so the false-failure rate of the
    test is <= 1e-4): the first two stream tokens (16 cells, df <= 15) and the whole stream of
    ``m = max_depth + 1`` tokens (64 or 256 cells). With 120_000 rows and df 15 a deviation of
    TV >= 0.0119 in the first-two-token law is detected with probability >= 99%; with df 63,
    TV >= 0.0147 in the three-token law (the test asserts these bounds).
    """
    toy = Toy(seed=23, family=family)
    g = torch.Generator().manual_seed(100 + len(shape) + len(drafting))
    _, tokens, target, draft = _draw_trees(toy, shape, drafting, ROWS, g)
    parents = torch.tensor(SHAPES[shape])
    out = tree_verify(
        target.float(),
        tokens,
        parents,
        drafting=drafting,
        draft_probs=draft.float(),
        method=method,
        seeding=seeding_from(ROWS, torch.device("cpu"), generator=g),
    )
    assert_stream_follows_target(toy, out, shape, g)


def assert_stream_follows_target(
    toy: Toy, out: TreeVerifyResult, shape: str, g: torch.Generator
) -> int:
    """The two chi-square tests of a sampled tree run (see the test above); returns ``m``."""
    m = max(_depths(SHAPES[shape])) + 1
    cells = _stream_cells(toy, out, m, g).numpy()
    full = np.bincount(cells, minlength=VOCAB**m)
    pairs = full.reshape(VOCAB, VOCAB, -1).sum(-1).reshape(-1)
    joint = _joint_array(toy, m)
    pair_law = joint.reshape(VOCAB, VOCAB, -1).sum(-1).reshape(-1)
    p_pairs, df_pairs = _chi_square(pairs, pair_law)
    p_full, df_full = _chi_square(full, joint)
    assert p_pairs >= ALPHA / 2, (p_pairs, df_pairs)
    assert p_full >= ALPHA / 2, (p_full, df_full)
    assert detectable_tv(ROWS, df_pairs, ALPHA / 2) <= 0.0119
    if m == 3:
        assert detectable_tv(ROWS, df_full, ALPHA / 2) <= 0.0147
    return m


def test_unchecked_mss_on_top_k_children_fails_sampling() -> None:
    """The internal, unchecked path run with MSS on top-2 children: the bias is real.

    20_000 trees on the toy of :func:`test_mss_on_top_k_children_is_badly_biased`; the
    first emitted token's chi-square p-value against the target is below 1e-12, while the
    derived one-hot rule on the same trees passes at level 1e-4.
    """
    toy = Toy(seed=11)
    rows = 20_000
    g = torch.Generator().manual_seed(4)
    _, tokens, target, draft = _draw_trees(toy, "binary", "deterministic", rows, g)
    parents = torch.tensor(SHAPES["binary"]).unsqueeze(0)
    u = torch.rand(rows, 5, dtype=torch.float64, generator=g)
    root = np.array(toy.target(()))
    p_values = {}
    for rule in ("mss", "onehot"):
        out = _verify(target, tokens, parents, draft, rule, 2, 2, u)
        counts = np.bincount(out.token_ids[:, 0].numpy(), minlength=VOCAB)
        p_values[rule] = _chi_square(counts, root)[0]
    assert p_values["mss"] < 1e-12
    assert p_values["onehot"] >= ALPHA


def test_sampled_acceptance_matches_enumeration() -> None:
    """Mean tokens per step of the real implementation vs the exact value, per rule.

    The mean of ``num_emitted`` (values 1..3, variance <= 1) over 120_000 trees has standard
    error <= 0.0029; the bound 0.015 is above 5 of those (false failure < 1e-6 per rule).
    """
    toy = Toy(seed=23, family="close")
    parents = torch.tensor(SHAPES["binary"])
    g = torch.Generator().manual_seed(9)
    for drafting in tree_draftings():
        _, tokens, target, draft = _draw_trees(toy, "binary", drafting, ROWS, g)
        out = tree_verify(target, tokens, parents, drafting=drafting, draft_probs=draft)
        exact = _expected_emitted(toy, "binary", drafting, RULE_OF[drafting])
        assert abs(float(out.num_emitted.double().mean()) - exact) < 0.015, drafting


# --------------------------------------------------------------------------------------
# Greedy
# --------------------------------------------------------------------------------------


def test_greedy_follows_the_argmax_path() -> None:
    toy = Toy(seed=4)
    g = torch.Generator().manual_seed(2)
    parents = torch.tensor(SHAPES["binary"])
    _, tokens, target, _ = _draw_trees(toy, "binary", "iid", 3000, g)
    out = tree_verify_greedy(target, tokens, parents)
    kids = _children(SHAPES["binary"])
    for b in range(3000):
        node, path, emitted = 0, [0], []
        tree = Tree(SHAPES["binary"], tokens[b].tolist())
        while True:
            best = int(np.argmax(toy.target(tree.context(node))))
            nxt = next((c for c in kids[node] if tree.tokens[c] == best), None)
            if nxt is None:
                emitted.append(best)
                break
            node = nxt
            path.append(node)
            emitted.append(best)
        assert out.path[b].tolist() == _padded(path, 3)
        assert out.token_ids[b].tolist() == _padded(emitted, 3)
    greedy_chain: list[int] = []
    for _ in range(3):
        greedy_chain.append(int(np.argmax(toy.target(tuple(greedy_chain)))))
    for b in range(3000):
        n = int(out.num_emitted[b])
        assert out.token_ids[b, :n].tolist() == greedy_chain[:n]


def test_greedy_takes_first_matching_child_and_logits() -> None:
    parents = torch.tensor([-1, 0, 0, 1, 2])
    tokens = torch.tensor([[-1, 1, 1, 0, 1]])
    logits = torch.tensor([[[0.0, 2.0], [0.0, 3.0], [1.0, 0.0], [5.0, 0.0], [0.0, 1.0]]])
    out = tree_verify_greedy(logits, tokens, parents)
    assert out.path.tolist() == [[0, 1, -1]]
    assert out.token_ids.tolist() == [[1, 1, -1]]
    assert out.num_emitted.tolist() == [2]


# --------------------------------------------------------------------------------------
# Determinism, seeds, truncation, edge cases
# --------------------------------------------------------------------------------------


def _small_batch(rows: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    toy = Toy(seed=1)
    g = torch.Generator().manual_seed(0)
    _, tokens, target, draft = _draw_trees(toy, "binary", "iid", rows, g)
    return tokens, target, draft, torch.tensor(SHAPES["binary"])


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    tokens, target, draft, parents = _small_batch(3)
    tokens[2], target[2], draft[2] = tokens[0], target[0], draft[0]
    seeds = torch.tensor([7, -1, 7])
    positions = torch.tensor([5, 0, 5])
    cpu = torch.device("cpu")
    out = tree_verify(
        target,
        tokens,
        parents,
        drafting="iid",
        draft_probs=draft,
        seeding=seeding_from(3, cpu, seeds=seeds),
        positions=positions,
    )
    alone = tree_verify(
        target[:1],
        tokens[:1],
        parents,
        drafting="iid",
        draft_probs=draft[:1],
        seeding=seeding_from(1, cpu, seeds=seeds[:1]),
        positions=positions[:1],
    )
    assert torch.equal(out.token_ids[0], out.token_ids[2])
    assert torch.equal(out.token_ids[:1], alone.token_ids)
    u = tree_uniforms(Seeding.build(3, cpu, seeds=seeds), 2, 2, cpu, positions)
    again = tree_verify(target, tokens, parents, drafting="iid", draft_probs=draft, uniforms=u)
    assert torch.equal(again.token_ids[0], out.token_ids[0])


def test_tree_uniforms_layout() -> None:
    """Seeded rows read TREE_ACCEPT at ``pos * TREE_STRIDE + level * max_children + j`` and
    TREE_FINAL at ``pos``; the other rows read uniforms too."""
    cpu = torch.device("cpu")
    seeds = torch.tensor([3, -1])
    positions = torch.tensor([4, 9])
    u = tree_uniforms(Seeding.build(2, cpu, seeds=seeds), 2, 3, cpu, positions)
    assert u.shape == (2, 7) and u.dtype == torch.float64
    assert bool(((u >= 0) & (u < 1)).all())
    accept = counter_uniform(
        seeds[:1], 4 * TREE_STRIDE + torch.arange(6).unsqueeze(0), Stream.TREE_ACCEPT
    )
    final = counter_uniform(seeds[:1], torch.tensor([[4]]), Stream.TREE_FINAL)
    assert torch.equal(u[:1, :6], accept)
    assert torch.equal(u[:1, 6:], final)


def test_tree_accept_counters_of_consecutive_steps_do_not_overlap() -> None:
    """At the largest allowed bounds, the steps at positions ``p`` and ``p + 1`` read the
    TREE_ACCEPT counters ``[p * S, (p + 1) * S)`` and ``[(p + 1) * S, (p + 2) * S)``
    (``S = TREE_STRIDE``), which are disjoint; one more child slot is refused."""
    cpu = torch.device("cpu")
    seed = torch.tensor([11])
    seeding = Seeding.build(1, cpu, seeds=seed)
    depth, children = 1 << 10, 1 << 10
    assert depth * children == TREE_STRIDE
    p = 6
    counters = {}
    for pos in (p, p + 1):
        u = tree_uniforms(seeding, depth, children, cpu, torch.tensor([pos]))
        counters[pos] = pos * TREE_STRIDE + torch.arange(TREE_STRIDE).unsqueeze(0)
        assert torch.equal(u[:, :-1], counter_uniform(seed, counters[pos], Stream.TREE_ACCEPT))
        final = counter_uniform(seed, torch.tensor([[pos]]), Stream.TREE_FINAL)
        assert torch.equal(u[:, -1:], final)
    assert int(counters[p].max()) < int(counters[p + 1].min())
    with pytest.raises(ValueError, match="max_depth \\* max_children"):
        tree_uniforms(seeding, depth, children + 1, cpu)


def test_decoding_loop_never_rereads_a_counter() -> None:
    """Positions advanced by ``num_emitted`` give disjoint TREE_ACCEPT counter sets."""
    tokens, target, draft, parents = _small_batch(1)
    position, seen = 0, set[int]()
    for step in range(6):
        depth, width = tree_bounds(parents)
        counters = set(range(position * TREE_STRIDE, position * TREE_STRIDE + depth * width))
        assert not counters & seen
        seen |= counters
        out = tree_verify(
            target,
            tokens,
            parents,
            drafting="iid",
            draft_probs=draft,
            seeding=seeding_from(1, torch.device("cpu"), seeds=[step]),
            positions=torch.tensor([position]),
        )
        position += int(out.num_emitted[0])


def test_own_generator_rows_do_not_depend_on_the_batch() -> None:
    """A row with its own generator emits the same tokens alone or beside other rows (a
    seeded one and one on the shared generator), and does not disturb the shared one."""
    tokens, target, draft, parents = _small_batch(3)
    cpu = torch.device("cpu")
    beside = tree_verify(
        target,
        tokens,
        parents,
        drafting="iid",
        draft_probs=draft,
        seeding=seeding_from(
            3,
            cpu,
            seeds=[5, None, None],
            generators={1: torch.Generator().manual_seed(42)},
            generator=torch.Generator().manual_seed(7),
        ),
        positions=[0, 0, 0],
    )
    alone = tree_verify(
        target[1:2],
        tokens[1:2],
        parents,
        drafting="iid",
        draft_probs=draft[1:2],
        seeding=seeding_from(
            1,
            cpu,
            generators={0: torch.Generator().manual_seed(42)},
            generator=torch.Generator().manual_seed(8),
        ),
    )
    shared_alone = tree_verify(
        target[2:],
        tokens[2:],
        parents,
        drafting="iid",
        draft_probs=draft[2:],
        seeding=seeding_from(1, cpu, generator=torch.Generator().manual_seed(7)),
    )
    assert torch.equal(beside.token_ids[1], alone.token_ids[0])
    assert torch.equal(beside.path[1], alone.path[0])
    assert torch.equal(beside.token_ids[2], shared_alone.token_ids[0])
    own = Seeding.build(1, cpu, generators={0: torch.Generator().manual_seed(42)})
    again = tree_verify(
        target[1:2],
        tokens[1:2],
        parents,
        drafting="iid",
        draft_probs=draft[1:2],
        uniforms=tree_uniforms(own, 2, 2, cpu),
    )
    assert torch.equal(again.token_ids, alone.token_ids)


def test_seeding_arguments_are_checked() -> None:
    """The randomness arguments, as the caller builds the seeding of a tree step
    (:func:`specsample.params.seeding.seeding_from`), and the seeding as the rule checks it."""
    tokens, target, draft, parents = _small_batch(2)
    call: Callable[..., TreeVerifyResult] = tree_verify
    args = (target, tokens, parents)
    cpu = torch.device("cpu")

    def seeded(**randomness: Any) -> TreeVerifyResult:
        seeding = seeding_from(2, cpu, **randomness)
        return call(*args, drafting="iid", draft_probs=draft, seeding=seeding)

    with pytest.raises(ValueError, match="seeds"):
        seeded(seeds=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="seeds"):
        seeded(seeds=[1])
    with pytest.raises(TypeError, match="seeds"):
        seeded(seeds=[1.5, 2])
    with pytest.raises(TypeError, match="generators"):
        seeded(generators=[torch.Generator()])
    with pytest.raises(ValueError, match="generators"):
        seeded(generators={2: torch.Generator()})
    with pytest.raises(ValueError, match="seed and a generator"):
        seeded(seeds=[1, None], generators={0: torch.Generator()})
    with pytest.raises(TypeError, match="generator"):
        seeded(generator=3)
    with pytest.raises(ValueError, match="positions"):
        call(*args, drafting="iid", draft_probs=draft, positions=torch.tensor([1]))
    with pytest.raises(ValueError, match="seeds/generators"):
        call(
            *args,
            drafting="iid",
            draft_probs=draft,
            uniforms=torch.rand(2, 5, dtype=torch.float64),
            seeding=seeding_from(2, cpu, generators={0: torch.Generator()}),
        )
    with pytest.raises(ValueError, match="seeding has 3 rows"):
        call(*args, drafting="iid", draft_probs=draft, seeding=seeding_from(3, cpu))
    with pytest.raises(TypeError, match="seeding"):
        call(*args, drafting="iid", draft_probs=draft, seeding=[1, 2])
    with pytest.raises(TypeError, match="seeding"):
        tree_uniforms(None, 1, 1, torch.device("cpu"))  # type: ignore[arg-type]


def test_bounds_and_truncation() -> None:
    assert tree_bounds(torch.tensor(SHAPES["ragged"])) == (2, 2)
    assert tree_bounds(torch.tensor(SHAPES["wide"])) == (2, 3)
    assert tree_bounds(torch.tensor([[-1, 0, 1], [-1, 0, 0]])) == (2, 2)
    assert tree_bounds(torch.tensor([-1])) == (0, 0)
    tokens, target, draft, parents = _small_batch()
    out = tree_verify(target, tokens, parents, drafting="iid", draft_probs=draft, max_depth=1)
    assert out.path.shape == (64, 2) and bool((out.num_emitted <= 2).all())
    none = tree_verify(target, tokens, parents, drafting="iid", draft_probs=draft, max_children=0)
    assert bool((none.num_emitted == 1).all()) and bool((none.path[:, 1:] == -1).all())
    device_bounds = tree_verify(
        target, tokens, parents, drafting="iid", draft_probs=draft, max_depth=6, max_children=6
    )
    assert device_bounds.path.shape == (64, 7)


def test_out_of_vocabulary_children_are_skipped() -> None:
    """A child with an invalid token is never accepted, its subtree never visited, and the
    uniform of its slot never read."""
    tokens, target, draft, parents = _small_batch()
    tokens[:, 1] = torch.where(torch.arange(64) % 2 == 0, -1, VOCAB)
    u = torch.rand(64, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a = tree_verify(target, tokens, parents, drafting="iid", draft_probs=draft, uniforms=u)
    u[:, 0] = 1.0 - u[:, 0]
    b = tree_verify(target, tokens, parents, drafting="iid", draft_probs=draft, uniforms=u)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.path, b.path)
    assert not bool(((a.path == 1) | (a.path == 3) | (a.path == 4)).any())
    assert bool((a.path[:, 1] == 2).any())


def test_empty_residuals_fall_back_without_nan() -> None:
    """``q == p`` rejects only a zero-probability child; the empty residual falls back to q."""
    row = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    target = row.expand(2, 3, 3).clone()
    tokens = torch.tensor([[-1, 2, 2], [-1, 2, 2]])
    parents = torch.tensor([-1, 0, 0])
    u = torch.tensor([[0.3, 0.3, 0.2], [0.9, 0.9, 0.7]], dtype=torch.float64)
    for drafting in ("iid", "without_replacement", "deterministic"):
        out = tree_verify(
            target, tokens, parents, drafting=drafting, draft_probs=target, uniforms=u
        )
        assert out.token_ids.tolist() == [[0, -1], [1, -1]], drafting
    certain = torch.tensor([[[0.0, 1.0, 0.0]] * 3])
    out = tree_verify(certain, torch.tensor([[-1, 1, 1]]), parents, drafting="deterministic")
    assert out.token_ids.tolist() == [[1, 1]]


def test_low_precision_inputs() -> None:
    tokens, target, draft, parents = _small_batch()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        out = tree_verify(
            target.to(dtype), tokens, parents, drafting="iid", draft_probs=draft.to(dtype)
        )
        assert bool(((out.token_ids[:, 0] >= 0) & (out.token_ids[:, 0] < VOCAB)).all())


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


def test_drafting_is_required_and_checked() -> None:
    assert inspect.signature(tree_verify).parameters["drafting"].default is inspect.Parameter.empty
    tokens, target, draft, parents = _small_batch(2)
    with pytest.raises(TypeError):
        tree_verify(target, tokens, parents)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="drafting"):
        tree_verify(target, tokens, parents, drafting="topk")  # type: ignore[arg-type]
    call: Callable[..., TreeVerifyResult] = tree_verify
    with pytest.raises(ValueError, match="method"):
        call(target, tokens, parents, drafting="iid", draft_probs=draft, method="spectr")


@pytest.mark.parametrize("drafting", ["iid", "without_replacement"])
def test_sampled_drafting_needs_draft_probs(drafting: Drafting) -> None:
    tokens, target, _, parents = _small_batch(2)
    with pytest.raises(ValueError, match="needs draft_probs"):
        tree_verify(target, tokens, parents, drafting=drafting)
    out = tree_verify(target, tokens, parents, drafting=drafting, method="onehot")
    assert out.token_ids.shape == (2, 3)


@pytest.mark.parametrize(
    ("drafting", "method"),
    [
        ("deterministic", "mss"),
        ("deterministic", "rrs"),
        ("without_replacement", "mss"),
        ("iid", "rrs"),
    ],
)
def test_biased_methods_raise(drafting: Drafting, method: TreeMethod) -> None:
    tokens, target, draft, parents = _small_batch(2)
    with pytest.raises(ValueError, match=f"method='{method}' is biased with drafting='{drafting}'"):
        tree_verify(target, tokens, parents, drafting=drafting, draft_probs=draft, method=method)


def test_shape_and_type_errors() -> None:
    tokens, target, draft, parents = _small_batch(2)
    call: Callable[..., TreeVerifyResult] = tree_verify
    with pytest.raises(ValueError, match="target_probs"):
        call(target[0], tokens, parents, drafting="deterministic")
    with pytest.raises(TypeError, match="target_probs"):
        call(target.long(), tokens, parents, drafting="deterministic")
    with pytest.raises(TypeError, match="target_probs"):
        call(target.tolist(), tokens, parents, drafting="deterministic")
    with pytest.raises(ValueError, match="draft_token_ids"):
        call(target, tokens[:, :3], parents, drafting="deterministic")
    with pytest.raises(TypeError, match="draft_token_ids"):
        call(target, tokens.double(), parents, drafting="deterministic")
    with pytest.raises(ValueError, match="parents"):
        call(target, tokens, parents[:3], drafting="deterministic")
    with pytest.raises(TypeError, match="parents"):
        call(target, tokens, parents.double(), drafting="deterministic")
    with pytest.raises(ValueError, match="draft_probs"):
        call(target, tokens, parents, drafting="iid", draft_probs=draft[:, :3])
    with pytest.raises(TypeError, match="draft_probs"):
        call(target, tokens, parents, drafting="iid", draft_probs=draft.long())
    with pytest.raises(ValueError, match="max_depth"):
        call(target, tokens, parents, drafting="deterministic", max_depth=-1)
    with pytest.raises(TypeError, match="max_children"):
        call(target, tokens, parents, drafting="deterministic", max_children=True)
    with pytest.raises(ValueError, match="uniforms"):
        call(target, tokens, parents, drafting="deterministic", uniforms=torch.rand(2, 3))
    with pytest.raises(ValueError, match="seeds"):
        call(
            target,
            tokens,
            parents,
            drafting="deterministic",
            uniforms=torch.rand(2, 5),
            seeding=seeding_from(2, torch.device("cpu"), seeds=torch.tensor([1, 2])),
        )


def test_strict_value_checks() -> None:
    tokens, target, draft, parents = _small_batch(2)
    bad_parents = parents.clone()
    bad_parents[3] = 3
    with pytest.raises(ValueError, match="parents"):
        tree_verify(target, tokens, bad_parents, drafting="deterministic", strict=True)
    bad_tokens = tokens.clone()
    bad_tokens[0, 2] = VOCAB
    with pytest.raises(ValueError, match="draft_token_ids"):
        tree_verify(target, bad_tokens, parents, drafting="deterministic", strict=True)
    nan_draft = draft.clone()
    nan_draft[1, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="draft_probs"):
        tree_verify(target, tokens, parents, drafting="iid", draft_probs=nan_draft, strict=True)
    ok = tree_verify(target, tokens, parents, drafting="iid", draft_probs=draft, strict=True)
    assert ok.num_emitted.shape == (2,)


def test_bounds_above_the_tree_cost_no_work_and_keep_their_layout() -> None:
    """On a 5-node tree, ``max_children = 2**20`` (or ``max_depth = 1000``) answers at once
    (the loops once ran over every slot): the walk is that of the bounds 4, while the output
    keeps ``max_depth + 1`` columns and the uniforms their layout for the given bounds."""
    import time

    cpu = torch.device("cpu")
    parents = torch.tensor([-1, 0, 0, 1, 1])
    tokens = torch.tensor([[0, 1, 2, 3, 0]] * 3)
    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(3, 5, 4, generator=gen), -1)
    draft = torch.softmax(torch.randn(3, 5, 4, generator=gen), -1)
    iid = {"drafting": "iid", "draft_probs": draft}

    def timed(call: Callable[..., Any], *bounds: int, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = call(target, tokens, parents, max_depth=bounds[0], max_children=bounds[1], **kwargs)
        assert time.perf_counter() - start < 5.0, bounds
        assert out.path.shape == out.token_ids.shape == (3, bounds[0] + 1)
        return out

    for depth, children in ((1, 2**20), (1000, 4)):
        tight = min(depth, 4), 4
        u = torch.rand(3, depth * children + 1, dtype=torch.float64, generator=gen)
        columns = [level * children + j for level in range(tight[0]) for j in range(4)]
        u_tight = u[:, [*columns, depth * children]]
        big = timed(tree_verify, depth, children, uniforms=u, **iid)
        small = tree_verify(
            target, tokens, parents, max_depth=tight[0], max_children=4, uniforms=u_tight, **iid
        )
        assert torch.equal(big.token_ids[:, : tight[0] + 1], small.token_ids)
        assert bool((big.path[:, tight[0] + 1 :] == -1).all())
        seeded = {"seeding": seeding_from(3, cpu, seeds=[1, 2, 3]), "positions": [0, 3, 9]}
        walked = timed(traversal_verify, depth, children, **seeded, **iid)
        expected = traversal_verify(
            target, tokens, parents, max_depth=tight[0], max_children=4, **seeded, **iid
        )
        assert torch.equal(walked.token_ids[:, : tight[0] + 1], expected.token_ids)
        greedy = timed(tree_verify_greedy, depth, children)
        expected = tree_verify_greedy(target, tokens, parents, max_depth=tight[0], max_children=4)
        assert torch.equal(greedy.token_ids[:, : tight[0] + 1], expected.token_ids)
