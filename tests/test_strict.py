"""Input validation: each error names the argument at fault and has the right type.

Shape, dtype and device errors are raised with or without strict mode; value errors (ids
out of range, negative or non-finite probabilities, rows not summing to 1) only in strict
mode, and without it the same inputs run to completion. ``verify_tree`` makes the value checks
of ``verify``, with its messages, whatever the temperature.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from specsample import Requests, SamplingParams, verify, verify_tree
from specsample.sampler import RejectionSampler

BATCH, K, VOCAB = 3, 4, 6

Inputs = dict[str, torch.Tensor]


def _valid() -> Inputs:
    generator = torch.Generator().manual_seed(0)
    target = torch.rand(BATCH, K, VOCAB, generator=generator) + 0.1
    draft = torch.rand(BATCH, K, VOCAB, generator=generator) + 0.1
    return {
        "target_probs": target / target.sum(dim=-1, keepdim=True),
        "bonus_token_ids": torch.randint(VOCAB, (BATCH, 1), generator=generator),
        "draft_probs": draft / draft.sum(dim=-1, keepdim=True),
        "draft_token_ids": torch.randint(VOCAB, (BATCH, K), generator=generator),
    }


def _call(sampler: RejectionSampler, inputs: Inputs, **kwargs: torch.Tensor) -> torch.Tensor:
    return sampler(
        inputs["target_probs"],
        inputs["bonus_token_ids"],
        inputs["draft_probs"],
        inputs["draft_token_ids"],
        **kwargs,
    )


def _replace(name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], Inputs]:
    def build() -> Inputs:
        inputs = _valid()
        inputs[name] = make(inputs[name])
        return inputs

    return build


def _set(index: tuple[int, ...], value: float | int) -> Callable[[torch.Tensor], torch.Tensor]:
    def make(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        tensor[index] = value
        return tensor

    return make


META = torch.device("meta")

STRUCTURE_ERRORS = [
    # rank
    ("target_probs", ValueError, lambda t: t[:, 0]),
    ("target_probs", ValueError, lambda t: t.unsqueeze(0)),
    ("draft_probs", ValueError, lambda t: t[:, 0]),
    ("draft_token_ids", ValueError, lambda t: t[:, 0]),
    ("draft_token_ids", ValueError, lambda t: t.unsqueeze(-1)),
    ("bonus_token_ids", ValueError, lambda t: t.unsqueeze(-1)),
    # shape
    ("draft_probs", ValueError, lambda t: torch.cat([t, t[:, :1]], dim=1)),
    ("draft_probs", ValueError, lambda t: t[..., :-1]),
    ("draft_probs", ValueError, lambda t: t[:-1]),
    ("draft_token_ids", ValueError, lambda t: t[:, :-1]),
    ("draft_token_ids", ValueError, lambda t: t[:-1]),
    ("bonus_token_ids", ValueError, lambda t: torch.cat([t, t], dim=1)),
    ("bonus_token_ids", ValueError, lambda t: t[:-1]),
    ("target_probs", ValueError, lambda t: t[..., :0]),
    # dtype
    ("target_probs", TypeError, lambda t: (t * 100).to(torch.int64)),
    ("target_probs", TypeError, lambda t: t.to(torch.float16)),
    ("draft_probs", TypeError, lambda t: (t * 100).to(torch.int32)),
    ("draft_probs", TypeError, lambda t: t.to(torch.float64)),
    ("draft_probs", TypeError, lambda t: t.to(torch.bfloat16)),
    ("draft_token_ids", TypeError, lambda t: t.to(torch.float32)),
    ("draft_token_ids", TypeError, lambda t: t.to(torch.uint8)),
    ("bonus_token_ids", TypeError, lambda t: t.to(torch.float64)),
    ("bonus_token_ids", TypeError, lambda t: t.to(torch.bool)),
    # not a tensor
    ("target_probs", TypeError, lambda t: t.tolist()),
    ("draft_token_ids", TypeError, lambda t: t.numpy()),
    # device
    ("draft_probs", ValueError, lambda t: t.to(META)),
    ("draft_token_ids", ValueError, lambda t: t.to(META)),
    ("bonus_token_ids", ValueError, lambda t: t.to(META)),
]


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
@pytest.mark.parametrize(("name", "error", "make"), STRUCTURE_ERRORS)
def test_structure_errors_name_the_argument(
    name: str, error: type[Exception], make: Callable[[torch.Tensor], torch.Tensor], strict: bool
) -> None:
    inputs = _replace(name, make)()
    with pytest.raises(error, match=name):
        _call(RejectionSampler(strict_mode=strict), inputs)


def test_target_on_another_device_names_the_others() -> None:
    """With the target on ``meta`` the first other argument is reported as misplaced."""
    inputs = _valid()
    inputs["target_probs"] = inputs["target_probs"].to(META)
    with pytest.raises(ValueError, match="bonus_token_ids"):
        _call(RejectionSampler(), inputs)


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
@pytest.mark.parametrize(
    ("name", "error", "value"),
    [
        ("seeds", TypeError, torch.zeros(BATCH)),
        ("seeds", ValueError, torch.zeros(BATCH + 1, dtype=torch.int64)),
        ("seeds", ValueError, torch.zeros(BATCH, dtype=torch.int64, device=META)),
        ("positions", TypeError, torch.zeros(BATCH, dtype=torch.int16)),
        ("positions", ValueError, torch.zeros(BATCH, 1, dtype=torch.int64)),
    ],
)
def test_seed_errors_name_the_argument(
    name: str, error: type[Exception], value: torch.Tensor, strict: bool
) -> None:
    with pytest.raises(error, match=name):
        _call(RejectionSampler(strict_mode=strict), _valid(), **{name: value})


VALUE_ERRORS = [
    ("draft_token_ids", _set((1, 2), -1)),
    ("draft_token_ids", _set((0, 0), VOCAB)),
    ("draft_token_ids", _set((2, 3), 1 << 40)),
    ("bonus_token_ids", _set((0, 0), -1)),
    ("bonus_token_ids", _set((2, 0), VOCAB)),
    ("target_probs", _set((1, 2, 3), -0.01)),
    ("draft_probs", _set((0, 0, 0), -1e-6)),
    ("target_probs", _set((2, 1, 0), float("nan"))),
    ("draft_probs", _set((1, 3, 5), float("inf"))),
    ("target_probs", _set((0, 3, 4), float("-inf"))),
    ("target_probs", lambda t: t * 0.9),
    ("draft_probs", lambda t: t * 1.1),
    ("draft_probs", _set((2, 0), 0.0)),
]


@pytest.mark.parametrize(("name", "make"), VALUE_ERRORS)
def test_value_errors_only_in_strict_mode(
    name: str, make: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    inputs = _replace(name, make)()
    with pytest.raises(ValueError, match=name):
        _call(RejectionSampler(strict_mode=True), inputs)
    out = _call(RejectionSampler(strict_mode=False), inputs)
    assert out.shape == (BATCH, K + 1)


def test_strict_mode_accepts_valid_inputs_and_rounding() -> None:
    """Rows off by less than the float32 tolerance (1e-4) and zero probabilities pass."""
    inputs = _valid()
    inputs["target_probs"] = inputs["target_probs"] * (1 + 5e-5)
    inputs["draft_probs"][0, 0] = torch.tensor([1.0, 0, 0, 0, 0, 0])
    inputs["draft_token_ids"][0, 0] = 0
    out = _call(RejectionSampler(strict_mode=True), inputs)
    assert out.shape == (BATCH, K + 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_strict_mode_tolerance_follows_the_dtype(dtype: torch.dtype) -> None:
    inputs = _valid()
    inputs["target_probs"] = inputs["target_probs"].to(dtype)
    inputs["draft_probs"] = inputs["draft_probs"].to(dtype)
    _call(RejectionSampler(strict_mode=True), inputs)
    inputs["draft_probs"] = inputs["draft_probs"] * 1.2
    with pytest.raises(ValueError, match="draft_probs"):
        _call(RejectionSampler(strict_mode=True), inputs)


def test_strict_errors_report_the_offending_value() -> None:
    inputs = _replace("draft_token_ids", _set((1, 1), 99))()
    with pytest.raises(ValueError, match=r"draft_token_ids must lie in \[0, 6\), found 99"):
        _call(RejectionSampler(strict_mode=True), inputs)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([0.5, 0.7, -0.2, 0.0], "negative"),
        ([0.5, 0.7, 0.2, 0.0], "sum to 1"),
        ([float("inf"), 0.0, 0.0, 0.0], "non-finite"),
        ([float("nan"), 0.0, 0.0, 1.0], "non-finite"),
    ],
)
def test_strict_verify_checks_draft_probabilities_like_the_sampler(
    row: list[float], message: str
) -> None:
    """``verify(strict=True)`` refuses draft rows that are not distributions.

    A negative draft probability would otherwise accept a token the target gives
    probability 0 (token 2 here, whose target logit is -inf).
    """
    from specsample import verify

    logits = torch.tensor([[0.0, 0.0, -float("inf"), 0.0], [0.0, 0.0, 0.0, 0.0]])
    drafts, probs = torch.tensor([2]), torch.tensor([row])
    seeded: dict[str, Any] = {"temperature": 1.0, "seeds": [1], "positions": [0]}
    with pytest.raises(ValueError, match=f"draft_probs .*{message}"):
        verify(logits, drafts, [1], draft_probs=probs, strict=True, **seeded)
    uniform = torch.full((1, 4), 0.25)
    out = verify(logits, drafts, [1], draft_probs=uniform, strict=True, **seeded)
    assert out.token_ids[0, 0] != 2


def _entry_args(entry: str) -> dict[str, Any]:
    """Valid seeded arguments of ``verify`` (two requests of 3 drafts) or ``verify_tree``
    (two trees of 4 nodes), with the distributions the drafts were drawn from."""
    gen = torch.Generator().manual_seed(5)
    seeded: dict[str, Any] = {"seeds": [1, 2], "positions": [0, 5]}
    layout: dict[str, Any] = {"num_draft_tokens": [3, 3]}
    rows: tuple[int, ...] = (8,)
    ids: tuple[int, ...] = (6,)
    if entry == "verify_tree":
        layout = {"parents": torch.tensor([-1, 0, 0, 1]), "drafting": "iid"}
        rows, ids = (2, 4), (2, 4)
    return {
        "target_logits": torch.randn(*rows, VOCAB, generator=gen),
        "draft_token_ids": torch.randint(VOCAB, ids, generator=gen),
        "draft_probs": torch.randn(*ids, VOCAB, generator=gen).softmax(dim=-1),
        **layout,
        **seeded,
    }


def _call_entry(entry: str, args: dict[str, Any], **kwargs: Any) -> Any:
    return (verify if entry == "verify" else verify_tree)(**args, **kwargs)


def _with(name: str, index: int, value: float) -> Callable[[dict[str, Any]], None]:
    """Set entry ``index`` of the flattened argument ``name`` to ``value``."""

    def change(args: dict[str, Any]) -> None:
        args[name].view(-1)[index] = value

    return change


def _scaled(args: dict[str, Any]) -> None:
    args["draft_probs"] = args["draft_probs"] * 1.5


def _unread_positions(args: dict[str, Any]) -> None:
    """Positions whose values were never read (as on an accelerator), in the requests."""
    params = SamplingParams(temperature=args.pop("temperature"), seeds=args.pop("seeds"))
    requests = Requests.build(2, torch.device("cpu"), params, positions=args.pop("positions"))
    args["requests"] = requests.at(torch.tensor([-1, 0]))


IN_VOCAB = r"draft_token_ids (of tree nodes )?must lie in \[0, 6\)$"
NON_FINITE = "draft_probs contains non-finite values$"


STRICT_VALUES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("nan logits", _with("target_logits", 15, math.nan), "target_logits contains NaN$"),
    ("id >= vocab", _with("draft_token_ids", -1, VOCAB), IN_VOCAB),
    ("id < 0", _with("draft_token_ids", -1, -1), IN_VOCAB),
    ("draft inf", _with("draft_probs", 1, math.inf), NON_FINITE),
    ("draft nan", _with("draft_probs", 1, math.nan), NON_FINITE),
    ("draft < 0", _with("draft_probs", 1, -0.5), "draft_probs contains negative values$"),
    ("draft sum", _scaled, r"draft_probs rows must sum to 1 within 0\.0001 \(torch\.float32\)"),
]
"""Case, change to valid arguments, the message at both entries (a regex from its start)."""


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
@pytest.mark.parametrize("entry", ["verify", "verify_tree"])
@pytest.mark.parametrize(
    ("change", "message"), [c[1:] for c in STRICT_VALUES], ids=[c[0] for c in STRICT_VALUES]
)
def test_verify_tree_refuses_in_strict_mode_what_verify_refuses(
    entry: str,
    temperature: float,
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    """The same values are refused at both entries with the same ``ValueError`` (a tree's ids:
    those of its nodes), even where no rule reads them (greedy rows); without strict mode the
    call completes."""
    args = {**_entry_args(entry), "temperature": temperature}
    change(args)
    with pytest.raises(ValueError) as raised:
        _call_entry(entry, args, strict=True)
    assert type(raised.value) is ValueError
    assert re.match(message, str(raised.value)), str(raised.value)
    assert _call_entry(entry, args).token_ids.shape[0] == 2


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
@pytest.mark.parametrize("entry", ["verify", "verify_tree"])
def test_unread_positions_are_checked_in_strict_mode(entry: str, temperature: float) -> None:
    """Positions whose values no check has read (as on an accelerator) are read in strict
    mode, at both entries, whether or not a rule draws numbers at them."""
    args = {**_entry_args(entry), "temperature": temperature}
    _unread_positions(args)
    with pytest.raises(ValueError, match=r"^positions must lie in \[0, 2\*\*40\), got -1$"):
        _call_entry(entry, args, strict=True)


@pytest.mark.parametrize("entry", ["verify", "verify_tree"])
def test_infinite_logits_are_accepted_alike_in_strict_mode(entry: str) -> None:
    """``-inf`` (masked tokens, a row with none left) and ``+inf`` logits are valid input at
    both entries: strict mode accepts them and emits the tokens of default mode."""
    args = _entry_args(entry)
    logits = args["target_logits"].view(-1, VOCAB)
    logits[0] = -math.inf
    logits[1, :2] = -math.inf
    logits[2, 3] = math.inf
    strict = _call_entry(entry, args, strict=True)
    default = _call_entry(entry, args)
    assert torch.equal(strict.token_ids, default.token_ids)


def test_tree_draft_rows_without_children_need_not_sum_to_one() -> None:
    """Only the rows children were drawn from are distributions: a leaf's row may be zero
    (as drafters leave it), the row of a node with children may not."""
    args = _entry_args("verify_tree")
    args["draft_probs"][:, 2:] = 0.0
    out = verify_tree(**args, strict=True)
    assert torch.equal(out.token_ids, verify_tree(**args).token_ids)
    args["draft_probs"][:, 1] = 0.0
    with pytest.raises(ValueError, match=r"^draft_probs rows must sum to 1"):
        verify_tree(**args, strict=True)
