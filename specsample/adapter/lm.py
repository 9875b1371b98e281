"""Hugging Face causal LMs as the decoding loop drives them: a model and its masked KV cache.

A :class:`CachedLM` wraps a ``transformers`` causal LM and a
:class:`~specsample.adapter.cache.KVCache`, handed to the model's forward through
:func:`~specsample.adapter.model_cache.model_cache` (or written directly by the
:class:`~specsample.adapter.fused.FusedForward`). Every forward appends the same number of
slots to every row; slots that turn out to be rejected drafts are masked out of the 2-D
attention mask for good, and every token gets an explicit position id, so each row advances
by its own accepted length while the cache stays rectangular. When more than half of the
cache is masked it is compacted (the valid slots of each row gathered to the right, in
order), which changes nothing the model computes because positions are explicit.

This relies on the model building its causal mask from cache *slots*, its padding mask from
the 2-D attention mask and its rotary or learned positions from ``position_ids``; Llama-style
models in ``transformers`` do. :func:`check_masked_cache` verifies it on a given model.
Sliding-window models get 4-D masks built from each slot's position
(:func:`~specsample.adapter.masks.additive_masks`); attention kinds the loop cannot honour
are refused by :func:`~specsample.adapter.config.attention_window`.

Where the fused forward serves a model, the faster of it and the model's own forward runs
each shape class (1 row, several rows), as a short probe on this machine finds once per
model and thread count (:mod:`~specsample.adapter.choice`; ``forward=`` or the environment
variable ``SPECSAMPLE_FORWARD`` pins one).
A target's float32 fused forward on a CPU is row-exact where it can be (``row_exact=``,
:mod:`~specsample.adapter.exact`): a position's logits are the same bits in a verified block
as decoded alone, whatever the batch, its padding and its masked slots, so it runs every
shape.

``transformers`` is imported only inside the functions that need it, so ``specsample``
imports without it.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, cast

import torch

from specsample.adapter import checks, choice
from specsample.adapter.cache import KVCache
from specsample.adapter.choice import ForwardChoice
from specsample.adapter.config import attention_window, cache_argument, text_config, vocab_size
from specsample.adapter.fused import FusedForward, fused_forward
from specsample.adapter.masks import additive_masks
from specsample.adapter.model_cache import model_cache


class CachedLM:
    """A causal LM and its KV cache, fed rectangular blocks of slots with a per-slot mask.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose forward takes ``input_ids``, ``attention_mask``, ``position_ids``
        and a cache and returns ``.logits``. The cache is passed as ``cache=`` when the
        forward's signature names it (``transformers`` 5), else as ``past_key_values=``
        (see :func:`~specsample.adapter.config.cache_argument`); the signature is read once,
        here.
    role : str
        ``"target"`` or ``"draft"``, for error messages.
    check : bool
        Run :func:`check_masked_cache` on the model (once per model object).
    fused : bool
        Compute the logits with :class:`~specsample.adapter.fused.FusedForward` where it
        serves the model (Llama, Mistral and Qwen2 without a sliding window) and its logits
        equal the model's own on a probe; otherwise, or with ``False`` (which is
        ``forward="model"``), the model's own forward runs.
    forward : str, optional
        Where the fused forward serves the model, which forward runs
        (:mod:`~specsample.adapter.choice`): ``"auto"`` the faster of the two on this
        machine, per shape class (1 row, several rows), timed once per model and thread
        count; ``"fused"`` the fused one; ``"model"`` the model's own. Default: the
        environment variable ``SPECSAMPLE_FORWARD``, else ``"auto"``.
    row_exact : bool, optional
        Make a float32 fused forward on a CPU row-exact where it can
        (:mod:`~specsample.adapter.exact`: each position's logits the same bits whatever
        else the forward computes; it then runs every shape). Default: for a ``"target"``,
        :data:`~specsample.adapter.fused.ROW_EXACT_DEFAULT`; otherwise ``False`` (a draft's
        logits need not be, and its small products run faster without).

    Attributes
    ----------
    model : transformers.PreTrainedModel
    cache : KVCache or None
        The cache (``None`` before :meth:`reset`).
    max_positions : int or None
        The model's context (``max_position_embeddings``); position ids are clamped below it.
    vocab_size : int
        Width of the model's logits.
    attention : AttentionWindow
        The model's sliding window, if any (:func:`~specsample.adapter.config.attention_window`).
    fused : FusedForward or None
        The lean forward in use, if any.
    choice : ForwardChoice
        Which forward runs each shape class, and how that was decided.

    Raises
    ------
    TypeError, ValueError
        ``forward`` (or ``SPECSAMPLE_FORWARD``) is not one of
        :data:`~specsample.adapter.choice.FORWARDS`, or is ``"fused"`` with ``fused=False``.
    """

    def __init__(
        self,
        model: Any,
        role: str = "target",
        *,
        check: bool = True,
        fused: bool = True,
        forward: str | None = None,
        row_exact: bool | None = None,
    ) -> None:
        mode, source = choice.forward_mode(forward)
        if not fused:
            if forward == "fused":
                raise ValueError("forward='fused' contradicts fused=False")
            mode, source = "model", "fused=False"
        config = text_config(model)
        self.attention = attention_window(config, role)
        self.model = model
        self.role = role
        self.config = config
        self.max_positions: int | None = getattr(config, "max_position_embeddings", None)
        self.vocab_size = vocab_size(model, role)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = cache_argument(params)
        self._keep_arg = next(
            (name for name in ("logits_to_keep", "num_logits_to_keep") if name in params), None
        )
        self.cache: KVCache | None = None
        self._boundary: Any = None
        self.fused: FusedForward | None = None
        self.choice = (
            ForwardChoice("pinned", source) if mode == "model" else ForwardChoice("unserved")
        )
        if check and not checks.passed(model):
            check_masked_cache(model, role=role)
        if mode != "model" and self.attention.window is None:
            exact = row_exact if row_exact is not None or role == "target" else False
            agrees = functools.partial(_fused_agrees, model)
            self.fused = fused_forward(model, agrees, row_exact=exact)
        if self.fused is not None:
            with torch.inference_mode():
                self.choice = choice.choose(
                    self.fused,
                    mode,
                    source,
                    functools.partial(_speed_probe, self, self.fused),
                    weights=choice.linear_weights(model),
                    device=self.device,
                )
            if self.choice.model_one and self.choice.model_many:
                self.fused = None

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        try:
            return next(self.model.parameters()).device
        except (AttributeError, StopIteration):
            return torch.device("cpu")

    @property
    def runs(self) -> str:
        """Which forward computes the logits: the fused one (and its weight layout) or the
        model's own, or each for its shape class where they differ (:attr:`choice`)."""
        own = "transformers' forward"
        if self.fused is None:
            return own
        fused = "fused forward" + (", oneDNN weights" if self.fused.packed else "")
        if self.choice.model_one:
            return f"{own} at 1 row, {fused} at more"
        if self.choice.model_many:
            return f"{fused} at 1 row, {own} at more"
        return fused

    @property
    def width(self) -> int:
        """Slots per row in the cache (0 before :meth:`reset`)."""
        return 0 if self.cache is None else self.cache.width

    def describe(self) -> str:
        """A short description: architecture, layers, hidden size, the forward in use and
        how it was chosen (:attr:`ForwardChoice.summary`)."""
        layers = getattr(self.config, "num_hidden_layers", "?")
        hidden = getattr(self.config, "hidden_size", "?")
        return (
            f"{type(self.model).__name__}, {layers} layers, hidden {hidden}, {self.runs} "
            f"({self.choice.summary})"
        )

    def reset(self, batch: int) -> None:
        """Start an empty cache for ``batch`` rows."""
        self.cache = KVCache(batch, self.device)
        self._boundary = model_cache(self.cache)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        valid: torch.Tensor | None = None,
        keep: int = 1,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append ``n`` slots to every row and return the logits of the last ``keep`` ones.

        Parameters
        ----------
        input_ids, position_ids : torch.Tensor
            ``[batch, n]`` int64.
        valid : torch.Tensor, optional
            ``[batch, n]`` which new slots later tokens may attend to (default: all).
        keep : int
            Logits wanted for the last ``keep`` slots (``0``: all of them).
        visible : torch.Tensor, optional
            ``[n, t]`` bool, ``t >= n``: which of the last ``t`` slots (these ``n`` and the
            ones before them) each new slot may attend to, on top of the usual rules; a
            token tree's nodes see their ancestors and themselves only. The model then gets
            a 4-D mask, which ``transformers`` takes for its common architectures.

        Returns
        -------
        torch.Tensor
            ``[batch, keep or n, vocab]``.
        """
        cache = self._cache()
        fused, boundary = self._route(cache, input_ids)
        return self._run_by(fused, cache, boundary, input_ids, position_ids, valid, keep, visible)

    def _cache(self) -> KVCache:
        if self.cache is None:
            raise RuntimeError("the cache is not started: call reset() first")
        return self.cache

    def _route(self, cache: KVCache, input_ids: torch.Tensor) -> tuple[FusedForward | None, Any]:
        """How a forward of ``input_ids`` on ``cache`` runs: the fused forward if
        :attr:`choice` picks it for these rows, else ``None`` (the model's own), and the
        boundary that hands ``cache`` to the model's own forward (``None``: a new one)."""
        fused = self.fused
        if fused is not None and self.choice.model_at(input_ids.numel()):
            fused = None
        return fused, self._boundary if cache is self.cache else None

    def _run_by(
        self,
        fused: FusedForward | None,
        cache: KVCache,
        boundary: Any,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        valid: torch.Tensor | None,
        keep: int,
        visible: torch.Tensor | None,
    ) -> torch.Tensor:
        """:meth:`forward` on ``cache`` by ``fused``, or by the model's own forward when it
        is ``None`` (handed ``cache`` through ``boundary``, a new one when ``None``)."""
        if self.max_positions:
            position_ids = position_ids.clamp(max=self.max_positions - 1)
        window = self.attention.window
        cache.add_slots(input_ids.shape[1], valid, position_ids if window is not None else None)
        if fused is not None:
            full = cast(torch.Tensor, self._masks(cache, position_ids, visible))  # no window
            return fused(input_ids, position_ids, full, cache, keep)
        mask: torch.Tensor | dict[str, torch.Tensor] = cache.mask
        if window is not None or visible is not None:
            mask = self._masks(cache, position_ids, visible)
        if boundary is None:
            boundary = model_cache(cache)
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": position_ids,
            self._cache_arg: boundary,
            "use_cache": True,
        }
        if self._keep_arg is not None:
            kwargs[self._keep_arg] = keep
        logits = self.model(**kwargs).logits
        return logits if keep == 0 else logits[:, -keep:]

    def _masks(
        self, cache: KVCache, position_ids: torch.Tensor, visible: torch.Tensor | None
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The 4-D additive masks of a forward over ``cache``, in the model's dtype."""
        dtype = getattr(self.model, "dtype", torch.float32)
        return additive_masks(cache, position_ids, visible, self.attention, dtype)

    def set_tail_valid(self, valid: torch.Tensor) -> None:
        """Set the mask of the last ``n`` slots to ``valid [batch, n]`` (rejected drafts: 0)."""
        self._cache().set_tail_valid(valid)

    def drop_tail(self, n: int) -> None:
        """Drop the last ``n`` slots (masked in every row: rejected drafts of every row).

        At batch 1 every rejected draft goes this way, so the mask stays all ones and the
        model may skip building an attention mask.
        """
        if self.cache is not None:
            self.cache.drop_tail(n)

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows at ``index`` (``[kept]`` int64), in that order."""
        self._cache().select(index)

    def join(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, valid: torch.Tensor
    ) -> None:
        """Append new rows: their prompts run through a cache of their own, then join this one.

        The narrower of the two caches is left-padded with masked slots, so every row keeps
        its slots in order and the cache stays rectangular (positions are explicit, so the
        padding changes nothing the model computes).

        Parameters
        ----------
        input_ids, position_ids, valid : torch.Tensor
            ``[new, n]`` int64 the new rows' prompts (``n`` may be 0), as for :meth:`forward`.
        """
        fresh = KVCache(input_ids.shape[0], self.device)
        if input_ids.shape[1]:
            fused, boundary = self._route(fresh, input_ids)
            self._run_by(fused, fresh, boundary, input_ids, position_ids, valid, 1, None)
        self._cache().join(fresh)

    def maybe_compact(self, max_length: int) -> bool:
        """Drop masked slots when they make up more than half the cache.

        Parameters
        ----------
        max_length : int
            The longest sequence's length: compaction is considered once the cache is more
            than twice as wide (it then counts the valid slots, one host synchronisation).

        Returns
        -------
        bool
            Whether the cache was compacted.
        """
        if self.cache is None or self.width <= 2 * max_length + 64:
            return False
        return self.compact()

    def room(self, slots: int) -> int:
        """Make room for ``slots`` more slots within the context; how many fit then.

        A model's context bounds its cache too: positions beyond it are clamped, and some
        models index a fixed buffer by slot. When ``slots`` more would pass
        ``max_positions`` the cache is compacted first (a host synchronisation, so only
        then).

        Examples
        --------
        >>> from types import SimpleNamespace
        >>> lm = SimpleNamespace(max_positions=None, width=10)
        >>> CachedLM.room(lm, 5)
        5
        """
        if self.max_positions is None:
            return slots
        if self.width + slots > self.max_positions:
            self.compact()
        return max(0, min(slots, self.max_positions - self.width))

    def compact(self) -> bool:
        """Drop every masked slot (each row's valid slots gathered to the right, in order).

        Returns
        -------
        bool
            Whether the cache was compacted (an empty one never is).
        """
        return self.cache is not None and self.cache.compact()


def check_masked_cache(model: Any, *, role: str = "target", atol: float | None = None) -> None:
    """Check that ``model`` honours a masked slot and explicit positions with a cache.

    The logits of a short sequence are compared with those obtained by feeding it through
    the cache in two blocks, with a masked garbage slot between them, left padding, and
    explicit position ids. For a model with a sliding window of up to 37 positions the
    sequence is longer than the window, so the check also covers the window's edge. A model
    that passes is remembered (:func:`specsample.adapter.checks.remember`).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The causal LM to check (in eval mode).
    role : str
        Name used in the error message.
    atol : float, optional
        Tolerance on the logits (default: scaled to the model's dtype,
        :func:`specsample.adapter.checks.tolerance`).

    Raises
    ------
    ValueError
        The model ignores the mask or the position ids, returns NaN for a plain input
        (broken weights), or returns NaN for a left-padded input even without a cache.
    """
    got, reference, tokens = _probe(CachedLM(model, role=role, check=False, fused=False))
    error = float((got - reference).abs().max())
    diagnosis = checks.nan_diagnosis(model, tokens, role) if math.isnan(error) else None
    if diagnosis is not None:
        raise ValueError(diagnosis)
    if not error <= checks.tolerance(model, reference, atol):
        raise ValueError(
            f"the {role} model does not honour attention_mask and position_ids with a cache "
            f"(logits differ by {error:.3g}); it cannot be used for batched speculative decoding"
        )
    checks.remember(model)


def _fused_agrees(model: Any, fused: FusedForward) -> bool:
    """Whether ``fused`` gives ``model``'s own logits on the probe of :func:`check_masked_cache`."""
    lm = CachedLM(model, check=False, fused=False)
    lm.fused = fused
    got, reference, _ = _probe(lm)
    return bool((got - reference).abs().max() <= checks.tolerance(model, reference))


def _speed_probe(lm: CachedLM, fused: FusedForward) -> Callable[[str, int], None]:
    """The ``run`` of :func:`specsample.adapter.choice.probe` for ``lm``: one forward of
    ``n`` new tokens by ``"fused"`` or by the ``"model"``'s own forward, at batch 1 over a
    cache of :data:`~specsample.adapter.choice.PROBE_CONTEXT` tokens, dropped after it."""
    device = lm.device
    context = choice.PROBE_CONTEXT
    length = context + choice.PROBE_ROWS
    tokens = (torch.arange(length, device=device) * 3 + 1).remainder(lm.vocab_size)[None]
    positions = torch.arange(length, device=device)[None]
    cache = KVCache(1, device)
    boundary = model_cache(cache)
    lm._run_by(fused, cache, boundary, tokens[:, :context], positions[:, :context], None, 1, None)

    def run(forward: str, n: int) -> None:
        ids, at = tokens[:, context : context + n], positions[:, context : context + n]
        by = fused if forward == "fused" else None
        lm._run_by(by, cache, boundary, ids, at, None, n, None)
        cache.drop_tail(n)

    return run


def _probe(lm: CachedLM) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The last two logits of a probe sequence through ``lm``'s cache, and without a cache.

    The sequence goes through the cache in two blocks, with left padding and a masked
    garbage slot between them, at explicit positions; for a model with a sliding window of
    up to 37 positions it is longer than the window, so the window's edge is covered too.

    Returns
    -------
    tuple of torch.Tensor
        ``(cached, reference, tokens)``: ``[2, vocab]`` float32 each, and the probe's
        ``[1, length]`` tokens.
    """
    device = lm.device
    vocab = lm.vocab_size
    length = 6
    if lm.attention.window is not None:
        length = max(length, min(lm.attention.window + 3, 40))
    tokens = (torch.arange(length, device=device) * 5 + 1).remainder(vocab).unsqueeze(0)
    half = length // 2
    with torch.inference_mode():
        reference = lm.model(input_ids=tokens).logits[0, -2:].to(torch.float32)
        lm.reset(1)
        pad = torch.zeros(1, 1, dtype=torch.int64, device=device)
        first = torch.cat([pad, tokens[:, :half], pad + 9 % vocab], dim=1)
        positions = torch.arange(half + 1, device=device)
        lm.forward(
            first,
            torch.cat([pad, positions.unsqueeze(0)], dim=1),
            valid=torch.cat([pad, torch.ones_like(tokens[:, :half]), pad], dim=1),
        )
        rest = torch.arange(half, length, device=device).unsqueeze(0)
        got = lm.forward(tokens[:, half:], rest, keep=2)[0]
    return got.to(torch.float32), reference, tokens
