"""vLLM's own batch objects, built from plain lists: for tests, examples and benchmarks.

vLLM's model runner builds ``SpecDecodeMetadata`` and ``SamplingMetadata`` from its input
batch; these builders make the same objects for a batch given as lists, with the row
layout vLLM uses (each request's draft rows, then its bonus row).

Examples
--------
>>> metadata = spec_metadata([[5, 6], [], [7]])
>>> metadata.target_logits_indices.tolist(), metadata.bonus_logits_indices.tolist()
([0, 1, 4], [2, 3, 5])
>>> sampling_metadata([0.0, 0.8, 1.0], vocab=10).all_greedy
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata


def spec_metadata(
    draft_token_ids: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> SpecDecodeMetadata:
    """vLLM's ``SpecDecodeMetadata`` for each request's drafts, rows laid out as vLLM's.

    Parameters
    ----------
    draft_token_ids : sequence of sequences of int
        Each request's drafts (possibly none).
    device : torch.device or str
        Where the tensors live.

    Returns
    -------
    SpecDecodeMetadata
        int32 ``draft_token_ids [num_tokens]``, cumulative counts, and the indices of the
        target rows ``[num_tokens]`` and bonus rows ``[batch]`` in ``[num_tokens + batch,
        vocab]`` logits.
    """
    counts = [len(ids) for ids in draft_token_ids]
    ends = torch.tensor(counts, dtype=torch.int64).add(1).cumsum(0).tolist()
    target = [end - 1 - n + j for end, n in zip(ends, counts, strict=True) for j in range(n)]

    def ints(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int32, device=device)

    return SpecDecodeMetadata(
        draft_token_ids=ints([t for ids in draft_token_ids for t in ids]),
        num_draft_tokens=counts,
        cu_num_draft_tokens=ints(counts).cumsum(0, dtype=torch.int32),
        cu_num_sampled_tokens=ints(ends),
        target_logits_indices=ints(target),
        bonus_logits_indices=ints([end - 1 for end in ends]),
        logits_indices=ints(range(ends[-1] if counts else 0)),
    )


def sampling_metadata(
    temperature: Sequence[float],
    *,
    vocab: int,
    top_k: Sequence[int] | None = None,
    top_p: Sequence[float] | None = None,
    generators: Mapping[int, torch.Generator] | None = None,
    max_num_logprobs: int | None = None,
    allowed_token_ids_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> SamplingMetadata:
    """vLLM's ``SamplingMetadata`` as its input batch builds it, without penalties.

    Parameters
    ----------
    temperature : sequence of float
        ``[batch]``; 0 marks a greedy request (vLLM's convention).
    vocab : int
        Vocabulary size (top-k off is ``vocab`` in vLLM's batch).
    top_k, top_p : sequence, optional
        ``[batch]`` per-request top-k (``vocab`` or more: off) and top-p (1: off).
    generators : dict of int to torch.Generator, optional
        The generators of the seeded requests, by index.
    max_num_logprobs : int, optional
        Top logprobs to return per token (``None``: no logprobs).
    allowed_token_ids_mask : torch.Tensor, optional
        ``[batch, vocab]`` bool, ``True`` where a token is NOT allowed (vLLM's convention).
    device : torch.device or str
        Where the tensors live.
    """
    batch = len(temperature)
    greedy = [t == 0.0 for t in temperature]

    def floats(values: Sequence[float]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.float32, device=device)

    return SamplingMetadata(
        temperature=None if all(greedy) else floats(temperature),
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=None if top_p is None else floats(top_p),
        top_k=None
        if top_k is None
        else torch.tensor([min(k, vocab) for k in top_k], dtype=torch.int32, device=device),
        generators=dict(generators or {}),
        max_num_logprobs=max_num_logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=floats([0.0] * batch),
        presence_penalties=floats([0.0] * batch),
        repetition_penalties=floats([1.0] * batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=allowed_token_ids_mask,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
