"""specsample's vLLM sampler beside vLLM's own, on the same batches.

vLLM's ``RejectionSampler`` runs Triton kernels; on a machine without a GPU they run under
Triton's interpreter (``TRITON_INTERPRET=1``, with ``CUDA_VISIBLE_DEVICES=`` so that vLLM
keeps Triton although it finds no active driver: ``make test-vllm`` sets both). The module
is skipped where vLLM's kernels cannot run. vLLM's top-k/top-p kernel asks the platform for
its number of compute units, which a CPU-only machine has no answer for, so the batches
here use temperatures, penalties, bad words and allowed-token masks, not top-k/top-p (those
are tested against vLLM's own PyTorch function in ``test_sampler.py``).

* Greedy requests, alone or beside sampled ones, give vLLM's tokens exactly, with vLLM's
  penalties, bad words and allowed-token mask applied, and the same logprobs.
* On one fixture, both samplers pass the project's exactness harness. The interpreter runs
  a Triton program at a time, so vLLM's sampler sees ``VLLM_ROWS = 3_000`` sequences (about
  half a minute) and specsample's ``ROWS = 100_000``; each report's false-failure rate is
  ``ALPHA = 1e-4``, and each test states the smallest total variation at output position 0
  it detects with probability 99%.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm.triton_utils import HAS_TRITON
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler

from specsample.integrations.vllm.sampler import SpecsampleRejectionSampler
from specsample.integrations.vllm.testing import sampling_metadata, spec_metadata
from specsample.testing import exactness_report
from tests.test_logits_exactness import ALPHA, ROWS, VOCAB, _tables
from tests.vllm_integration.test_sampler import _family, vllm_verifier

pytestmark = pytest.mark.skipif(
    not HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1",
    reason="vLLM's kernels on CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)",
)

VLLM_ROWS = 3_000


def _pair(logprobs_mode: str = "raw_logprobs") -> tuple[Any, Any]:
    ours = SpecsampleRejectionSampler(Sampler(logprobs_mode), method="chain", backend="torch")
    return ours, RejectionSampler(Sampler(logprobs_mode))


def _batch(seed: int, temperature: list[float], **options: Any) -> tuple[Any, torch.Tensor, Any]:
    """Ragged drafts (3, 0, 1, 2 tokens, some equal to their row's argmax), vLLM's layout."""
    gen = torch.Generator().manual_seed(seed)
    counts = [3, 0, 1, 2]
    logits = torch.randn(sum(counts) + len(counts), VOCAB, generator=gen) * 2
    metadata = spec_metadata([[0] * n for n in counts])
    drafts = logits[metadata.target_logits_indices].argmax(dim=-1)
    flip = torch.rand(drafts.shape, generator=gen) < 0.3
    drafts = torch.where(flip, torch.randint(0, VOCAB, drafts.shape, generator=gen), drafts)
    metadata.draft_token_ids = drafts.to(torch.int32)
    return metadata, logits, sampling_metadata(temperature, vocab=VOCAB, **options)


def _with_penalties(batch: Any, seed: int) -> Any:
    """vLLM's repetition, presence and frequency penalties and single-token bad words."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, VOCAB, (4, 5), generator=gen)
    return dataclasses.replace(
        batch,
        no_penalties=False,
        prompt_token_ids=prompts,
        output_token_ids=[torch.randint(0, VOCAB, (3,), generator=gen).tolist() for _ in range(4)],
        repetition_penalties=torch.tensor([1.3, 1.0, 1.1, 1.5]),
        presence_penalties=torch.tensor([0.5, 0.0, 0.2, 0.0]),
        frequency_penalties=torch.tensor([0.3, 0.1, 0.0, 0.0]),
        bad_words_token_ids={0: [[int(prompts[0, 0])]], 2: [[1]]},
    )


@pytest.mark.parametrize("seed", range(4))
def test_greedy_output_and_logprobs_equal_vllms(seed: int) -> None:
    mask = torch.zeros(4, VOCAB, dtype=torch.bool)
    mask[3, seed] = True
    metadata, logits, batch = _batch(
        seed, [0.0] * 4, max_num_logprobs=3, allowed_token_ids_mask=mask
    )
    batch = _with_penalties(batch, seed)
    ours, theirs = _pair()
    got = ours(metadata, None, logits.clone(), batch)
    want = theirs(metadata, None, logits.clone(), batch)
    assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    assert got.sampled_token_ids.dtype == want.sampled_token_ids.dtype
    for mine, vllms in zip(got.logprobs_tensors, want.logprobs_tensors, strict=True):
        if isinstance(mine, torch.Tensor):
            assert mine.shape == vllms.shape and mine.dtype == vllms.dtype
            assert torch.allclose(mine.to(torch.float64), vllms.to(torch.float64), atol=1e-5)


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
def test_processed_logprobs_modes_equal_vllms(mode: str) -> None:
    """vLLM's processed modes read the rows after temperature; greedy rows keep theirs."""
    metadata, logits, batch = _batch(7, [0.0, 0.0, 0.0, 0.0], max_num_logprobs=2)
    ours, theirs = _pair(mode)
    got = ours(metadata, None, logits.clone(), batch).logprobs_tensors
    want = theirs(metadata, None, logits.clone(), batch).logprobs_tensors
    assert torch.allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert torch.equal(got.logprob_token_ids, want.logprob_token_ids)


def test_greedy_rows_of_a_mixed_batch_equal_vllms() -> None:
    for seed in range(6):
        metadata, logits, batch = _batch(seed, [0.0, 0.8, 0.0, 1.3])
        ours, theirs = _pair()
        got = ours(metadata, None, logits.clone(), batch).sampled_token_ids
        want = theirs(metadata, None, logits.clone(), batch).sampled_token_ids
        assert torch.equal(got[[0, 2]], want[[0, 2]])


@pytest.mark.slow
def test_both_samplers_are_exact_on_the_same_fixture() -> None:
    """T = 0.9 with draft probabilities. vLLM's sampler: false-failure rate <= 1e-4, TV >=
    0.075 at position 0 detected with prob. >= 99% (3,000 rows); specsample's: the same
    rate, TV >= 0.0123 (100,000 rows)."""
    params = {"temperature": 0.9}
    logits, draft = _tables(21)
    family = _family("vllm-fixture", logits, draft, params)
    ours, theirs = _pair()
    for sampler, rows, tv in [(theirs, VLLM_ROWS, 0.075), (ours, ROWS, 0.0123)]:
        verifier = vllm_verifier(sampler, logits, params)
        report = exactness_report(verifier, family, rows=rows, seed=21, batch_size=1024)
        assert report.passed(ALPHA), str(report)
        assert report.detectable_tv(0, ALPHA) <= tv
