"""The randomness arguments of the entry points, validated (:mod:`specsample.params.seeding`).

Seeds, generators, a caller's :class:`~specsample.params.seeding.Seeding` and absolute positions:
every accepted form gives the values it stands for, and every refused one raises a
``TypeError`` (wrong type) or ``ValueError`` (wrong value, length, shape or device) whose
message names the argument. What a Seeding then draws is tested in ``tests/test_random.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from specsample import (
    RejectionSampler,
    Requests,
    SamplingParams,
    verify,
    verify_padded,
    verify_tree,
)
from specsample.params.seeding import (
    MAX_POSITION,
    Seeding,
    check_position_values,
    check_seeding,
    check_seeds,
    positions_from,
    require_positions,
    seeding_from,
)
from specsample.rules.tree import traversal_verify, tree_verify

CPU = torch.device("cpu")


def test_host_seeds_take_none_minus_one_and_every_64_bit_value() -> None:
    top = (1 << 64) - 1
    assert check_seeds([0, None, -1, top], 4) == [0, None, None, top]
    assert check_seeds(None, 3) is None
    device_seeds = torch.tensor([5, -1], dtype=torch.int32)
    assert check_seeds(device_seeds, 2) is device_seeds


@pytest.mark.parametrize(
    ("seeds", "error", "match"),
    [
        ([1, 2], ValueError, r"seeds must have one entry per row \(3\), got 2"),
        ([1, 2, 1 << 64], ValueError, r"seeds entries must lie in \[0, 2\*\*64\)"),
        ([1, 2, -2], ValueError, r"seeds entries must lie in \[0, 2\*\*64\)"),
        ([1, 2, True], TypeError, "seeds entries must be int, got bool"),
        ([1, 2, 3.0], TypeError, "seeds entries must be int, got float"),
        ("abc", TypeError, "seeds must be a tensor or a sequence"),
        (torch.tensor([1.0, 2.0, 3.0]), TypeError, "seeds must be an int64 or int32 tensor"),
        (torch.tensor([1, 2]), ValueError, r"seeds must have shape \(3,\)"),
    ],
)
def test_bad_seeds_are_refused_naming_seeds(seeds: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        check_seeds(seeds, 3)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        seeding_from(3, CPU, seeds=seeds)  # type: ignore[arg-type]


def test_seeding_from_combines_seeds_generators_and_the_shared_generator() -> None:
    own = torch.Generator().manual_seed(1)
    shared = torch.Generator().manual_seed(2)
    seeding = seeding_from(4, CPU, seeds=[7, None, -1, None], generators={2: own}, generator=shared)
    assert isinstance(seeding, Seeding) and seeding.batch == 4
    assert seeding.seeds is not None and seeding.seeds.tolist() == [7, -1, -1, -1]
    assert seeding.generators == ((2, own),)
    assert seeding.generator is shared
    assert seeding.shared_rows is not None and seeding.shared_rows.tolist() == [1, 3]
    assert seeding_from(2, CPU).seeds is None


def test_seeding_from_refuses_bad_generators_naming_them() -> None:
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator, got int"):
        seeding_from(2, CPU, generator=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"generators has row 2, outside \[0, 2\)"):
        seeding_from(2, CPU, generators={2: torch.Generator()})
    with pytest.raises(TypeError, match=r"seeded_seqs\[0\] must be a torch.Generator"):
        seeding_from(2, CPU, generators={0: 5}, generators_name="seeded_seqs")  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="generator draws on cpu but the batch is on meta"):
        seeding_from(2, torch.device("meta"), generator=torch.Generator())


def test_check_seeding_takes_none_or_a_seeding_built_for_the_batch() -> None:
    fresh = check_seeding(None, 3, CPU)
    assert fresh.batch == 3 and fresh.seeds is None and fresh.generators == ()
    built = seeding_from(3, CPU, seeds=[1, 2, 3])
    assert check_seeding(built, 3, CPU) is built
    with pytest.raises(
        TypeError, match=r"seeding must be a specsample\.params\.seeding\.Seeding or None"
    ):
        check_seeding([1, 2, 3], 3, CPU)
    with pytest.raises(ValueError, match="seeding has 3 rows but the batch has 2"):
        check_seeding(built, 2, CPU)
    with pytest.raises(ValueError, match=r"seeding was built for cpu \(its seeds\)"):
        check_seeding(built, 3, torch.device("meta"))


def test_positions_are_int64_on_the_batch_device() -> None:
    assert positions_from(None, 2, CPU) is None
    from_list = positions_from([4, 0, MAX_POSITION - 1], 3, CPU)
    assert from_list is not None and from_list.dtype == torch.int64
    assert from_list.tolist() == [4, 0, MAX_POSITION - 1]
    from_int32 = positions_from(torch.tensor([3, 9], dtype=torch.int32), 2, CPU)
    assert from_int32 is not None and from_int32.dtype == torch.int64
    assert from_int32.tolist() == [3, 9]


@pytest.mark.parametrize(
    ("positions", "error", "match"),
    [
        ([1, -1], ValueError, r"positions entries must lie in \[0, 2\*\*40\)"),
        ([1, MAX_POSITION], ValueError, r"positions entries must lie in \[0, 2\*\*40\)"),
        (torch.tensor([1, -4]), ValueError, r"positions entries must lie in \[0, 2\*\*40\)"),
        ([1], ValueError, r"positions must have one entry per row \(2\), got 1"),
        ([1, 2.5], TypeError, "positions entries must be int, got float"),
        (7, TypeError, "positions must be a tensor or a sequence"),
        (torch.tensor([1.0, 2.0]), TypeError, "positions must be an int64 or int32 tensor"),
        (torch.tensor([[1, 2]]), ValueError, r"positions must have shape \(2,\)"),
    ],
)
def test_bad_positions_are_refused_naming_positions(
    positions: object, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        positions_from(positions, 2, CPU)  # type: ignore[arg-type]


def test_strict_position_check_reads_the_values() -> None:
    check_position_values(None)
    check_position_values(torch.tensor([0, MAX_POSITION - 1]))
    check_position_values(torch.zeros(0, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 2\*\*40\), got -3"):
        check_position_values(torch.tensor([2, -3]))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 2\*\*40\)"):
        check_position_values(torch.tensor([MAX_POSITION]))


# --------------------------------------------------------------------------------------
# Seeds need positions, at every entry point
# --------------------------------------------------------------------------------------


def test_require_positions_refuses_counter_seeds_only() -> None:
    seeded = seeding_from(2, CPU, seeds=[3, None])
    with pytest.raises(ValueError, match=r"seeds need positions.*position 0 again"):
        require_positions(seeded, None)
    require_positions(seeded, torch.zeros(2, dtype=torch.int64))
    require_positions(seeding_from(2, CPU, seeds=[None, -1]), None)
    require_positions(seeding_from(2, CPU, generators={0: torch.Generator()}), None)
    device_seeds = seeding_from(2, CPU, seeds=torch.tensor([-1, -1]))
    with pytest.raises(ValueError, match="seeds need positions"):
        require_positions(device_seeds, None)


def _chain() -> dict[str, Any]:
    """One request with two drafts, its target rows then its bonus row, as verify takes it."""
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    return {"target_logits": logits, "draft_token_ids": torch.tensor([1, 2]), "counts": [2]}


def _entry_points() -> dict[str, Callable[..., object]]:
    """Every public entry point that takes seeds, on one request with seed 5."""
    chain, cpu = _chain(), torch.device("cpu")
    logits, ids, counts = chain["target_logits"], chain["draft_token_ids"], chain["counts"]
    probs = torch.softmax(logits, -1).unsqueeze(0)
    tree = {
        "draft_token_ids": torch.tensor([[0, 1, 2]]),
        "parents": torch.tensor([-1, 0, 0]),
        "drafting": "deterministic",
    }

    def by_requests(**at: Any) -> object:
        requests = Requests.build(1, cpu, SamplingParams(seeds=[5]))
        return verify(logits, ids, counts, requests=requests, **at)

    def sampler(**at: Any) -> object:
        bonus = torch.tensor([[0]])
        return RejectionSampler()(probs, bonus, probs[:, :2], ids.view(1, 2), seeds=[5], **at)

    def rules(**at: Any) -> object:
        seeding = seeding_from(1, cpu, seeds=[5])
        return tree_verify(probs, **tree, seeding=seeding, **at)

    def traversal(**at: Any) -> object:
        tokens, parents = tree["draft_token_ids"], tree["parents"]
        seeding = seeding_from(1, cpu, seeds=[5])
        iid = {"drafting": "iid", "draft_probs": probs}
        return traversal_verify(probs, tokens, parents, **iid, seeding=seeding, **at)

    return {
        "verify": lambda **at: verify(logits, ids, counts, seeds=[5], **at),
        "verify_padded": lambda **at: verify_padded(
            logits.unsqueeze(0), ids.view(1, 2), seeds=[5], **at
        ),
        "verify_tree": lambda **at: verify_tree(logits.unsqueeze(0), **tree, seeds=[5], **at),
        "requests": by_requests,
        "RejectionSampler": sampler,
        "tree_verify": rules,
        "traversal_verify": traversal,
    }


@pytest.mark.parametrize("entry", list(_entry_points()))
def test_seeds_without_positions_are_refused_at_every_entry_point(entry: str) -> None:
    """Without positions every step would read position 0's numbers: refused, not defaulted."""
    call = _entry_points()[entry]
    with pytest.raises(ValueError, match="seeds need positions"):
        call()
    first, again = call(positions=[7]), call(positions=torch.tensor([7]))
    assert _tokens(first) == _tokens(again)


def _tokens(out: object) -> list[int]:
    """The emitted tokens of any entry point's output."""
    tensor = out if isinstance(out, torch.Tensor) else out.token_ids  # type: ignore[attr-defined]
    return list(tensor.tolist())


def test_generators_and_unseeded_requests_need_no_positions() -> None:
    """vLLM's per-request generators (``seeded_seqs``) advance their own state: no positions."""
    chain = _chain()
    logits, ids, counts = chain["target_logits"], chain["draft_token_ids"], chain["counts"]
    verify(logits, ids, counts, generators={0: torch.Generator().manual_seed(1)})
    verify(logits, ids, counts, seeds=[None])
    probs = torch.softmax(logits, -1).unsqueeze(0)
    generators = {0: torch.Generator().manual_seed(1)}
    RejectionSampler()(probs, torch.tensor([[0]]), probs[:, :2], ids.view(1, 2), generators)
