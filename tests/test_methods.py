"""The registry of methods and tree drafting modes (:mod:`specsample.methods`).

The registry only names things; that each refused (drafting, method) pair is biased and each
allowed one exact is shown by exact enumeration in :mod:`tests.test_tree` (top-down rules)
and :mod:`tests.test_traversal` (traversal verification). Here: the tables agree with each
other and with the checks that read them.
"""

from __future__ import annotations

import pytest

from specsample.methods import (
    MAX_SIMULATED_TREE_NODES,
    MAX_STEP_TREE_NODES,
    METHODS,
    TREE_DRAFTINGS,
    chain_methods,
    check_method,
    check_traversal_drafting,
    tree_draftings,
    tree_method,
    tree_methods,
)


def test_method_names_split_into_chain_and_tree() -> None:
    assert set(chain_methods(lossy=True)) | set(tree_methods()) == set(METHODS)
    assert not set(chain_methods(lossy=True)) & set(tree_methods())
    assert chain_methods() == tuple(m for m in chain_methods(lossy=True) if METHODS[m].exact)
    assert set(tree_methods(top_down=True)) < set(tree_methods())
    assert all(METHODS[m].exact for m in tree_methods())


def test_every_drafting_calls_for_an_exact_top_down_rule() -> None:
    """The derived rule and the one-hot rule are exact for every mode; refused methods are
    tree methods with a reason."""
    for drafting in tree_draftings():
        entry = TREE_DRAFTINGS[drafting]
        assert tree_method(drafting) == entry.rule
        assert entry.rule in entry.exact and "onehot" in entry.exact
        refused = dict(entry.refused)
        assert set(refused) <= set(tree_methods()) and all(refused.values())
        assert set(entry.exact) | set(refused) == set(tree_methods())


def test_tree_method_refuses_exactly_the_registered_pairs() -> None:
    for drafting in tree_draftings():
        for method in tree_methods(top_down=True):
            why = TREE_DRAFTINGS[drafting].reason(method)
            if why is None:
                assert tree_method(drafting, method) == method
            else:
                with pytest.raises(ValueError, match="biased") as refused:
                    tree_method(drafting, method)
                assert why in str(refused.value)
    with pytest.raises(ValueError, match="own entry point"):
        tree_method("iid", "traversal")
    with pytest.raises(ValueError, match="method must be one of"):
        tree_method("iid", "block")
    with pytest.raises(TypeError, match="method must be a str"):
        tree_method("iid", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="drafting must be one of"):
        tree_method("topk")
    with pytest.raises(TypeError, match="drafting must be a str"):
        tree_method(None)  # type: ignore[arg-type]


def test_traversal_draftings() -> None:
    assert tree_draftings("traversal") == ("iid", "without_replacement")
    for drafting in tree_draftings("traversal"):
        assert check_traversal_drafting(drafting) == drafting
    with pytest.raises(ValueError, match="drafting='deterministic' is refused"):
        check_traversal_drafting("deterministic")
    with pytest.raises(ValueError, match="drafting must be one of"):
        check_traversal_drafting("topk")


def test_check_method_and_tree_node_limits() -> None:
    assert check_method("mss", tree_methods()) == "mss"
    with pytest.raises(ValueError, match="method must be one of"):
        check_method("mss", chain_methods())
    with pytest.raises(TypeError, match="method must be a str"):
        check_method(None, chain_methods())
    assert 2 <= MAX_STEP_TREE_NODES < MAX_SIMULATED_TREE_NODES
