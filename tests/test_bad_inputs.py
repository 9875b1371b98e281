"""Bad inputs at the public entry points: a ``TypeError`` or ``ValueError`` naming the argument.

Covers the shared validation of the verifiers, :mod:`specsample.params.checks` (strict mode in
``tests/test_strict.py``).

One parameter per case (the reliability issue's cases, and the same gaps in neighbouring
arguments) at ``verify``, ``verify_padded``, ``RejectionSampler``, ``tree_verify`` and
``verify_tree``, strict and default; ``verify_tree`` refuses what ``verify`` refuses, with the
same messages (the cases of ``SHARED`` run at both). Each ``match`` holds the argument's name
and what it allows. A wrong type or dtype is a ``TypeError``; a wrong value, shape or device a
``ValueError``. Values of tensors that may be on an accelerator are checked only in strict mode
(tested apart, as are inputs that must be accepted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from specsample import (
    RejectionSampler,
    TypicalAcceptanceSampler,
    verify,
    verify_padded,
    verify_tree,
)
from specsample.params import metadata
from specsample.params.seeding import seeding_from
from specsample.rules.block import block_verify
from specsample.rules.chain import chain_verify
from specsample.rules.tree import TreeVerifyResult, tree_verify

B, K, V, NODES = 2, 3, 5, 4
META = torch.device("meta")
F64 = torch.float64


def _probs(*shape: int, seed: int = 0) -> torch.Tensor:
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) + 0.1
    return x / x.sum(dim=-1, keepdim=True)


def _verify_args() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {
        "target_logits": torch.randn(B * (K + 1), V, generator=g),
        "draft_token_ids": torch.randint(V, (B * K,), generator=g),
        "num_draft_tokens": [K] * B,
    }


def _padded_args() -> dict[str, Any]:
    flat = _verify_args()
    return {
        "target_logits": flat["target_logits"].view(B, K + 1, V),
        "draft_token_ids": flat["draft_token_ids"].view(B, K),
    }


def _sampler_args() -> dict[str, Any]:
    return {
        "target_probs": _probs(B, K, V, seed=2),
        "bonus_token_ids": torch.tensor([[1], [2]]),
        "draft_probs": _probs(B, K, V, seed=3),
        "draft_token_ids": torch.tensor([[0, 1, 2], [3, 4, 0]]),
    }


def _tree_args() -> dict[str, Any]:
    return {
        "target_probs": _probs(B, NODES, V, seed=4),
        "draft_token_ids": torch.tensor([[-1, 1, 2, 3]] * B),
        "parents": torch.tensor([-1, 0, 0, 1]),
        "drafting": "deterministic",
    }


def _verify_tree_args() -> dict[str, Any]:
    tree = _tree_args()
    return {"target_logits": tree.pop("target_probs").log(), **tree}


def _tree_verify(**arguments: Any) -> TreeVerifyResult:
    """:func:`tree_verify` with its seeding built by the caller from seeds and generators."""
    randomness = {
        n: arguments.pop(n) for n in ("seeds", "generators", "generator") if n in arguments
    }
    if randomness:
        target = arguments["target_probs"]
        arguments["seeding"] = seeding_from(target.shape[0], target.device, **randomness)
    return tree_verify(**arguments)


def run(entry: str, strict: bool, /, **changes: Any) -> Any:
    """Call ``entry`` on valid arguments with ``changes``, in strict or default mode."""
    if entry == "sampler":
        init = {n: changes.pop(n) for n in ("strict_mode", "method", "backend") if n in changes}
        sampler = RejectionSampler(**{"strict_mode": strict, **init})
        return sampler(**{**_sampler_args(), **changes})
    calls: dict[str, tuple[Callable[..., Any], Callable[[], dict[str, Any]]]] = {
        "verify": (verify, _verify_args),
        "padded": (verify_padded, _padded_args),
        "tree": (_tree_verify, _tree_args),
        "verify_tree": (verify_tree, _verify_tree_args),
    }
    call, args = calls[entry]
    return call(**{**args(), "strict": strict, **changes})


NO_BONUS = {"target_logits": torch.randn(B * K, V)}
"""``verify`` changes for a call with given bonus ids (target rows of the drafts only)."""


def _case(entry: str, changes: dict[str, Any], error: type, match: str, name: str) -> Any:
    return pytest.param(entry, changes, error, match, id=f"{entry}: {name}")


SEED_INTS = r"entries must lie in \[0, 2\*\*64\) \(None or -1: unseeded\)"
POSITION_INTS = r"entries must lie in \[0, 2\*\*40\)"


def _seed_and_position_cases() -> list[Any]:
    """Seeds and positions: huge, strings, meta, floats; at the three kinds of entry point."""
    cases = []
    for entry in ("verify", "sampler", "tree", "verify_tree"):
        for name, allowed in (("seeds", SEED_INTS), ("positions", POSITION_INTS)):
            for what, value, error, match in (
                ("2**64", [2**64, 1], ValueError, f"{name} {allowed}"),
                ("string", "12", TypeError, f"{name} must be a tensor or a sequence"),
                ("strings", ["1", "2"], TypeError, f"{name} entries must be int"),
                ("on meta", torch.tensor([1, 2], device=META), ValueError, f"{name} is on meta"),
                ("float 1.5", [1.5, 2], TypeError, f"{name} entries must be int"),
                ("float 1.0", [1.0, 2], TypeError, f"{name} entries must be int"),
                ("float tensor", torch.tensor([1.5, 2.0]), TypeError, f"{name} must be an int64"),
                ("int16 tensor", torch.tensor([1, 2], dtype=torch.int16), TypeError, name),
                ("shape", torch.tensor([[1, 2]]), ValueError, rf"{name} must have shape \(2,\)"),
                ("length", [1], ValueError, f"{name} must have one entry per row"),
                ("scalar", 3, TypeError, f"{name} must be a tensor or a sequence"),
            ):
                cases.append(_case(entry, {name: value}, error, match, f"{name} {what}"))
        cases.append(
            _case(entry, {"positions": [-1, 0]}, ValueError, f"positions {POSITION_INTS}", "-1")
        )
        cases.append(_case(entry, {"seeds": [-2, 0]}, ValueError, f"seeds {SEED_INTS}", "seed -2"))
    return cases


def _generator_cases() -> list[Any]:
    """``generators`` (``seeded_seqs`` of the sampler) and the shared ``generator``."""
    cases = []
    g = torch.Generator()
    entries = [("verify", "generators"), ("tree", "generators"), ("sampler", "seeded_seqs")]
    for entry, name in [*entries, ("verify_tree", "generators")]:
        for what, value, error, match in (
            ("str key", {"a": g}, TypeError, f"{name} keys must be row indices"),
            ("float key", {0.5: g}, TypeError, f"{name} keys must be row indices"),
            ("bool key", {True: g}, TypeError, f"{name} keys must be row indices"),
            ("key 2**64", {2**64: g}, ValueError, rf"{name} has row \d+, outside \[0, 2\)"),
            ("value", {0: 3}, TypeError, rf"{name}\[0\] must be a torch.Generator"),
            ("list", [g], TypeError, f"{name} must be a dict of row -> torch.Generator"),
        ):
            cases.append(_case(entry, {name: value}, error, match, f"{name} {what}"))
        cases.append(
            _case(entry, {"generator": 3}, TypeError, "generator must be a torch.Generator", "g")
        )
        clash = {"seeds": [1, None], name: {0: g}}
        both = r"seeds and generators \(seeded_seqs\): row 0 has both a seed and a generator"
        cases.append(_case(entry, clash, ValueError, both, f"seeds and {name}"))
    return cases


def _uniform_cases() -> list[Any]:
    cases = []
    tree = 2 * 2 + 1  # max_depth * max_children + 1
    widths = {"verify": K + 1, "sampler": K + 1, "tree": tree, "verify_tree": tree}
    for entry, columns in widths.items():
        for what, value, error, match in (
            ("list", [0.5], TypeError, "uniforms must be a torch.Tensor"),
            ("float32", torch.zeros(B, columns), TypeError, "uniforms must be float64"),
            ("shape", torch.zeros(B, columns + 1, dtype=F64), ValueError, "uniforms must have"),
            ("meta", torch.zeros(B, columns, dtype=F64, device=META), ValueError, "uniforms is"),
        ):
            cases.append(_case(entry, {"uniforms": value}, error, match, f"uniforms {what}"))
    return cases


TE, VE = TypeError, ValueError
COUNTS = "must be a sequence of ints or a 1-D integer tensor"
REAL = "values must be real numbers"
TOP_K = r"must be an integer in \[0, 2\*\*63\) \(0 = off\)"
SHAPE = r"must have shape \(2, 3, 5\) \[batch, k, vocab\], got "
AT_MOST = "a request may have at most 255 drafts"
ON_META = "is on meta: give it on the CPU"
VOCAB_0 = "must have a non-empty vocabulary dimension"
NOT_INT = "must be an int or None"
FLOATS = "must be float32, float16, bfloat16 or float64, got torch"
IDS = "int64 or int32 tensor, got torch"
TREE_IDS = r"must be a \[batch, nodes\] " + IDS
ELSEWHERE = "is on meta but target_logits is on cpu"
NODE_IDS = torch.zeros(B, NODES, dtype=torch.long)
NODE_ROWS = r"must have shape \(2, 4, 5\) \[batch, nodes, vocab\], got \(2, 4, 6\)"
OTHERS: dict[str, dict[str, Any]] = {
    "long": {"target_logits": torch.zeros(301, V), "draft_token_ids": torch.zeros(300).long()},
    "wide": {"target_probs": _probs(B, 256, V), "draft_probs": _probs(B, 256, V)},
    "max": {"max_draft_tokens": K},
    "bounds": {"max_depth": 2, "max_children": 2},
    "empty": {"draft_probs": torch.zeros(B, K, 0)},
    "nb": {"target_logits": torch.randn(B * K, V)},
    "+logits": {"draft_logits": torch.randn(B * K, V)},
    "k0": {"draft_token_ids": torch.zeros(B, 0, dtype=torch.long)},
    "padded 256": {"target_logits": torch.zeros(B, 257, V)},
}
"""Fixed changes some rows need besides their argument's value."""

# entry, argument, case, value, error, message after the argument's name[, OTHERS key]
ROWS: list[tuple[Any, ...]] = [
    ("verify", "num_draft_tokens", "None", None, TE, COUNTS),
    ("verify", "num_draft_tokens", "int", 3, TE, COUNTS),
    ("verify", "num_draft_tokens", "str", "33", TE, COUNTS),
    ("verify", "num_draft_tokens", "meta", torch.tensor([K] * B).to(META), VE, ON_META),
    ("verify", "num_draft_tokens", "meta, max", torch.tensor([K] * B).to(META), VE, ON_META, "max"),
    ("verify", "num_draft_tokens", "floats", [1.5, 4.5], TE, "entries must be int"),
    ("verify", "num_draft_tokens", "bools", [True, 5], TE, "entries must be int"),
    ("verify", "num_draft_tokens", "2**64", [2**64, 3], VE, r"entries must lie in \[0, 2\*\*63\)"),
    ("verify", "num_draft_tokens", "floats tensor", torch.ones(B), TE, "must be an integer"),
    ("verify", "num_draft_tokens", "2-D", torch.tensor([[K, K]]), VE, r"must have shape \[batch\]"),
    ("verify", "num_draft_tokens", "300", [300], VE, AT_MOST, "long"),
    ("verify", "target_logits", "vocab 0", torch.zeros(B * (K + 1), 0), VE, VOCAB_0),
    ("verify", "target_logits", "int64", torch.zeros(B * (K + 1), V).long(), TE, FLOATS),
    ("verify_tree", "target_logits", "vocab 0", torch.zeros(B, NODES, 0), VE, VOCAB_0),
    ("verify_tree", "target_logits", "no node", torch.zeros(B, 0, V), VE, "needs at least one"),
    ("verify_tree", "parents", "meta", torch.tensor([-1, 0, 0, 1]).to(META), VE, "is on meta"),
    ("verify_tree", "target_logits", "int64", torch.zeros(B, NODES, V).long(), TE, FLOATS),
    ("verify_tree", "target_logits", "bool", torch.zeros(B, NODES, V).bool(), TE, FLOATS),
    ("verify_tree", "target_logits", "2-D", torch.zeros(B * NODES, V), VE, "must have shape"),
    ("verify", "draft_token_ids", "int16", torch.zeros(B * K).short(), TE, "must be a 1-D " + IDS),
    ("verify", "draft_token_ids", "meta", torch.zeros(B * K).long().to(META), VE, ELSEWHERE),
    ("verify_tree", "draft_token_ids", "int16", NODE_IDS.short(), TE, TREE_IDS),
    ("verify_tree", "draft_token_ids", "1-D", NODE_IDS.view(-1), TE, TREE_IDS),
    ("verify_tree", "draft_token_ids", "meta", NODE_IDS.to(META), VE, ELSEWHERE),
    ("verify_tree", "draft_token_ids", "list", [[0] * NODES] * B, TE, "must be a torch.Tensor"),
    ("verify", "draft_probs", "int64", torch.zeros(B * K, V).long(), TE, FLOATS),
    ("verify", "draft_probs", "meta", _probs(B * K, V).to(META), VE, ELSEWHERE),
    ("verify_tree", "draft_probs", "vocab", _probs(B, NODES, V + 1), VE, NODE_ROWS),
    ("verify_tree", "draft_probs", "int64", torch.zeros(B, NODES, V).long(), TE, FLOATS),
    ("verify_tree", "draft_probs", "meta", _probs(B, NODES, V).to(META), VE, ELSEWHERE),
    ("verify_tree", "draft_probs", "list", [[0.2] * V], TE, "must be a torch.Tensor"),
    ("padded", "target_logits", "vocab 0", torch.zeros(B, K + 1, 0), VE, VOCAB_0),
    ("sampler", "target_probs", "vocab 0", torch.zeros(B, K, 0), VE, VOCAB_0, "empty"),
    ("tree", "target_probs", "vocab 0", torch.zeros(B, NODES, 0), VE, "needs at least one"),
    ("tree", "parents", "meta", torch.tensor([-1, 0, 0, 1]).to(META), VE, ON_META),
    ("tree", "parents", "meta, bounds", torch.zeros(4).long().to(META), VE, "is", "bounds"),
    ("padded", "draft_probs", "vocab", _probs(B, K, V + 1), VE, SHAPE + r"\(2, 3, 6\)"),
    ("padded", "draft_probs", "flattened", _probs(B, K * V), VE, SHAPE + r"\(2, 15\)"),
    ("padded", "draft_probs", "permuted", _probs(K, B, V), VE, SHAPE + r"\(3, 2, 5\)"),
    ("padded", "draft_logits", "vocab", torch.randn(B, K, V - 1), VE, SHAPE + r"\(2, 3, 4"),
    ("padded", "draft_logits", "permuted", torch.randn(K, B, V), VE, SHAPE + r"\(3, 2, 5"),
    ("sampler", "draft_probs", "permuted", _probs(K, B, V), VE, r"must have shape \(2, 3, 5"),
    ("verify", "draft_probs", "flat", _probs(B * K * V), VE, r"must have shape \(6, 5\) \[total"),
    ("verify", "draft_probs", "list", [[0.2] * V], TE, "must be a torch.Tensor"),
    ("verify", "draft_probs", "and logits", _probs(B * K, V), VE, "or draft_logits, no", "+logits"),
    ("verify", "bonus_token_ids", "list", [1, 2], TE, "must be a torch.Tensor", "nb"),
    ("verify", "bonus_token_ids", "float", torch.tensor([1.0, 2.0]), TE, "must be int64", "nb"),
    ("verify", "bonus_token_ids", "meta", torch.tensor([1, 2]).to(META), VE, "is on meta", "nb"),
    ("verify", "bonus_token_ids", "shape", torch.tensor([1, 2, 3]), VE, "must have shape", "nb"),
    ("sampler", "bonus_token_ids", "list", [1, 2], TE, "must be a torch.Tensor"),
    ("sampler", "bonus_token_ids", "float", torch.tensor([[1.0], [2.0]]), TE, "must be int64"),
    ("sampler", "bonus_token_ids", "meta", torch.tensor([[1], [2]]).to(META), VE, "is on meta"),
    ("verify", "method", "1", 1, TE, r"must be a str, one of \('chain', 'block', 'gumbel', 'typ"),
    ("verify", "method", "name", "tree", VE, r"must be one of \('chain', 'block', 'gumbel', 'typ"),
    ("sampler", "method", "1", 1, TE, "must be a str"),
    ("sampler", "method", "name", "mss", VE, "must be one of"),
    ("tree", "method", "1", 1, TE, "must be a str, one of"),
    ("tree", "method", "name", "x", VE, "must be one of"),
    ("tree", "drafting", "1", 1, TE, "must be a str, one of"),
    ("tree", "drafting", "name", "x", VE, "must be one of"),
    ("verify_tree", "method", "1", 1, TE, "must be a str, one of"),
    ("verify_tree", "method", "name", "chain", VE, "must be one of"),
    ("verify_tree", "drafting", "1", 1, TE, "must be a str, one of"),
    ("verify_tree", "drafting", "name", "x", VE, "must be one of"),
    ("sampler", "backend", "1", 1, TE, "must be a str"),
    ("sampler", "backend", "name", "cuda", VE, "must be one of"),
    ("verify", "max_draft_tokens", "str", "3", TE, NOT_INT),
    ("verify", "max_draft_tokens", "3.0", 3.0, TE, NOT_INT),
    ("verify", "max_draft_tokens", "bool", True, TE, NOT_INT),
    ("verify", "max_draft_tokens", "-1", -1, VE, "must be >= 0"),
    ("verify", "max_draft_tokens", "2", 2, VE, "is 2 but a request has 3"),
    ("verify", "max_draft_tokens", "256", 256, VE, AT_MOST),
    ("verify", "max_draft_tokens", "2**64", 2**64, VE, AT_MOST),
    ("sampler", "draft_token_ids", "256", torch.zeros(B, 256).long(), VE, "a row may", "wide"),
    ("verify", "return_logprobs", "str", "yes", TE, "must be a bool"),
    ("padded", "strict", "int", 1, TE, "must be a bool"),
    ("sampler", "strict_mode", "str", "yes", TE, "must be a bool"),
    ("tree", "strict", "int", 1, TE, "must be a bool"),
    ("padded", "target_logits", "k + 1 = 0", torch.zeros(B, 0, V), VE, "must have at", "k0"),
    ("padded", "draft_token_ids", "float", torch.zeros(B, K), TE, "must be int64 or int32"),
    ("padded", "draft_token_ids", "256", torch.zeros(B, 256).long(), VE, AT_MOST, "padded 256"),
]

# argument, case, value, error, message after the argument's name: at verify and verify_tree
SHARED: list[tuple[Any, ...]] = [
    ("temperature", "None", [None, 1.0], TE, REAL),
    ("temperature", "str", ["a", 1.0], TE, REAL),
    ("temperature", "complex", [1j, 1.0], TE, REAL),
    ("temperature", "bool", [True, 1.0], TE, REAL),
    ("temperature", "nested", [[1.0], [1.0]], TE, REAL),
    ("temperature", "string", "1.0", TE, "must be a number, a sequence or a tensor"),
    ("temperature", "10**400", 10**400, VE, "must be finite and >= 0"),
    ("temperature", "meta", torch.ones(B).to(META), VE, ON_META),
    ("temperature", "shape", torch.ones(B, 1), VE, r"must be a scalar or have shape"),
    ("top_k", "inf", math.inf, VE, TOP_K),
    ("top_k", "nan", math.nan, VE, TOP_K),
    ("top_k", "2**63", 2**63, VE, TOP_K),
    ("top_k", "list 2**63", [2**63, 1], VE, TOP_K),
    ("top_k", "list inf", [math.inf, 1], VE, TOP_K),
    ("top_k", "1.5", 1.5, VE, TOP_K),
    ("top_k", "float tensor", torch.tensor([2.0, 1.0]), TE, "must be an integer tensor"),
    ("top_k", "meta", torch.ones(B).long().to(META), VE, ON_META),
    ("top_p", "nan", math.nan, VE, r"must be in \(0, 1\]"),
    ("min_p", "nan", math.nan, VE, r"must be in \[0, 1\]"),
    ("backend", "1", 1, TE, r"must be a str, one of \('auto'"),
    ("backend", "list", ["torch"], TE, "must be a str"),
    ("backend", "name", "cuda", VE, "must be one of"),
    ("strict", "str", "yes", TE, "must be a bool"),
]

CASES = [
    *(
        _case(
            e, {**OTHERS.get(rest[0] if rest else "", {}), n: v}, err, f"{n}:? {m}", f"{n} {what}"
        )
        for e, n, what, v, err, m, *rest in ROWS
    ),
    *(
        _case(e, {n: v}, err, f"{n}:? {m}", f"{n} {what}")
        for e in ("verify", "verify_tree")
        for n, what, v, err, m in SHARED
    ),
    *_seed_and_position_cases(),
    *_generator_cases(),
    *_uniform_cases(),
]


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize(("entry", "changes", "error", "match"), CASES)
def test_bad_input_is_refused_naming_the_argument(
    entry: str, changes: dict[str, Any], error: type[Exception], match: str, strict: bool
) -> None:
    with pytest.raises(error, match=match) as raised:
        run(entry, strict, **dict(changes))
    assert type(raised.value) is error


@pytest.mark.parametrize("entry", ["verify", "padded", "sampler"])
@pytest.mark.parametrize("method", ["chain", "block"])
def test_empty_batch_gives_an_empty_result(entry: str, method: str) -> None:
    """Block verification of batch 0 returns an empty result, as chain verification does."""
    if entry == "sampler":
        q = torch.zeros(0, K, V)
        ids = torch.zeros(0, K, dtype=torch.long)
        out = RejectionSampler(method=method)(q, torch.zeros(0, 1, dtype=torch.long), q, ids)
        assert out.shape == (0, K + 1) and out.dtype == torch.int64
        return
    if entry == "verify":
        args: dict[str, Any] = {"num_draft_tokens": []}
        logits, ids, probs = torch.zeros(0, V), torch.zeros(0, dtype=torch.long), torch.zeros(0, V)
        result = verify(logits, ids, method=method, draft_probs=probs, **args)
        width = 1
    else:
        logits, ids = torch.zeros(0, K + 1, V), torch.zeros(0, K, dtype=torch.long)
        result = verify_padded(logits, ids, method=method, draft_probs=torch.zeros(0, K, V))
        width = K + 1
    assert result.token_ids.shape == (0, width) and result.num_accepted.shape == (0,)


@pytest.mark.parametrize("entry", ["tree", "sampler"])
def test_seeds_and_positions_as_lists_are_accepted(entry: str) -> None:
    """Host lists give the same result as the equivalent tensors (as for ``verify``)."""
    drafting = {"drafting": "iid", "draft_probs": _probs(B, NODES, V, seed=5)}
    extra = drafting if entry == "tree" else {}
    as_lists = run(entry, False, seeds=[7, None], positions=[3, 11], **extra)
    as_tensors = run(
        entry, False, seeds=torch.tensor([7, -1]), positions=torch.tensor([3, 11]), **extra
    )
    first = as_lists.token_ids if entry == "tree" else as_lists
    second = as_tensors.token_ids if entry == "tree" else as_tensors
    assert torch.equal(first[0], second[0])


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"target_probs": torch.full((B, NODES, V), math.inf)}, "target_probs"),
        (
            {"target_probs": _probs(B, NODES, V).index_fill(2, torch.tensor([0]), -math.inf)},
            "target_probs",
        ),
        ({"drafting": "iid", "draft_probs": torch.full((B, NODES, V), math.inf)}, "draft_probs"),
        ({"uniforms": torch.full((B, 5), 1.0, dtype=F64)}, "uniforms"),
    ],
    ids=["target inf", "target -inf", "draft inf", "uniforms 1.0"],
)
def test_tree_strict_refuses_non_finite_values(changes: dict[str, Any], name: str) -> None:
    """``tree_verify(strict=True)`` refuses inf rows; without strict the call completes."""
    with pytest.raises(ValueError, match=f"{name} must"):
        run("tree", True, **changes)
    assert run("tree", False, **changes).token_ids.shape == (B, 3)


def _device_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat CPU tensors as tensors on an accelerator: their values are not read."""
    monkeypatch.setattr(metadata, "_on_host", lambda _tensor: False)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"temperature": torch.tensor([-1.0, 1.0])}, r"temperature must be finite and >= 0"),
        ({"temperature": torch.tensor(math.inf)}, r"temperature must be finite and >= 0"),
        ({"top_k": torch.tensor([-1, 2])}, r"top_k must be an integer in \[0, 2\*\*63\)"),
        ({"top_p": torch.tensor([0.0, 0.5])}, r"top_p must be in \(0, 1\]"),
        ({"min_p": torch.tensor([0.5, 2.0])}, r"min_p must be in \[0, 1\]"),
        ({"max_draft_tokens": 2}, "max_draft_tokens is 2 but a request has 3"),
        ({"uniforms": torch.full((B, K + 1), -0.5, dtype=F64)}, r"uniforms must lie in \[0, 1\)"),
        ({**NO_BONUS, "bonus_token_ids": torch.tensor([0, V])}, r"bonus_token_ids must lie in"),
    ],
    ids=[
        "temperature < 0",
        "temperature inf",
        "top_k < 0",
        "top_p 0",
        "min_p 2",
        "max",
        "u",
        "bonus",
    ],
)
def test_device_values_are_checked_in_strict_mode(
    changes: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values of device tensors are read only in strict mode; without it the step runs."""
    _device_resident(monkeypatch)
    args = {"num_draft_tokens": torch.tensor([K] * B), "max_draft_tokens": K, **changes}
    with pytest.raises(ValueError, match=match):
        run("verify", True, **args)
    assert run("verify", False, **args).token_ids.shape[0] == B


@pytest.mark.parametrize("entry", ["sampler", "tree"])
def test_given_uniforms_are_checked_in_strict_mode(entry: str) -> None:
    columns = K + 1 if entry == "sampler" else 2 * 2 + 1
    uniforms = torch.full((B, columns), math.nan, dtype=F64)
    with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
        run(entry, True, uniforms=uniforms)
    run(entry, False, uniforms=uniforms)


def _on_meta(args: dict[str, Any]) -> dict[str, Any]:
    return {n: v.to(META) if isinstance(v, torch.Tensor) else v for n, v in args.items()}


@pytest.mark.parametrize(
    ("entry", "args", "name"),
    [
        ("verify", _verify_args, "target_logits"),
        ("sampler", _sampler_args, "target_probs"),
        ("tree", _tree_args, "target_probs"),
        ("verify_tree", _verify_tree_args, "target_logits"),
    ],
)
def test_strict_mode_on_the_meta_device_is_refused(
    entry: str, args: Callable[[], dict[str, Any]], name: str
) -> None:
    """Strict mode reads values, which meta tensors lack; default mode runs on them."""
    bounds = {"max_depth": 2, "max_children": 2} if "tree" in entry else {}
    with pytest.raises(ValueError, match=f"strict mode reads the values of {name}"):
        run(entry, True, **_on_meta(args()), **bounds)
    run(entry, False, **_on_meta(args()), **bounds)


@pytest.mark.parametrize("rule", [chain_verify, block_verify], ids=["chain", "block"])
@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        (
            "bonus_token_ids",
            torch.tensor([[1, 2], [2, 1]]),
            ValueError,
            r"must have shape \(2, 1\)",
        ),
        ("draft_token_ids", torch.zeros(B, K + 1, dtype=torch.long), ValueError, "must have shape"),
        ("uniforms", torch.zeros(B, K + 1), TypeError, "must be float64"),
        ("uniforms", torch.zeros(B, K, dtype=F64), ValueError, r"must have shape \(2, 4\)"),
    ],
)
def test_rules_check_their_arguments(
    rule: Callable[..., Any], name: str, value: torch.Tensor, error: type, match: str
) -> None:
    """``chain_verify`` and ``block_verify`` refuse misshapen arguments instead of guessing."""
    args = {**_sampler_args(), "uniforms": torch.rand(B, K + 1, dtype=F64), name: value}
    with pytest.raises(error, match=f"{name} {match}"):
        rule(**args)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (
            {"draft_token_ids": torch.zeros(B, K + 2, dtype=torch.long)},
            ValueError,
            "draft_token_ids",
        ),
        (
            {"target_with_bonus_probs": torch.ones(B, K + 1, V, dtype=torch.long)},
            TypeError,
            "target_with",
        ),
    ],
    ids=["ids shape", "target dtype"],
)
def test_typical_sampler_names_its_own_arguments(
    changes: dict[str, Any], error: type, match: str
) -> None:
    args = {"target_with_bonus_probs": _probs(B, K + 1, V), **_sampler_args(), **changes}
    del args["target_probs"], args["draft_probs"]
    with pytest.raises(error, match=match):
        TypicalAcceptanceSampler()(**args)
