"""End to end, the law of the tokens the loop samples (:mod:`specsample.generate`).

On the tiny random Llama pair of ``tests/tiny_llama.py`` (float32 copies), ``JOINT_ROWS =
40_000`` seeded sequences (20_000 for the third token) are sampled after a fixed prompt:
target-only, with a draft model under the chain and block rules (with and without
temperature, top-k and top-p), and with n-gram drafts. The first two tokens are checked
against the target's exact two-token joint (first-token distribution times each first
token's conditional) by a chi-square test over the cells with expected count >= 5 (the rest
pooled into one cell); the third token, reached through a step after all drafts were
accepted, against its exact marginal.

False failures: each test passes at p > ``JOINT_ALPHA = 1e-5``, so with these seven tests the
family-wise false-failure rate is below 1e-4 (for fresh seeds; the seeds here are fixed, so
the suite is deterministic).

Power (:func:`specsample.testing.detectable_tv`, at level 1e-5 with the cells each case has):
a deviation of the two-token joint of total variation >= 0.033 (0.032 for the cases with 191
cells, 0.033 with 225 to 227) is detected with probability >= 99%, and one of the third
token's marginal of total variation >= 0.037 (63 cells); deviations inside the pooled cell
are not seen.

Also checked here: the package imports without ``transformers``.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")

from specsample.generate import (  # noqa: E402
    ModelDrafter,
    NGramDrafter,
    speculative_generate,
    target_generate,
)
from specsample.probs import processed_probs  # noqa: E402
from tests.tiny_llama import VOCAB  # noqa: E402

JOINT_ROWS = 40_000
JOINT_BATCH = 10_000
JOINT_ALPHA = 1e-5
JOINT_PROMPT = [1, 2, 3, 4, 5]
NGRAM_PROMPT = [10, 6, 31, 10, 6]


def exact_joint(target: Any, prompt: list[int], **params: Any) -> torch.Tensor:
    """``P(x1 = a, x2 = b)`` under the target's processed distribution, ``[vocab, vocab]``."""
    with torch.no_grad():
        first = target(torch.tensor([prompt])).logits[0, -1:]
        second = target(torch.tensor([[*prompt, a] for a in range(VOCAB)])).logits[:, -1]

    def processed(logits: torch.Tensor) -> torch.Tensor:
        rows = logits.shape[0]
        filters = {
            name: torch.full((rows,), params[name])
            for name in ("top_k", "top_p")
            if params.get(name) is not None
        }
        temperature = torch.full((rows,), params.get("temperature", 1.0))
        return processed_probs(logits, temperature, **filters).double()

    joint = processed(first)[0].unsqueeze(1) * processed(second)
    return joint / joint.sum()


def chi_square_pvalue(sequences: list[list[int]], joint: torch.Tensor) -> float:
    pairs = torch.tensor([s[:2] for s in sequences])
    rows = pairs.shape[0]
    observed = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    observed.index_add_(0, pairs[:, 0] * VOCAB + pairs[:, 1], torch.ones(rows, dtype=torch.float64))
    expected = joint.reshape(-1) * rows
    assert observed[expected == 0].sum() == 0, "a pair of probability 0 was generated"
    big = expected >= 5
    assert int(big.sum()) >= 50, "the joint is too concentrated for a useful test"
    obs, exp = observed[big], expected[big]
    if not bool(big.all()):
        obs = torch.cat([obs, observed[~big].sum().reshape(1)])
        exp = torch.cat([exp, expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(scipy_stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


JOINT_CASES: dict[str, dict[str, Any]] = {
    "target-only": {},
    "draft-chain": {"drafter": "model", "k": 2, "method": "chain"},
    "draft-block": {"drafter": "model", "k": 2, "method": "block"},
    "ngram-chain": {"drafter": "ngram", "k": 3, "method": "chain", "prompt": NGRAM_PROMPT},
    "draft-chain-filtered": {
        "drafter": "model",
        "k": 2,
        "method": "chain",
        "temperature": 1.5,
        "top_k": 20,
        "top_p": 0.95,
    },
    "draft-block-filtered": {
        "drafter": "model",
        "k": 2,
        "method": "block",
        "temperature": 1.5,
        "top_k": 20,
        "top_p": 0.95,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(JOINT_CASES))
def test_first_two_tokens_follow_the_target_joint(pair32, case) -> None:
    target, draft = pair32
    spec = dict(JOINT_CASES[case])
    prompt = spec.pop("prompt", JOINT_PROMPT)
    drafter = spec.pop("drafter", None)
    names = ("temperature", "top_k", "top_p")
    params: dict[str, Any] = {name: spec.pop(name) for name in names if name in spec}
    params.setdefault("temperature", 1.0)
    common: dict[str, Any] = {
        "max_new_tokens": 2,
        "max_batch_size": JOINT_BATCH,
        "seeds": list(range(JOINT_ROWS)),
        **params,
    }
    prompts = [prompt] * JOINT_ROWS
    if drafter is None:
        out = target_generate(target, prompts, **common)
    else:
        source = ModelDrafter(draft) if drafter == "model" else NGramDrafter()
        out = speculative_generate(target, prompts, source, **spec, **common)
        assert 0.0 < out.stats.acceptance_rate < 1.0
    assert all(len(s) == 2 for s in out.sequences)
    pvalue = chi_square_pvalue(out.sequences, exact_joint(target, prompt, **params))
    print(f"{case}: chi-square p = {pvalue:.4g}")
    assert pvalue > JOINT_ALPHA


def test_third_token_after_all_accepted_follows_the_target(pair32) -> None:
    """k = 1: after an accepted draft the next draft forward feeds two slots (the pending one).

    (With k = 1 block verification is the chain rule, so one test covers both.)
    """
    target, draft = pair32
    rows = JOINT_ROWS // 2
    out = speculative_generate(
        target,
        [JOINT_PROMPT] * rows,
        draft,
        k=1,
        temperature=1.0,
        max_new_tokens=3,
        max_batch_size=JOINT_BATCH,
        seeds=list(range(rows)),
    )
    counts = out.stats.accepted_counts
    assert counts[1] > rows // 4, "too few steps accepted their draft to exercise the path"
    joint = exact_joint(target, JOINT_PROMPT)
    prefixes = [[*JOINT_PROMPT, a, b] for a in range(VOCAB) for b in range(VOCAB)]
    with torch.no_grad():
        logits = target(torch.tensor(prefixes)).logits[:, -1]
    third = processed_probs(logits, torch.ones(len(prefixes))).double()
    marginal = (joint.reshape(-1, 1) * third).sum(dim=0)
    observed = torch.bincount(torch.tensor([s[2] for s in out.sequences]), minlength=VOCAB)
    expected = marginal / marginal.sum() * rows
    assert observed[expected == 0].sum() == 0
    big = expected >= 5
    obs = torch.cat([observed[big].double(), observed[~big].sum().double().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    pvalue = float(scipy_stats.chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue)
    print(f"third token: chi-square p = {pvalue:.4g}")
    assert pvalue > JOINT_ALPHA


def test_import_without_transformers() -> None:
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import specsample, specsample.generate, specsample.cli\n"
        "from specsample.generate import NGramDrafter\n"
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
