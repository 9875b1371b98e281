"""Results that must not change with memory layout, and extreme values that must not overflow.

* The same values in any memory layout (column-major, transposed, a padded-vocabulary
  slice) give the same tokens, for every entry point, rule and draft kind.
* ``z`` is measured from each row's largest logit, so a logit of ``3e38`` at ``T = 0.5``
  keeps its distribution; a ``+inf`` logit is the argmax of a greedy row, and a sampled row
  with ``+inf`` logits is uniform over them (the limit of the softmax).

Each backend that can run here is tested (the Triton one under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from specsample import RejectionSampler, verify, verify_padded
from specsample.kernels import triton as kernels
from specsample.probs import processed_probs

BACKENDS = ["torch"] + (["triton"] if kernels.supports(torch.zeros(1)) else [])


def _column_major(x: torch.Tensor) -> torch.Tensor:
    """The same values with the last two dimensions' strides swapped."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def _padded_vocab(x: torch.Tensor) -> torch.Tensor:
    """The same values as a slice of a wider tensor (row stride larger than the vocabulary)."""
    wide = torch.full((*x.shape[:-1], x.shape[-1] + 3), 7.0, dtype=x.dtype)
    wide[..., : x.shape[-1]] = x
    return wide[..., : x.shape[-1]]


LAYOUTS = {"column-major": _column_major, "padded vocabulary": _padded_vocab}


def test_the_reported_column_major_case() -> None:
    """The target is certain at token 7: any layout must emit 7 (it emitted 14)."""
    logits = torch.full((2, 30), -1e4)
    logits[0, 7] = 10.0
    logits[1, 5] = 10.0
    cm = logits.t().contiguous().t()
    args: dict[str, Any] = {"temperature": [1.0], "seeds": [0], "positions": [0]}
    assert verify(logits, torch.tensor([3]), [1], **args).token_ids.tolist() == [[7, -1]]
    assert verify(cm, torch.tensor([3]), [1], **args).token_ids.tolist() == [[7, -1]]


def _flat_case(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    counts = [3, 1, 2, 0]
    total = sum(counts)
    draft_probs = torch.softmax(2 * torch.randn(total, 40, generator=g), -1)
    return {
        "target_logits": 2 * torch.randn(total + len(counts), 40, generator=g),
        "draft_token_ids": torch.multinomial(draft_probs, 1, generator=g).view(-1),
        "draft_probs": draft_probs,
        "uniforms": torch.rand(len(counts), 4, dtype=torch.float64, generator=g),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(
    ("method", "drafts"),
    [
        ("chain", "probs"),
        ("chain", "logits"),
        ("chain", "one-hot"),
        ("block", "probs"),
        ("block", "logits"),
    ],
)
def test_verify_does_not_depend_on_strides(
    method: str, drafts: str, layout: str, backend: str
) -> None:
    """Target and draft rows in another layout give identical tokens, on the same uniforms."""
    case = _flat_case(1)
    counts = [3, 1, 2, 0]
    draft: dict[str, torch.Tensor] = {}
    if drafts == "probs":
        draft["draft_probs"] = case["draft_probs"]
    elif drafts == "logits":
        draft["draft_logits"] = case["draft_probs"].log()
    common = {
        "uniforms": case["uniforms"],
        "method": method,
        "backend": backend,
        "temperature": [1.0, 0.7, 0.0, 1.3],
        "top_k": [0, 5, 0, 3],
    }
    expected = verify(case["target_logits"], case["draft_token_ids"], counts, **draft, **common)
    moved = LAYOUTS[layout]
    got = verify(
        moved(case["target_logits"]),
        case["draft_token_ids"],
        counts,
        **{name: moved(rows) for name, rows in draft.items()},
        **common,
    )
    assert torch.equal(got.token_ids, expected.token_ids)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("method", ["chain", "block"])
def test_rejection_sampler_does_not_depend_on_strides(
    method: str, layout: str, backend: str
) -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.softmax(2 * torch.randn(5, 3, 50, generator=g), -1)
    p = torch.softmax(2 * torch.randn(5, 3, 50, generator=g), -1)
    ids = torch.multinomial(p.view(-1, 50), 1, generator=g).view(5, 3)
    bonus = torch.randint(0, 50, (5, 1), generator=g)
    u = torch.rand(5, 4, dtype=torch.float64, generator=g)
    sampler = RejectionSampler(method=method, backend=backend)
    expected = sampler(q, bonus, p, ids, uniforms=u)
    moved = LAYOUTS[layout]
    assert torch.equal(sampler(moved(q), bonus, moved(p), ids, uniforms=u), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_padded_does_not_depend_on_strides(backend: str) -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 3, 30, generator=g)
    ids = torch.randint(0, 30, (4, 2), generator=g)
    u = torch.rand(4, 3, dtype=torch.float64, generator=g)
    expected = verify_padded(logits, ids, uniforms=u, backend=backend).token_ids
    permuted = logits.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    assert torch.equal(
        verify_padded(permuted, ids, uniforms=u, backend=backend).token_ids, expected
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_logit_keeps_its_distribution(backend: str) -> None:
    """A finite logit of 3e38 at T = 0.5 is certain (it emitted token 0: ``z`` overflowed)."""
    logits = torch.zeros(2, 16)
    logits[0, 11] = 3e38
    logits[1, 4] = 3e38
    for seed in range(20):
        seeded = {"seeds": [seed], "positions": [0]}
        out = verify(logits, torch.tensor([2]), [1], temperature=0.5, backend=backend, **seeded)
        assert out.token_ids.tolist() == [[11, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_row_with_plus_infinity_emits_it(backend: str) -> None:
    """A ``+inf`` logit is the argmax (it emitted token 0)."""
    logits = torch.zeros(2, 16)
    logits[0, 9] = math.inf
    logits[1, 3] = math.inf
    out = verify(logits, torch.tensor([9]), [1], temperature=0.0, backend=backend)
    assert out.token_ids.tolist() == [[9, 3]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_row_with_plus_infinities_is_uniform_over_them(backend: str) -> None:
    """Two ``+inf`` logits: every draw is one of them, each about half the time.

    2000 draws; the count of token 2 is Binomial(2000, 1/2): outside 1000 +- 150 with
    probability below 1e-11 (the test's false-failure rate), and a split of 40/60 or worse
    would fall outside it with probability above 0.99.
    """
    logits = torch.zeros(1, 8)
    logits[0, 2] = logits[0, 5] = math.inf
    rows = logits.expand(2000, 8).contiguous()
    out = verify(
        rows,
        torch.zeros(0, dtype=torch.int64),
        [0] * 2000,
        seeds=list(range(2000)),
        positions=[0] * 2000,
        backend=backend,
    )
    tokens = out.token_ids[:, 0]
    assert set(tokens.tolist()) == {2, 5}
    assert abs(int((tokens == 2).sum()) - 1000) < 150
    probs = processed_probs(logits, torch.ones(1))
    assert probs.tolist() == [[0.0, 0.0, 0.5, 0.0, 0.0, 0.5, 0.0, 0.0]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_with_plus_infinity_is_one_hot(backend: str) -> None:
    """Draft logits with one ``+inf``: the draft has probability 1 there (accepted iff
    ``u < q(x)``), never NaN."""
    g = torch.Generator().manual_seed(4)
    target = torch.randn(2, 10, generator=g)
    draft_logits = torch.zeros(1, 10)
    draft_logits[0, 6] = math.inf
    u = torch.tensor([[0.0, 0.5]], dtype=torch.float64)
    out = verify(
        target, torch.tensor([6]), [1], draft_logits=draft_logits, uniforms=u, backend=backend
    )
    assert out.token_ids[0, 0] == 6


def test_logprobs_do_not_depend_on_strides() -> None:
    """Found by fuzzing: the log-normaliser summed a column-major chunk in another order."""
    logits = torch.tensor(
        [
            [-0.3099, -0.0561, 0.5174, -1.5962, 0.4990],
            [0.8780, 0.3894, 1.4625, 0.4795, -0.5334],
            [-0.0347, 0.6573, -0.3112, -0.5620, -0.4835],
            [-1.2721, -0.1740, 0.5541, -0.1817, -0.2345],
        ]
    )
    u = torch.full((4, 1), 0.5, dtype=torch.float64)
    none = torch.zeros(0, dtype=torch.int64)
    a = verify(logits, none, [0] * 4, return_logprobs=True, uniforms=u)
    b = verify(_column_major(logits), none, [0] * 4, return_logprobs=True, uniforms=u)
    assert a.logprobs is not None and b.logprobs is not None
    assert torch.equal(a.logprobs, b.logprobs)


def test_block_rule_never_accepts_a_draft_of_zero_weight() -> None:
    """Found by fuzzing: given uniforms below 0 made ``eta < h`` pass where ``h = 0``."""
    u = torch.full((1, 2), -0.5, dtype=torch.float64)
    one = torch.ones(1, 1, 1)
    out = RejectionSampler(method="block")(
        one, torch.tensor([[0]]), one, torch.tensor([[1]]), uniforms=u
    )
    assert out.tolist() == [[0, -1]]


def test_empty_batch_still_validates_scalar_parameters() -> None:
    """Found by fuzzing: a scalar parameter was checked only once expanded to the batch."""
    with pytest.raises(ValueError, match="temperature"):
        verify(torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64), [], temperature=-1.0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["chain", "block"])
def test_given_bonus_ids_on_every_backend(method: str, backend: str) -> None:
    """vLLM v1's convention (draft rows only, bonus ids given): every backend gives the
    reference tokens, and a request whose drafts all pass emits its bonus id."""
    case = _flat_case(5)
    counts = [3, 1, 2, 0]
    starts = torch.tensor([0, 4, 6, 9])
    keep = torch.ones(case["target_logits"].shape[0], dtype=torch.bool)
    keep[starts + torch.tensor(counts)] = False
    rows = case["target_logits"][keep]
    bonus = torch.tensor([11, 12, 13, 14])
    common: dict[str, Any] = {
        "uniforms": case["uniforms"],
        "method": method,
        "draft_probs": case["draft_probs"],
        "temperature": [1.0, 0.0, 0.8, 0.0],
        "bonus_token_ids": bonus,
    }
    expected = verify(rows, case["draft_token_ids"], counts, backend="torch", **common)
    got = verify(rows, case["draft_token_ids"], counts, backend=backend, **common)
    assert torch.equal(got.token_ids, expected.token_ids)
    done = expected.num_accepted == torch.tensor(counts)
    emitted = expected.token_ids.gather(1, expected.num_accepted.view(-1, 1)).view(-1)
    assert bool(done.any()) and torch.equal(emitted[done], bonus[done])
    greedy = verify(
        rows, rows.argmax(-1), counts, temperature=0.0, backend=backend, bonus_token_ids=bonus
    )
    assert greedy.token_ids.gather(1, torch.tensor(counts).view(-1, 1)).view(-1).tolist() == [
        11,
        12,
        13,
        14,
    ]
