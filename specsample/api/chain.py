"""The functional API engines call: :func:`verify` on flattened, ragged logits.

The batch is flattened the way serving engines hold it: request ``i`` contributes
``num_draft_tokens[i]`` draft positions (zero allowed) and one bonus position. Target logits
hold, request after request, the rows of its draft positions then of its bonus position
(``[total_drafts + batch, vocab]``); or, when the bonus tokens are already sampled and given
as ``bonus_token_ids`` (vLLM v1's convention), the rows of the draft positions only
(``[total_drafts, vocab]``). Draft ids (and draft probabilities or logits, when the drafter
has them) hold the draft positions only (``[total_drafts]``, ``[total_drafts, vocab]``).

The contract. The distribution preserved is the target's *processed* distribution: its
logits after the request's temperature, top-k, top-p and min-p, in that order (see
:mod:`specsample.probs`). The draft distribution must be exactly the one each draft was
sampled from: ``draft_probs`` as given, or ``softmax(draft_logits)`` (apply the drafter's
own temperature and filters before passing logits). Without either, the draft is treated as
one-hot: draft ``x`` is accepted with probability ``q(x)``, and on rejection the token is
drawn from ``q`` with ``x`` removed, renormalised; this is exact for any drafter, n-gram and
greedy heads included, as long as the draft does not depend on the verifier's randomness.
Requests with temperature 0 are greedy: drafts are accepted while they equal the target
argmax, the first mismatch emits the argmax, and the bonus is the argmax of the bonus row.

Every call runs the pipeline of :mod:`specsample.pipeline` on the backend of
:mod:`specsample.backends`; nothing synchronises with the device unless ``strict=True``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from typing_extensions import Unpack

from specsample import backends, pipeline
from specsample.api.options import VerifyOptions, check_names, requests_from
from specsample.methods import METHODS, chain_methods, check_method
from specsample.params import Ints, Requests
from specsample.params.checks import (
    check_backend,
    check_flag,
    check_logits_tensors,
    check_logits_values,
    check_uniform_values,
    require_data,
    require_tensor,
)
from specsample.params.layout import (
    BatchLayout,
    check_layout_values,
    check_logits_inputs,
    step_layout,
)
from specsample.params.seeding import check_position_values
from specsample.plan import LogitsStep, Plan
from specsample.random import STEP_STRIDE
from specsample.rules.rows import unit_columns


class VerifyOutput(NamedTuple):
    """What :func:`verify` returns.

    Attributes
    ----------
    token_ids : torch.Tensor
        ``[batch, max_drafts + 1]`` int64: accepted drafts, then one more token, then -1.
    num_accepted : torch.Tensor
        ``[batch]`` int64: drafts accepted per request, in order.
    logprobs : torch.Tensor or None
        ``[batch, max_drafts + 1]`` float32 log-probabilities of the emitted tokens under the
        processed target distribution (greedy requests: under ``softmax(logits)``); NaN at
        padding. ``None`` unless requested.
    """

    token_ids: torch.Tensor
    num_accepted: torch.Tensor
    logprobs: torch.Tensor | None

    @property
    def num_emitted(self) -> torch.Tensor:
        """``[batch]`` int64: tokens emitted per request (accepted drafts plus one)."""
        return self.num_accepted + 1


def verify(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Ints | BatchLayout,
    *,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    bonus_token_ids: torch.Tensor | None = None,
    requests: Requests | None = None,
    method: str = "chain",
    backend: str = "auto",
    return_logprobs: bool = False,
    strict: bool = False,
    **options: Unpack[VerifyOptions],
) -> VerifyOutput:
    """Verify the drafts of a flattened, ragged batch from target logits.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[total_drafts + batch, vocab]`` (float32, float16, bfloat16 or float64, ``vocab
        >= 1``): per request, the rows of its draft positions, then its bonus row. With
        ``bonus_token_ids``: ``[total_drafts, vocab]``, the draft positions only.
    draft_token_ids : torch.Tensor
        ``[total_drafts]`` int64 or int32 drafts, request after request. Ids outside
        ``[0, vocab)`` are rejected.
    num_draft_tokens : sequence of int, tensor, or BatchLayout
        ``[batch]`` drafts per request, each in ``[0, 255]``: host ints, an integer CPU
        tensor, or an integer tensor on the batch's device together with
        ``max_draft_tokens`` (the sum is ``draft_token_ids``' length); or the layout itself,
        built once (:meth:`specsample.params.layout.BatchLayout.build`) and reused.
    draft_probs : torch.Tensor, optional
        ``[total_drafts, vocab]`` the distributions the drafts were sampled from.
    draft_logits : torch.Tensor, optional
        ``[total_drafts, vocab]`` logits whose softmax the drafts were sampled from.
        Exclusive with ``draft_probs``; with neither, drafts are one-hot.
    bonus_token_ids : torch.Tensor, optional
        ``[batch]`` or ``[batch, 1]`` int64 tokens already sampled from each request's bonus
        position; emitted when all its drafts are accepted (then ``target_logits`` has no
        bonus rows).
    requests : Requests, optional
        What every request asks, validated once (:meth:`specsample.params.Requests.build`):
        sampling parameters, random sources and positions. Exclusive with the sampling
        keywords below.
    method : str
        Verification rule, one of :func:`specsample.methods.chain_methods` ``(lossy=True)``;
        ``"gumbel"`` (:mod:`specsample.rules.gumbel`) emits the target's own keyed Gumbel-max
        sample at every position, so a seeded request's tokens do not depend on the drafts
        (it reads no draft rows and draws no uniforms); ``"typical"`` (Medusa's typical
        acceptance) is LOSSY and needs the bonus rows.
    backend : str
        ``"auto"``, ``"torch"``, ``"triton"`` or ``"cpu"`` (see :mod:`specsample.backends`).
    return_logprobs : bool
        Also return the log-probabilities of the emitted tokens (needs the bonus rows).
    strict : bool
        Also check values (NaN logits, ids out of range, device counts, parameters,
        positions and given uniforms); this synchronises with the device.
    **options
        Keywords of :class:`specsample.api.options.VerifyOptions`:

        ``temperature``, ``top_k``, ``top_p``, ``min_p`` (scalar, sequence or tensor):
        per-request sampling parameters: temperature finite and >= 0 (0 = greedy), top_k
        an integer in ``[0, 2**63)`` (0 = off; a tensor of an integer dtype), top_p in
        (0, 1] (1 = off), min_p in [0, 1] (0 = off). A real number (not a bool), one per
        request, or a scalar or ``[batch]`` tensor. Host values (CPU tensors included) are
        validated; tensors on the batch's device are used without synchronising (checked
        only with ``strict``); tensors elsewhere are refused.

        ``seeds`` (sequence of int or None, or tensor): ``[batch]`` per-request seeds:
        host ints in ``[0, 2**64)`` (None or -1: unseeded), or an int64 or int32 tensor
        (negative: unseeded) on the CPU or the batch's device, always with ``positions``.
        A seeded request's output depends only on its seed, its ``positions`` entry and
        its own rows: not on its index or on the other requests.

        ``generators`` (dict of int to torch.Generator): per-request generators (vLLM's
        ``generators``): request ``i`` draws all its numbers from ``generators[i]``.

        ``generator`` (torch.Generator): randomness for the other requests; only they
        consume it.

        ``positions`` (sequence of int or tensor): ``[batch]`` absolute position of each
        request's first draft in its sequence (the number of tokens before it), in
        ``[0, 2**40)``: host ints or an int64 or int32 tensor on the CPU or the batch's
        device. Required with ``seeds`` (a ValueError otherwise). A seeded step reads the
        counters of its position's stripe (see :mod:`specsample.random`), so counters never
        repeat along a sequence whatever draft count each step uses. Also allowed beside
        ``requests`` (it moves them).

        ``uniforms`` (tensor): ``[batch, max_drafts + 1]`` float64 uniforms to use instead
        of drawing them (the ``max_drafts`` accept tests, then the final draw).

        ``max_draft_tokens`` (int): host-side maximum of ``num_draft_tokens``, in
        ``[0, 255]``: the output has ``max_draft_tokens + 1`` columns. Required when the
        counts are a tensor on an accelerator.

    Returns
    -------
    VerifyOutput
        ``token_ids [batch, max_drafts + 1]``, ``num_accepted [batch]``, and ``logprobs``.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (the message names it).
    ValueError
        An argument of the wrong value, shape or device (the message names it and says
        what is allowed).

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[0.0, 9.0], [9.0, 0.0], [0.0, 9.0], [9.0, 0.0]])
    >>> out = verify(logits, torch.tensor([1, 0]), [2, 0], temperature=0.0)
    >>> out.token_ids.tolist(), out.num_emitted.tolist()
    ([[1, 0, 1], [0, -1, -1]], [3, 1])
    """
    check_names("verify", options, VerifyOptions.__annotations__)
    target_logits = require_tensor("target_logits", target_logits)
    draft_token_ids = require_tensor("draft_token_ids", draft_token_ids)
    _check_options(method, backend, strict, return_logprobs)
    check_logits_tensors(target_logits, draft_token_ids)
    target_logits = unit_columns(target_logits)
    chosen = backends.resolve(backend, target_logits)
    needs_bonus_rows = "method='typical'" if method == "typical" else None
    if return_logprobs:
        needs_bonus_rows = "return_logprobs"
    layout, bonus = step_layout(
        target_logits,
        draft_token_ids,
        num_draft_tokens,
        bonus_token_ids,
        options.get("max_draft_tokens"),
        needs_bonus_rows,
    )
    drafts = _check_drafts(target_logits, draft_token_ids, layout, draft_probs, draft_logits)
    requests = requests_from(requests, options, layout.batch, target_logits.device, strict=strict)
    if strict:
        _strict_checks(target_logits, draft_token_ids, drafts, layout, bonus, requests.positions)
    uniforms = options.get("uniforms")
    norms = None
    if method == "typical":
        if uniforms is not None:
            raise ValueError("uniforms: method='typical' draws no random numbers")
        token_ids, num_accepted = pipeline.run_typical(
            target_logits, draft_token_ids, layout, requests, backend=chosen
        )
    else:
        plan = _plan(
            target_logits,
            layout,
            requests,
            uniforms,
            strict,
            need_norm=return_logprobs,
            backend=chosen,
            keyed=METHODS[method].keyed,
        )
        step = LogitsStep(
            target_logits, draft_token_ids, plan, method, bonus_token_ids=bonus, **drafts
        )
        token_ids, num_accepted = pipeline.run_logits(step, backend=chosen)
        norms = plan.norms
    if not return_logprobs:
        return VerifyOutput(token_ids, num_accepted, None)
    if norms is None:
        norms = pipeline.target_norms(
            target_logits, layout, requests, need_norm=True, backend=chosen
        )
    logprobs = pipeline.emitted_logprobs(target_logits, layout, norms, token_ids, backend=chosen)
    return VerifyOutput(token_ids, num_accepted, logprobs)


def _plan(
    target_logits: torch.Tensor,
    layout: BatchLayout,
    requests: Requests,
    uniforms: torch.Tensor | None,
    strict: bool,
    *,
    need_norm: bool,
    backend: str,
    keyed: bool,
) -> Plan:
    """The step's plan; with ``strict``, given uniforms are checked too."""
    plan = pipeline.plan_logits(
        target_logits,
        layout,
        requests,
        uniforms=uniforms,
        need_norm=need_norm,
        backend=backend,
        keyed=keyed,
    )
    if strict and uniforms is not None:
        check_uniform_values(plan.uniforms)
    return plan


def _check_options(method: object, backend: object, strict: object, logprobs: object) -> None:
    """The rule, the backend and the two flags of :func:`verify`, checked."""
    check_method(method, chain_methods(lossy=True))
    check_backend(backend, backends.BACKENDS)
    check_flag("strict", strict)
    check_flag("return_logprobs", logprobs)


def _check_drafts(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    draft_probs: object,
    draft_logits: object,
) -> dict[str, torch.Tensor]:
    """The draft rows, checked, as ``{"draft_probs": ...}``, ``{"draft_logits": ...}`` or ``{}``."""
    if draft_probs is not None and draft_logits is not None:
        raise ValueError("pass draft_probs or draft_logits, not both")
    name = "draft_probs" if draft_probs is not None else "draft_logits"
    given = draft_probs if draft_probs is not None else draft_logits
    rows = check_logits_inputs(target_logits, draft_token_ids, layout, given, name)
    return {} if rows is None else {name: unit_columns(rows)}


def _strict_checks(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    drafts: dict[str, torch.Tensor],
    layout: BatchLayout,
    bonus: torch.Tensor | None,
    positions: torch.Tensor | None,
) -> None:
    """The value checks of strict mode (they synchronise with the device)."""
    require_data("target_logits", target_logits)
    check_position_values(positions)
    name, rows = next(iter(drafts.items()), ("draft_probs", None))
    check_logits_values(target_logits, draft_token_ids, rows, name)
    check_layout_values(layout)
    vocab = target_logits.shape[1]
    if bonus is not None and bool(((bonus < 0) | (bonus >= vocab)).any()):
        raise ValueError(f"bonus_token_ids must lie in [0, {vocab})")


def verify_padded(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    *,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    **kwargs: object,
) -> VerifyOutput:
    """:func:`verify` for a padded batch with ``k`` drafts per request.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[batch, k + 1, vocab]``: the ``k`` draft positions, then the bonus position.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64.
    draft_probs, draft_logits : torch.Tensor, optional
        Exactly ``[batch, k, vocab]`` (a tensor of another shape, a permuted one of the same
        size included, is refused).
    **kwargs
        Any other argument of :func:`verify` (``max_draft_tokens`` defaults to ``k``, so
        that the output is ``[batch, k + 1]`` even for an empty batch).

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[[0.0, 9.0], [9.0, 0.0]]])
    >>> verify_padded(logits, torch.tensor([[1]]), temperature=0.0).token_ids.tolist()
    [[1, 0]]
    """
    target_logits = require_tensor("target_logits", target_logits)
    draft_token_ids = require_tensor("draft_token_ids", draft_token_ids)
    if target_logits.dim() != 3:
        raise ValueError(
            f"target_logits must have shape [batch, k + 1, vocab], got {tuple(target_logits.shape)}"
        )
    batch, k_plus_one, vocab = target_logits.shape
    if k_plus_one == 0:
        raise ValueError(
            "target_logits must have at least the bonus position, [batch, k + 1, vocab], "
            f"got {tuple(target_logits.shape)}"
        )
    k = k_plus_one - 1
    if draft_token_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"draft_token_ids must be int64 or int32, got {draft_token_ids.dtype}")
    if draft_token_ids.shape != (batch, k):
        raise ValueError(
            f"draft_token_ids must have shape {(batch, k)} [batch, k], "
            f"got {tuple(draft_token_ids.shape)}"
        )
    if k >= STEP_STRIDE:
        raise ValueError(
            f"draft_token_ids: a request may have at most {STEP_STRIDE - 1} drafts, got k = {k}"
        )
    flat_draft = {}
    for name, rows in (("draft_probs", draft_probs), ("draft_logits", draft_logits)):
        if rows is not None:
            rows = require_tensor(name, rows)
            if rows.shape != (batch, k, vocab):
                raise ValueError(
                    f"{name} must have shape {(batch, k, vocab)} [batch, k, vocab], "
                    f"got {tuple(rows.shape)}"
                )
            flat_draft[name] = rows.reshape(batch * k, vocab)
    kwargs.setdefault("max_draft_tokens", k)
    return verify(
        target_logits.reshape(batch * k_plus_one, vocab),
        draft_token_ids.reshape(-1),
        [k] * batch,
        **flat_draft,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
