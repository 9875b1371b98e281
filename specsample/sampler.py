"""The :class:`RejectionSampler` module: a drop-in, exact, sync-free chain verifier."""

from __future__ import annotations

import torch
from torch import nn

from specsample import kernels
from specsample.checks import check_chain_inputs, check_chain_values
from specsample.random import step_uniforms
from specsample.rules.block import block_verify
from specsample.rules.chain import chain_verify
from specsample.stats import VerificationStats

_RULES = {"chain": chain_verify, "block": block_verify}

__all__ = ["RejectionSampler"]


def _check_seeds(name: str, value: torch.Tensor | None, batch: int, device: torch.device) -> None:
    if value is None:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")
    if value.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be int64 or int32, got {value.dtype}")
    if value.shape != (batch,):
        raise ValueError(f"{name} must have shape {(batch,)}, got {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but target_probs is on {device}")


class RejectionSampler(nn.Module):
    """Speculative (rejection) sampling of ``k`` drafts per sequence, exact and sync-free.

    A drop-in for the classic ``RejectionSampler`` of serving engines: same ``forward``
    arguments, same output, same counter names; but counters count only drafts accepted in
    order, work on any device with no set-up call, the residual is sampled from exactly
    ``normalize(max(0, q - p))`` (no clamp) at the first rejected position only, and no
    ``[batch, k, vocab]`` temporary is formed.

    Parameters
    ----------
    strict_mode : bool
        Also run the costly value checks (ids in range, probabilities finite, non-negative,
        normalised; see :mod:`specsample.checks`), which synchronise with the device. Shape,
        dtype and device checks always run. Without strict mode, invalid values never crash
        and never produce an id outside ``[0, vocab)`` from the verifier: drafts outside the
        vocabulary are rejected, NaN probabilities reject their draft, and a residual with no
        positive finite mass is replaced by the target row (see
        :mod:`specsample.rules.residual`); the bonus ids are passed through as given.
    method : str
        ``"chain"`` (token by token, reads one row per sequence) or ``"block"`` (block
        verification, :mod:`specsample.rules.block`: exact too, never fewer accepted tokens in
        expectation, reads every row).

    Attributes
    ----------
    stats : VerificationStats
        Running counters and metrics (see :mod:`specsample.stats`).

    Examples
    --------
    >>> import torch
    >>> sampler = RejectionSampler()
    >>> q = torch.tensor([[[0.1, 0.9], [0.5, 0.5]]])
    >>> p = torch.tensor([[[0.1, 0.9], [0.5, 0.5]]])
    >>> out = sampler(q, torch.tensor([[1]]), p, torch.tensor([[1, 0]]))
    >>> out.tolist(), int(sampler.num_accepted_tokens), sampler.num_draft_tokens
    ([[1, 0, 1]], 2, 2)
    """

    def __init__(self, strict_mode: bool = False, method: str = "chain") -> None:
        super().__init__()
        if method not in _RULES:
            raise ValueError(f"method must be one of {tuple(_RULES)}, got {method!r}")
        self.strict_mode = strict_mode
        self.method = method
        self.probs_dtype = torch.float32
        self.token_id_dtype = torch.int64
        self.stats = VerificationStats()

    def init_gpu_tensors(self, device: int | str | torch.device) -> None:
        """Place the counters on ``device`` (a CUDA rank, or any device). Optional.

        Counters otherwise follow the inputs of the first ``forward`` call.
        """
        self.stats.to(f"cuda:{device}" if isinstance(device, int) else device)

    @property
    def num_accepted_tokens(self) -> torch.Tensor:
        """0-d int64 tensor: drafts accepted in order, over all calls."""
        return self.stats.accepted

    @property
    def num_emitted_tokens(self) -> torch.Tensor:
        """0-d int64 tensor: tokens emitted (accepted drafts plus one per sequence and call)."""
        return self.stats.emitted

    @property
    def num_draft_tokens(self) -> int:
        """Draft tokens offered, over all calls."""
        return self.stats.drafted

    def forward(
        self,
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        seeds: torch.Tensor | None = None,
        seed_offsets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Accept a prefix of each sequence's drafts and emit one more token.

        Parameters
        ----------
        target_probs : torch.Tensor
            ``[batch, k, vocab]`` target probabilities ``q`` at each draft position
            (float32, float16, bfloat16 or float64).
        bonus_token_ids : torch.Tensor
            ``[batch, 1]`` (or ``[batch]``) int64 token sampled from the target's row after
            the last draft; emitted when every draft is accepted.
        draft_probs : torch.Tensor
            ``[batch, k, vocab]`` the draft distributions ``p`` the drafts were sampled
            from, same dtype as ``target_probs``.
        draft_token_ids : torch.Tensor
            ``[batch, k]`` int64 drafted tokens.
        generator : torch.Generator, optional
            Source of randomness for unseeded rows (torch's default generator otherwise).
        seeds : torch.Tensor, optional
            ``[batch]`` int64 per-row seeds; a row with seed ``>= 0`` draws from a
            counter-based stream of its own, so its output depends only on its seed, its
            offset and its inputs (not on its index or the other rows). Negative: unseeded.
        seed_offsets : torch.Tensor, optional
            ``[batch]`` int64 position of each row's first draft in its sequence (default 0).
            A seeded step draws from its own stripe of counters, keyed by
            ``(seed, seed_offset)`` (see :func:`specsample.random.step_uniforms`); a loop
            whose offsets increase from step to step never reuses a number.

        Returns
        -------
        torch.Tensor
            ``[batch, k + 1]`` int64: accepted drafts, then the residual token at the first
            rejection (or the bonus token if all ``k`` were accepted), then ``-1``.
        """
        check_chain_inputs(target_probs, bonus_token_ids, draft_probs, draft_token_ids)
        batch, k, _ = target_probs.shape
        _check_seeds("seeds", seeds, batch, target_probs.device)
        _check_seeds("seed_offsets", seed_offsets, batch, target_probs.device)
        if self.strict_mode:
            check_chain_values(target_probs, bonus_token_ids, draft_probs, draft_token_ids)
        uniforms = step_uniforms(batch, k, target_probs.device, generator, seeds, seed_offsets)
        rule = _RULES[self.method]
        if target_probs.is_cuda and kernels.available():
            rule = kernels.RULES[self.method]
        result = rule(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms)
        self.stats.update(result.num_accepted, k)
        return result.token_ids
