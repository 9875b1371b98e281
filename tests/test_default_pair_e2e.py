"""End to end with the shipped default pair: speculative generation keeps the target's law.

* Temperature 1: the first two tokens generated after a fixed prompt, over ``ROWS`` seeded
  sequences, are compared with the target's exact two-token joint ``q(x1) q(x2 | x1)``
  (computed from the target alone) by one chi-square test per rule (chain and block;
  :func:`specsample.testing.joint_test`). The cells are fixed before sampling: every ``(x1,
  x2)`` with expected count >= 5, and one pooled cell for the rest. Each test fails a
  correct sampler with probability ``ALPHA`` = 1e-5 (2e-5 for the two); the smallest total-
  variation deviation of the joint that each detects with probability 0.99 is printed and
  asserted to be below ``MAX_DETECTABLE_TV``. The runs use the defaults, adaptive draft
  lengths and continuous batching: the rows get budgets of 2, 3 or 4 tokens, so they finish
  at different steps and new rows join batches whose other rows are mid-sequence; only the
  first two tokens are counted, so the law they follow must not depend on who shares the
  batch. The same test, on a quarter of the rows, rejects Medusa's typical acceptance
  (lossy) with p < 1e-5. Tree drafting passes the same test, with the same false-failure
  rate: three i.i.d. children of the root verified by the token-level rule (where one step
  emits one token, the next step feeds its accepted leaf to the draft model first), and two
  i.i.d. children with a child each verified by traversal verification.
* Temperature 0: speculative output equals target-only greedy output token for token, and
  both equal ``transformers``' own greedy ``generate``. The models run in float64 here, so
  that no near-tie between two logits can flip an argmax between the different batch shapes
  of the two loops (the weights are stored in bfloat16, so float64 holds them exactly).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample import adapter  # noqa: E402
from specsample.generate import TreeShape, speculative_generate, target_generate  # noqa: E402
from specsample.testing import detectable_tv, joint_test, two_token_joint  # noqa: E402

PROMPT = "self"
ROWS = 12_000
BATCH = 3_000
K = 2
ALPHA = 1e-5
MAX_DETECTABLE_TV = 0.07
GREEDY_PROMPTS = ("def parse(text):", "class Node:\n    def __init__(self, value):", "    for")
GREEDY_TOKENS = 96


@pytest.fixture(scope="module")
def dirs() -> tuple[Any, Any]:
    pair = adapter.default_pair()
    if pair is None:
        pytest.fail("the default model pair is not installed")
    return pair


@pytest.fixture(scope="module")
def shipped(dirs: tuple[Any, Any]) -> dict[str, Any]:
    return {
        "tokenizer": adapter.load_tokenizer(dirs[0]),
        "target": adapter.load_model(dirs[0], role="target"),
        "draft": adapter.load_model(dirs[1], role="draft"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("method", ["chain", "block"])
def test_first_two_tokens_follow_the_target(shipped: dict[str, Any], method: str) -> None:
    prompt = shipped["tokenizer"].encode(PROMPT)
    budgets = [2 + i % 3 for i in range(ROWS)]
    out = speculative_generate(
        shipped["target"],
        [prompt] * ROWS,
        shipped["draft"],
        k=K,
        method=method,
        temperature=1.0,
        max_new_tokens=budgets,
        seeds=list(range(ROWS)),
        max_batch_size=BATCH,
    )
    assert [len(s) for s in out.sequences] == budgets
    assert 0.0 < out.stats.acceptance_rate < 1.0
    assert out.stats.accepted_counts[0] > 0, "no step rejected its first draft"
    pvalue, df = joint_test(out.sequences, two_token_joint(shipped["target"], prompt))
    tv = detectable_tv(ROWS, df, ALPHA)
    print(f"{method}: chi-square p = {pvalue:.3g} ({df} df); detects TV >= {tv:.3f}")
    assert tv <= MAX_DETECTABLE_TV
    assert pvalue > ALPHA


TREE_SHAPES = {"mss": TreeShape((3,), "iid"), "traversal": TreeShape((2, 1), "iid")}
"""The tree of each tree rule's chi-square test (drafted as the rule requires)."""


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(TREE_SHAPES))
def test_first_two_tokens_follow_the_target_with_tree_drafts(
    shipped: dict[str, Any], rule: str
) -> None:
    """The two-token joint test on tree drafting, one forward per tree for every sequence."""
    prompt = shipped["tokenizer"].encode(PROMPT)
    budgets = [2] * ROWS
    out = speculative_generate(
        shipped["target"],
        [prompt] * ROWS,
        shipped["draft"],
        tree=TREE_SHAPES[rule],
        method=rule,
        temperature=1.0,
        max_new_tokens=budgets,
        seeds=list(range(ROWS)),
        max_batch_size=BATCH // 2,
    )
    assert [len(s) for s in out.sequences] == budgets
    assert out.stats.tokens_per_forward > 1.2
    pvalue, df = joint_test(out.sequences, two_token_joint(shipped["target"], prompt))
    tv = detectable_tv(ROWS, df, ALPHA)
    print(f"tree {rule}: chi-square p = {pvalue:.3g} ({df} df); detects TV >= {tv:.3f}")
    assert tv <= MAX_DETECTABLE_TV
    assert pvalue > ALPHA


@pytest.mark.slow
def test_the_joint_test_rejects_typical_acceptance(shipped: dict[str, Any]) -> None:
    """The same test on a quarter of the rows fails the lossy rule (the test has power)."""
    prompt = shipped["tokenizer"].encode(PROMPT)
    rows = ROWS // 4
    out = speculative_generate(
        shipped["target"],
        [prompt] * rows,
        shipped["draft"],
        k=K,
        method="typical",
        temperature=1.0,
        max_new_tokens=2,
        seeds=list(range(rows)),
        max_batch_size=BATCH,
    )
    pvalue, _ = joint_test(out.sequences, two_token_joint(shipped["target"], prompt))
    assert pvalue < ALPHA


@pytest.fixture(scope="module")
def shipped64(dirs: tuple[Any, Any], shipped: dict[str, Any]) -> dict[str, Any]:
    return {
        "tokenizer": shipped["tokenizer"],
        "target": adapter.load_model(dirs[0], role="target").double(),
        "draft": adapter.load_model(dirs[1], role="draft").double(),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "k", "adaptive", "batch", "tree"),
    [
        ("chain", 4, False, None, None),
        ("block", 4, False, None, None),
        ("chain", 7, False, None, None),
        ("chain", 4, True, None, None),
        ("chain", 4, True, 2, None),
        ("chain", 4, False, 2, TreeShape((2, 2, 1, 1), "deterministic")),
    ],
)
def test_greedy_equals_target_greedy(
    shipped64: dict[str, Any],
    method: str,
    k: int,
    adaptive: bool,
    batch: int | None,
    tree: TreeShape | None,
) -> None:
    """Greedy speculative output equals target greedy: fixed or adaptive draft lengths, with
    continuous batching (two places for three prompts), and with tree drafts."""
    tokenizer = shipped64["tokenizer"]
    prompts = [tokenizer.encode(p) for p in GREEDY_PROMPTS]
    target, draft = shipped64["target"], shipped64["draft"]
    expected = target_generate(target, prompts, max_new_tokens=GREEDY_TOKENS).sequences
    out = speculative_generate(
        target,
        prompts,
        draft,
        k=k,
        method=method,
        max_new_tokens=GREEDY_TOKENS,
        adaptive=adaptive,
        max_batch_size=batch,
        tree=tree,
    )
    assert out.sequences == expected
    assert out.stats.tokens_per_forward > 1.5
    for prompt, sequence in zip(prompts, expected, strict=True):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            reference = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=GREEDY_TOKENS,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )[0, len(prompt) :].tolist()
        # transformers stops at EOS; the loops here were given no EOS and go on.
        assert reference == sequence[: len(reference)]
        if len(reference) < GREEDY_TOKENS:
            assert reference[-1] == tokenizer.eos_token_id
