"""The public tree entry :func:`specsample.verify_tree` (:mod:`specsample.api.tree`).

Covers :mod:`specsample.api.tree` and the PyTorch backend's tree step
(:mod:`specsample.backends.trees`).

It is the tree rules of :mod:`specsample.rules.tree` run through the pipeline and the
backend seam on the processed target rows: the same tokens as the rule itself on the same
seeds or the same given uniforms, the greedy walk for greedy batches, batch invariance of
seeded requests, and the refusal of a rule that is not exact for how the tree was drafted.
The rules' own distributions are tested statistically in ``tests/test_tree.py`` and
``tests/test_traversal.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specsample import Requests, SamplingParams, verify_tree
from specsample.params.seeding import seeding_from
from specsample.probs import processed_probs
from specsample.rules.tree import traversal_verify, tree_verify, tree_verify_greedy

CPU = torch.device("cpu")
VOCAB = 6
PARENTS = [-1, 0, 0, 1, 1, 2]
"""Node 0 the root; 1 and 2 its children; 3 and 4 children of 1; 5 a child of 2."""


def _tree(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    nodes = len(PARENTS)
    draft = torch.softmax(torch.randn(batch, nodes, VOCAB, generator=gen), dim=-1)
    return {
        "logits": torch.randn(batch, nodes, VOCAB, generator=gen) * 2,
        "ids": torch.randint(0, VOCAB, (batch, nodes), generator=gen),
        "parents": torch.tensor([PARENTS] * batch),
        "draft_probs": draft,
    }


CASES = [("iid", None), ("without_replacement", None), ("deterministic", None)]
CASES += [("iid", "traversal"), ("without_replacement", "traversal"), ("iid", "onehot")]


@pytest.mark.parametrize(("drafting", "method"), CASES)
def test_verify_tree_is_the_rule_on_processed_rows(drafting: str, method: str | None) -> None:
    tree = _tree(2)
    temps, seeds, positions = [0.7, 1.2], [3, 4], [10, 20]
    out = verify_tree(
        tree["logits"],
        tree["ids"],
        tree["parents"],
        draft_probs=tree["draft_probs"],
        method=method,
        drafting=drafting,
        temperature=temps,
        seeds=seeds,
        positions=positions,
    )
    nodes = len(PARENTS)
    flat = tree["logits"].reshape(-1, VOCAB)
    probs = processed_probs(flat, torch.tensor(temps).repeat_interleave(nodes))
    common: dict[str, Any] = {
        "drafting": drafting,
        "draft_probs": tree["draft_probs"],
        "seeding": seeding_from(2, CPU, seeds=seeds),
        "positions": positions,
    }
    args = (probs.view(2, nodes, VOCAB), tree["ids"], tree["parents"])
    if method == "traversal":
        expected = traversal_verify(*args, **common)
    else:
        expected = tree_verify(*args, method=method, **common)  # type: ignore[arg-type]
    for got, want in zip(out, expected, strict=True):
        assert torch.equal(got, want)


def test_greedy_batch_follows_the_argmax_down_the_tree() -> None:
    tree = _tree(3, seed=1)
    out = verify_tree(
        tree["logits"], tree["ids"], tree["parents"], drafting="deterministic", temperature=0.0
    )
    expected = tree_verify_greedy(tree["logits"], tree["ids"], tree["parents"])
    for got, want in zip(out, expected, strict=True):
        assert torch.equal(got, want)


def test_seeded_request_is_batch_invariant() -> None:
    tree = _tree(3, seed=2)
    kwargs: dict[str, Any] = {"drafting": "iid", "draft_probs": tree["draft_probs"]}
    batch = verify_tree(
        tree["logits"], tree["ids"], tree["parents"], seeds=[5, 6, 7], positions=[1, 2, 3], **kwargs
    )
    kwargs["draft_probs"] = tree["draft_probs"][1:2]
    alone = verify_tree(
        tree["logits"][1:2],
        tree["ids"][1:2],
        tree["parents"][1:2],
        seeds=[6],
        positions=[2],
        **kwargs,
    )
    assert torch.equal(batch.token_ids[1:2], alone.token_ids)
    assert torch.equal(batch.path[1:2], alone.path)


def test_requests_object_gives_the_tokens_of_the_keywords() -> None:
    tree = _tree(2, seed=3)
    kwargs: dict[str, Any] = {"drafting": "iid", "draft_probs": tree["draft_probs"]}
    by_keywords = verify_tree(
        tree["logits"],
        tree["ids"],
        tree["parents"],
        temperature=0.8,
        seeds=[1, 2],
        positions=[4, 9],
        **kwargs,
    )
    params = SamplingParams(temperature=0.8, seeds=[1, 2])
    requests = Requests.build(2, CPU, params, positions=[4, 9])
    by_object = verify_tree(
        tree["logits"], tree["ids"], tree["parents"], requests=requests, **kwargs
    )
    assert torch.equal(by_keywords.token_ids, by_object.token_ids)


def test_a_rule_not_exact_for_the_drafting_is_refused() -> None:
    tree = _tree(1)
    with pytest.raises(ValueError, match="method"):
        verify_tree(
            tree["logits"],
            tree["ids"],
            tree["parents"],
            draft_probs=tree["draft_probs"],
            drafting="deterministic",
            method="mss",
            temperature=1.0,
        )


def test_bad_arguments_are_named() -> None:
    tree = _tree(1)
    with pytest.raises(ValueError, match="target_logits"):
        verify_tree(tree["logits"][0], tree["ids"], tree["parents"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_draft_tokens'"):
        verify_tree(tree["logits"], tree["ids"], tree["parents"], max_draft_tokens=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="method"):
        verify_tree(tree["logits"], tree["ids"], tree["parents"], method="chain")


def test_bounds_above_the_tree_cost_no_work() -> None:
    """``max_children = 2**20`` answers at once, with the greedy tokens of the tight bound."""
    import time

    tree = _tree(2, seed=4)
    nodes = tree["logits"].shape[1]
    args = (tree["logits"], tree["ids"], tree["parents"])
    sampled = {"drafting": "iid", "draft_probs": tree["draft_probs"], "seeds": [1, 2]}
    start = time.perf_counter()
    out = verify_tree(*args, max_depth=1, max_children=2**20, positions=[0, 5], **sampled)
    huge = verify_tree(*args, max_depth=1, max_children=2**20, temperature=0.0)
    assert time.perf_counter() - start < 5.0
    tight = verify_tree(*args, max_depth=1, max_children=nodes - 1, temperature=0.0)
    assert out.path.shape == (2, 2) and torch.equal(huge.token_ids, tight.token_ids)


@pytest.mark.parametrize("method", [None, "traversal"])
def test_given_uniforms_replace_the_drawn_ones(method: str | None) -> None:
    """As in :func:`specsample.verify`, ``uniforms`` are the step's numbers: the tokens are the
    rule's on the same uniforms."""
    tree = _tree(2, seed=5)
    nodes = len(PARENTS)
    columns = nodes if method == "traversal" else 2 * 2 + 1  # max_depth * max_children + 1
    uniforms = torch.rand(
        2, columns, dtype=torch.float64, generator=torch.Generator().manual_seed(8)
    )
    drafted: dict[str, Any] = {"drafting": "iid", "draft_probs": tree["draft_probs"]}
    args = (tree["logits"], tree["ids"], tree["parents"])
    out = verify_tree(*args, method=method, temperature=0.9, uniforms=uniforms, **drafted)
    probs = processed_probs(tree["logits"].reshape(-1, VOCAB), torch.full((2 * nodes,), 0.9))
    rule = traversal_verify if method == "traversal" else tree_verify
    expected = rule(probs.view(2, nodes, VOCAB), *args[1:], uniforms=uniforms, **drafted)
    for got, want in zip(out, expected, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(("method", "columns"), [(None, 2 * 2 + 1), ("traversal", len(PARENTS))])
def test_uniforms_a_greedy_batch_does_not_read_are_checked(
    method: str | None, columns: int
) -> None:
    """As in :func:`specsample.verify`, misshapen uniforms are refused even when every request
    is greedy; well-shaped ones leave the greedy walk as it is."""
    tree = _tree(1, seed=6)
    args = (tree["logits"], tree["ids"], tree["parents"])
    greedy: dict[str, Any] = {
        "method": method,
        "temperature": 0.0,
        "draft_probs": tree["draft_probs"],
    }
    with pytest.raises(ValueError, match=rf"^uniforms must have shape \(1, {columns}\)"):
        verify_tree(*args, uniforms=torch.zeros(1, columns + 1, dtype=torch.float64), **greedy)
    with pytest.raises(TypeError, match=r"^uniforms must be float64"):
        verify_tree(*args, uniforms=torch.zeros(1, columns), **greedy)
    out = verify_tree(*args, uniforms=torch.zeros(1, columns, dtype=torch.float64), **greedy)
    assert torch.equal(out.token_ids, tree_verify_greedy(*args).token_ids)
