"""The ``nn.Module`` facades: drop-ins for serving engines' speculative samplers.

:class:`RejectionSampler` (exact) and :class:`TypicalAcceptanceSampler` (LOSSY) take the
same arguments, in every form vLLM has passed them to its own samplers::

    sampler(target_with_bonus_probs [B, k + 1, V] (or [B, k, V]), bonus_token_ids [B, 1],
            draft_probs [B, k, V], draft_token_ids [B, k],
            seeded_seqs: dict[int, torch.Generator] | None)

positionally or by keyword; the target may also be passed as ``target_probs=`` (vLLM's
earlier keyword), never under both names (see :func:`target_argument`). They return
``[B, k + 1]`` int64 (accepted drafts, one more token, then ``-1``), keeping the same
counters (``num_accepted_tokens``, ``num_emitted_tokens``, ``num_draft_tokens``), which count
only drafts accepted in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from specsample import backends, pipeline
from specsample.methods import chain_methods, check_method
from specsample.params.checks import (
    check_backend,
    check_chain_inputs,
    check_chain_values,
    check_step_uniforms,
    check_uniform_values,
    require_data,
    require_tensor,
)
from specsample.params.seeding import (
    check_position_values,
    positions_from,
    require_positions,
    seeding_from,
)
from specsample.random import STEP_STRIDE
from specsample.rules.typical import (
    DEFAULT_POSTERIOR_ALPHA,
    DEFAULT_POSTERIOR_THRESHOLD,
    check_parameters,
    typical_acceptance,
)
from specsample.stats import VerificationStats


def target_argument(
    target_with_bonus_probs: object, target_probs: object, name: str
) -> tuple[str, torch.Tensor]:
    """The target probabilities, given under either of their names, and the name to report.

    ``target_with_bonus_probs`` is the samplers' first parameter (given positionally or by
    keyword); ``target_probs`` the keyword vLLM used before. Exactly one must be given.

    Parameters
    ----------
    target_with_bonus_probs : torch.Tensor or None
        ``[batch, k + 1, vocab]`` or ``[batch, k, vocab]`` target probabilities, or ``None``.
    target_probs : torch.Tensor or None
        The same, under its earlier name, or ``None``.
    name : str
        The name the messages give ``target_with_bonus_probs``; ``target_probs`` is reported
        as ``"target_probs"``.

    Returns
    -------
    tuple of (str, torch.Tensor)
        The name to report and the target tensor.

    Raises
    ------
    TypeError
        Both or neither are given, or the one given is not a tensor.

    Examples
    --------
    >>> target_argument(None, torch.zeros(1, 2, 3), "target_with_bonus_probs")[0]
    'target_probs'
    >>> target_argument(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), "target_probs")
    Traceback (most recent call last):
    ...
    TypeError: forward() got both target_with_bonus_probs and target_probs; pass one of them
    """
    if target_with_bonus_probs is not None and target_probs is not None:
        raise TypeError(
            "forward() got both target_with_bonus_probs and target_probs; pass one of them"
        )
    if target_probs is not None:
        return "target_probs", require_tensor("target_probs", target_probs)
    if target_with_bonus_probs is None:
        raise TypeError(
            "forward() missing the target probabilities: pass target_with_bonus_probs "
            "(or target_probs)"
        )
    return name, require_tensor(name, target_with_bonus_probs)


def draft_positions(target: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """The target rows at the draft positions: ``target[:, :k]`` when it has the bonus row.

    ``target`` may be ``[batch, k, vocab]`` or ``[batch, k + 1, vocab]`` (the bonus position
    last), ``draft_probs`` being ``[batch, k, vocab]``; the bonus row is never read (the bonus
    token is given). Returns a view, never a copy.

    Examples
    --------
    >>> draft_positions(torch.zeros(2, 4, 5), torch.zeros(2, 3, 5)).shape
    torch.Size([2, 3, 5])
    """
    if (
        target.dim() == 3
        and draft_probs.dim() == 3
        and target.shape[1] == draft_probs.shape[1] + 1
        and (target.shape[0], target.shape[2]) == (draft_probs.shape[0], draft_probs.shape[2])
    ):
        return target[:, :-1]
    return target


class _SpecSampler(nn.Module):
    """What both samplers share: strict mode, dtypes and the counters."""

    def __init__(self, strict_mode: bool) -> None:
        super().__init__()
        if not isinstance(strict_mode, bool):
            raise TypeError(f"strict_mode must be a bool, got {type(strict_mode).__name__}")
        self.strict_mode = strict_mode
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


class RejectionSampler(_SpecSampler):
    """Speculative (rejection) sampling of ``k`` drafts per sequence, exact and sync-free.

    A drop-in for the ``RejectionSampler`` of serving engines: same ``forward`` arguments in
    every form (see the module docstring), same output, same counter names; but counters
    count only drafts accepted in order, work on any device with no set-up call, the residual
    is sampled from exactly ``normalize(max(0, q - p))`` (no clamp) at the first rejected
    position only, and no ``[batch, k, vocab]`` temporary is formed.

    Parameters
    ----------
    strict_mode : bool
        Also run the costly value checks (ids in range, probabilities finite, non-negative,
        normalised; see :mod:`specsample.params.checks`), which synchronise with the device. Shape,
        dtype and device checks always run. Without strict mode, invalid values never crash
        and never produce an id outside ``[0, vocab)`` from the verifier: drafts outside the
        vocabulary are rejected, NaN probabilities reject their draft, and a residual with no
        positive finite mass is replaced by the target row (see
        :mod:`specsample.rules.residual`); the bonus ids are passed through as given.
    method : str
        ``"chain"`` (token by token, reads one row per sequence) or ``"block"`` (block
        verification, :mod:`specsample.rules.block`: exact too, never fewer accepted tokens in
        expectation, reads every row).
    backend : str
        ``"auto"``, ``"torch"``, ``"triton"`` or ``"cpu"`` (see :mod:`specsample.backends`).

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

    def __init__(
        self, strict_mode: bool = False, method: str = "chain", backend: str = "auto"
    ) -> None:
        """A sampler verifying with ``method`` on ``backend``, its counters at zero.

        Parameters
        ----------
        strict_mode : bool
            Also run the value checks, which synchronise with the device.
        method : str
            ``"chain"`` or ``"block"`` (see :func:`specsample.methods.chain_methods`).
        backend : str
            ``"auto"``, ``"torch"``, ``"triton"`` or ``"cpu"`` (see :mod:`specsample.backends`).

        Raises
        ------
        TypeError
            ``strict_mode`` not a bool, ``method`` or ``backend`` not a str.
        ValueError
            An unknown ``method`` or ``backend``.

        Examples
        --------
        >>> RejectionSampler(method="block").method
        'block'
        """
        super().__init__(strict_mode)
        self.method = check_method(method, chain_methods())
        if check_backend(backend, backends.BACKENDS) not in backends.BACKENDS:
            raise ValueError(f"backend must be one of {backends.BACKENDS}, got {backend!r}")
        self.backend = backend

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor | None = None,
        bonus_token_ids: torch.Tensor | None = None,
        draft_probs: torch.Tensor | None = None,
        draft_token_ids: torch.Tensor | None = None,
        seeded_seqs: Mapping[int, torch.Generator] | None = None,
        *,
        target_probs: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        seeds: torch.Tensor | Sequence[int | None] | None = None,
        positions: torch.Tensor | Sequence[int] | None = None,
        uniforms: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Accept a prefix of each sequence's drafts and emit one more token.

        The tensors may be given positionally or by keyword, in this order; messages name
        the target ``target_probs`` whichever name it was given under.

        Parameters
        ----------
        target_with_bonus_probs : torch.Tensor
            ``[batch, k + 1, vocab]`` target probabilities ``q`` (float32, float16, bfloat16
            or float64) at each draft position, then at the bonus position (that row is not
            read); or ``[batch, k, vocab]``, the draft positions only. Required, under this
            name or as ``target_probs``.
        bonus_token_ids : torch.Tensor
            ``[batch, 1]`` (or ``[batch]``) int64 token sampled from the target's row after
            the last draft; emitted when every draft is accepted. Required.
        draft_probs : torch.Tensor
            ``[batch, k, vocab]`` the draft distributions ``p`` the drafts were sampled
            from, same dtype as the target. Required.
        draft_token_ids : torch.Tensor
            ``[batch, k]`` int64 drafted tokens, ``k <= 255``. Required.
        seeded_seqs : dict of int to torch.Generator, optional
            Row ``i`` draws all its random numbers from ``seeded_seqs[i]``; its output does
            not depend on the other rows.
        target_probs : torch.Tensor, optional
            The target under vLLM's earlier keyword (``[batch, k, vocab]`` or
            ``[batch, k + 1, vocab]``), instead of ``target_with_bonus_probs``.
        generator : torch.Generator, optional
            Source of randomness for the other unseeded rows (torch's default generator
            otherwise); only those rows consume it.
        seeds : torch.Tensor or sequence of (int or None), optional
            ``[batch]`` per-row seeds (an int64 or int32 tensor, or host ints in
            ``[0, 2**64)`` and ``None``); a row with seed ``>= 0`` draws from a
            counter-based stream of its own, so its output depends only on its seed, its
            position and its inputs (not on its index or the other rows). Negative or
            ``None``: unseeded. Needs ``positions``.
        positions : torch.Tensor or sequence of int, optional
            ``[batch]`` absolute position of each row's first draft in its sequence (an
            int64 or int32 tensor, or host ints; in ``[0, 2**40)``). Required with
            ``seeds``. A seeded step reads the stripe of counters of its position (see
            :mod:`specsample.random`), so a loop never reuses a number.
        uniforms : torch.Tensor, optional
            ``[batch, k + 1]`` float64 uniforms to use instead of drawing them.

        Returns
        -------
        torch.Tensor
            ``[batch, k + 1]`` int64: accepted drafts, then the residual token at the first
            rejection (or the bonus token if all ``k`` were accepted), then ``-1``.

        Raises
        ------
        TypeError
            The target is given under both names or under neither, or an argument has the
            wrong type or dtype.
        ValueError
            An argument has the wrong shape or device (or, in strict mode, values).
        """
        name, target = target_argument(target_with_bonus_probs, target_probs, "target_probs")
        bonus = require_tensor("bonus_token_ids", bonus_token_ids)
        draft = require_tensor("draft_probs", draft_probs)
        ids = require_tensor("draft_token_ids", draft_token_ids)
        target = draft_positions(target, draft)
        check_chain_inputs(target, bonus, draft, ids, target_name=name)
        batch, k, _ = target.shape
        if k >= STEP_STRIDE:
            raise ValueError(
                f"draft_token_ids: a row may have at most {STEP_STRIDE - 1} drafts, got {k}"
            )
        device = target.device
        seeding = seeding_from(
            batch,
            device,
            seeds=seeds,
            generators=seeded_seqs,
            generator=generator,
            generators_name="seeded_seqs",
        )
        at = positions_from(positions, batch, device)
        require_positions(seeding, at)
        if self.strict_mode:
            require_data(name, target)
            check_chain_values(target, bonus, draft, ids, target_name=name)
            check_position_values(at)
            if uniforms is not None:
                check_uniform_values(check_step_uniforms(uniforms, batch, k + 1, device))
        result = pipeline.run_probs(
            target,
            draft,
            ids,
            bonus,
            seeding,
            backend=backends.resolve(self.backend, target),
            method=self.method,
            positions=at,
            uniforms=uniforms,
        )
        self.stats.update(result.num_accepted, k)
        return result.token_ids


class TypicalAcceptanceSampler(_SpecSampler):
    """Typical acceptance (Medusa) with vLLM's interface. LOSSY: NOT a sample of the target.

    A draft ``x`` at a position with target row ``q`` is accepted iff
    ``q(x) > min(posterior_threshold, posterior_alpha * exp(-H(q)))``; drafts are kept up to
    the first rejection, then the argmax of ``q`` at that position is emitted, or the given
    bonus token when every draft passed. See :mod:`specsample.rules.typical` for why the
    output does not follow the target and how far it strays.

    Parameters
    ----------
    posterior_threshold : float
        Upper bound of the acceptance threshold (default 0.09).
    posterior_alpha : float
        Scale of the entropy-dependent threshold (default 0.3).
    strict_mode : bool
        Also check values (ids in range, target probabilities normalised); synchronises.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.05, 0.15, 0.8], [0.02, 0.9, 0.08], [0.1, 0.2, 0.7]]])
    >>> TypicalAcceptanceSampler()(q, torch.tensor([[0]]), None, torch.tensor([[1, 2]])).tolist()
    [[1, 1, -1]]
    """

    def __init__(
        self,
        posterior_threshold: float = DEFAULT_POSTERIOR_THRESHOLD,
        posterior_alpha: float = DEFAULT_POSTERIOR_ALPHA,
        strict_mode: bool = False,
    ) -> None:
        """A typical-acceptance sampler with these thresholds, its counters at zero.

        Parameters
        ----------
        posterior_threshold : float
            Upper bound of the acceptance threshold, finite and ``>= 0``.
        posterior_alpha : float
            Scale of the entropy-dependent threshold, finite and ``>= 0``.
        strict_mode : bool
            Also run the value checks, which synchronise with the device.

        Raises
        ------
        TypeError, ValueError
            A parameter of the wrong type or value (the message names it).

        Examples
        --------
        >>> TypicalAcceptanceSampler(posterior_threshold=0.2).posterior_threshold
        0.2
        """
        super().__init__(strict_mode)
        check_parameters(posterior_threshold, posterior_alpha)
        self.posterior_threshold = float(posterior_threshold)
        self.posterior_alpha = float(posterior_alpha)

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor | None = None,
        bonus_token_ids: torch.Tensor | None = None,
        draft_probs: torch.Tensor | None = None,
        draft_token_ids: torch.Tensor | None = None,
        seeded_seqs: Mapping[int, torch.Generator] | None = None,
        *,
        target_probs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Accept drafts by the typical rule; deterministic (``seeded_seqs`` is not used).

        The same arguments as :meth:`RejectionSampler.forward`, positionally or by keyword.

        Parameters
        ----------
        target_with_bonus_probs : torch.Tensor
            ``[batch, k + 1, vocab]`` (or ``[batch, k, vocab]``) target probabilities.
            Required, under this name or as ``target_probs``.
        bonus_token_ids : torch.Tensor
            ``[batch, 1]`` int64, emitted when every draft passes. Required.
        draft_probs : torch.Tensor, optional
            ``[batch, k, vocab]``; not read by this rule (checked when given).
        draft_token_ids : torch.Tensor
            ``[batch, k]`` int64 drafts. Required.
        seeded_seqs : dict, optional
            Accepted for interface compatibility; the rule uses no randomness.
        target_probs : torch.Tensor, optional
            The target under vLLM's earlier keyword, instead of ``target_with_bonus_probs``.

        Returns
        -------
        torch.Tensor
            ``[batch, k + 1]`` int64: accepted drafts, one more token, then ``-1``.

        Raises
        ------
        TypeError
            Target under both names or neither; a non-tensor or a wrong dtype.
        ValueError
            ``draft_token_ids`` not ``[batch, k]`` beside the target, other shapes or devices
            that do not match, or (strict mode) invalid values.
        """
        ids = require_tensor("draft_token_ids", draft_token_ids)
        name, target = target_argument(
            target_with_bonus_probs, target_probs, "target_with_bonus_probs"
        )
        bonus = require_tensor("bonus_token_ids", bonus_token_ids)
        if target.dim() == 3 and (ids.dim() != 2 or target.shape[1] - ids.shape[1] not in (0, 1)):
            raise ValueError(
                f"draft_token_ids must have shape [batch, k] with {name} "
                f"[batch, k + 1, vocab] (or [batch, k, vocab]) of shape {tuple(target.shape)}, "
                f"got {tuple(ids.shape)}"
            )
        rows = (
            target[:, :-1] if target.dim() == 3 and target.shape[1] == ids.shape[-1] + 1 else target
        )
        draft = rows if draft_probs is None else draft_probs
        check_chain_inputs(rows, bonus, draft, ids, target_name=name)
        if self.strict_mode:
            require_data(name, rows)
            check_chain_values(rows, bonus, draft_probs, ids, target_name=name)
        result = typical_acceptance(
            rows,
            ids,
            bonus_token_ids=bonus,
            posterior_threshold=self.posterior_threshold,
            posterior_alpha=self.posterior_alpha,
        )
        self.stats.update(result.num_accepted, rows.shape[1])
        return result.token_ids
