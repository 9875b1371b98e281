"""Hugging Face causal LMs as the decoding loop drives them: rectangular, masked KV caches.

A :class:`CachedLM` wraps a ``transformers`` causal LM and its ``DynamicCache`` (whose layers
append in place, into buffers with room to spare, instead of concatenating). Every
forward appends the same number of slots to every row; slots that turn out to be rejected
drafts are masked out of the 2-D attention mask for good, and every token gets an explicit
position id, so each row advances by its own accepted length while the cache stays
rectangular. When more than half of the cache is masked it is compacted (the valid slots of
each row gathered to the right, in order), which changes nothing the model computes because
positions are explicit.

This relies on the model building its causal mask from cache *slots*, its padding mask from
the 2-D attention mask and its rotary or learned positions from ``position_ids``; Llama-style
models in ``transformers`` do. :func:`check_masked_cache` verifies it on a given model.

Sliding-window layers (Mistral, Phi-3 and Qwen2 with a window; Gemma 2 and 3, which mix
them with full layers) must not count masked slots in their windows. For those models the
cache records every slot's position and each forward gets a 4-D additive mask per layer
type, built here: a slot is visible when it is valid, not after the query's slot, and (for
a sliding layer) less than ``sliding_window`` positions before the query. Attention kinds
the loop cannot honour (GPT-Neo's local layers, whose window is a fixed slot-indexed
buffer; chunked or linear attention) are refused by :func:`attention_window`.

``transformers`` is imported only inside the functions that need it, so ``specsample``
imports without it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch

from specsample import models
from specsample.generate.fused import FusedForward, fused_forward

_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Models that passed :func:`check_masked_cache` (checked once per model object)."""

_TOKENIZER_PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  indented\n\tlines, digits 0123456789 and symbols {}[]<>#@",
    "Ünïcödé: naïve café, 東京, emoji 🙂",
)


def _config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if config is None or not callable(model):
        raise TypeError(
            "expected a transformers causal LM (a callable with a .config), "
            f"got {type(model).__name__}"
        )
    get_text = getattr(config, "get_text_config", None)
    return get_text(decoder=True) if callable(get_text) else config


def vocab_size(model: Any, role: str = "target") -> int:
    """The vocabulary of a causal LM: its config's ``vocab_size`` (the width of its logits).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The causal LM.
    role : str
        ``"target"`` or ``"draft"``, for error messages.

    Raises
    ------
    TypeError
        ``model`` is not a callable with a ``.config``.
    ValueError
        The config has no positive int ``vocab_size``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> model = lambda **kwargs: None
    >>> model.config = SimpleNamespace(vocab_size=4096)
    >>> vocab_size(model)
    4096
    """
    vocab = getattr(_config(model), "vocab_size", None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"the {role} model's config has no valid vocab_size ({vocab!r})")
    return vocab


_FULL, _SLIDING = "full_attention", "sliding_attention"


class AttentionWindow(NamedTuple):
    """How a model's layers attend, as the cache must mask them.

    Attributes
    ----------
    window : int or None
        The sliding window of its sliding layers, in positions (a query at position ``p``
        sees positions ``p - window + 1 .. p``); ``None`` when every layer sees everything.
    hybrid : bool
        Whether sliding and full layers are mixed (the model then takes one mask per layer
        type).
    """

    window: int | None
    hybrid: bool


def attention_window(config: Any, role: str = "target") -> AttentionWindow:
    """Read a model config's attention layers; refuse the kinds the loop cannot honour.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The (text) config of the causal LM.
    role : str
        ``"target"`` or ``"draft"``, for error messages.

    Raises
    ------
    ValueError
        Naming the layer type: GPT-Neo's ``local`` layers, a ``layer_types`` entry other
        than full or sliding attention, or a sliding layer without a positive window.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> attention_window(SimpleNamespace(sliding_window=4096))
    AttentionWindow(window=4096, hybrid=False)
    >>> attention_window(SimpleNamespace(layer_types=["sliding_attention", "full_attention"],
    ...                                  sliding_window=512))
    AttentionWindow(window=512, hybrid=True)
    >>> attention_window(SimpleNamespace(layer_types=["full_attention"], sliding_window=512))
    AttentionWindow(window=None, hybrid=False)
    """
    local = [t for t in getattr(config, "attention_layers", None) or () if t != "global"]
    if local:
        raise ValueError(
            f"the {role} model has {local[0]!r} attention layers (GPT-Neo style), whose window "
            "counts cache slots rather than positions; the loop cannot serve them"
        )
    layer_types = list(getattr(config, "layer_types", None) or ())
    unknown = sorted({t for t in layer_types if t not in (_FULL, _SLIDING)})
    if unknown:
        raise ValueError(
            f"the {role} model has {unknown[0]!r} attention layers, which the loop cannot serve "
            "(it serves full and sliding-window attention)"
        )
    window = getattr(config, "sliding_window", None)
    if layer_types:
        sliding = _SLIDING in layer_types
    else:
        sliding = window is not None and bool(getattr(config, "use_sliding_window", True))
    if not sliding:
        return AttentionWindow(None, False)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(
            f"the {role} model has sliding_attention layers but no positive sliding_window "
            f"({window!r})"
        )
    return AttentionWindow(window, _FULL in layer_types)


def cache_argument(parameters: Mapping[str, inspect.Parameter]) -> str:
    """The keyword a model's forward takes its KV cache by: ``"cache"`` or ``"past_key_values"``.

    ``transformers`` 5 names it ``cache`` (``past_key_values`` is deprecated there, to be
    removed in 5.40); earlier versions only know ``past_key_values``. The current name is
    used whenever the forward's signature (``inspect.signature(model.forward).parameters``)
    lists it.

    Examples
    --------
    >>> def new(input_ids, cache=None, **kwargs): ...
    >>> def old(input_ids, past_key_values=None, **kwargs): ...
    >>> cache_argument(inspect.signature(new).parameters)
    'cache'
    >>> cache_argument(inspect.signature(old).parameters)
    'past_key_values'
    """
    return "cache" if "cache" in parameters else "past_key_values"


class CachedLM:
    """A causal LM and its KV cache, fed rectangular blocks of slots with a per-slot mask.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose forward takes ``input_ids``, ``attention_mask``, ``position_ids``
        and a cache and returns ``.logits``. The cache is passed as ``cache=`` when the
        forward's signature names it (``transformers`` 5), else as ``past_key_values=``
        (see :func:`cache_argument`); the signature is read once, here.
    role : str
        ``"target"`` or ``"draft"``, for error messages.
    check : bool
        Run :func:`check_masked_cache` on the model (once per model object).
    fused : bool
        Compute the logits with :class:`~specsample.generate.fused.FusedForward` where it
        serves the model (Llama, Mistral and Qwen2 without a sliding window) and its logits
        equal the model's own on a probe; otherwise, or with ``False``, the model's own
        forward runs.

    Attributes
    ----------
    model : transformers.PreTrainedModel
    max_positions : int or None
        The model's context (``max_position_embeddings``); position ids are clamped below it.
    vocab_size : int
        Width of the model's logits.
    attention : AttentionWindow
        The model's sliding window, if any (:func:`attention_window`).
    fused : FusedForward or None
        The lean forward in use, if any.
    """

    def __init__(
        self, model: Any, role: str = "target", *, check: bool = True, fused: bool = True
    ) -> None:
        config = _config(model)
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
        self.cache: Any = None
        self._mask = torch.zeros(0, 0, dtype=torch.int64)
        self._positions = torch.zeros(0, 0, dtype=torch.int64)
        self.width = 0
        self.fused: FusedForward | None = None
        if check:
            try:
                checked = model in _CHECKED
            except TypeError:
                checked = False
            if not checked:
                check_masked_cache(model, role=role)
        if fused and self.attention.window is None:
            self.fused = fused_forward(model, functools.partial(_fused_agrees, model))

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
        model's own."""
        if self.fused is None:
            return "transformers' forward"
        return "fused forward" + (", oneDNN weights" if self.fused.packed else "")

    def describe(self) -> str:
        """A short description: architecture, layers, hidden size and the forward in use."""
        layers = getattr(self.config, "num_hidden_layers", "?")
        hidden = getattr(self.config, "hidden_size", "?")
        return f"{type(self.model).__name__}, {layers} layers, hidden {hidden}, {self.runs}"

    def reset(self, batch: int) -> None:
        """Start an empty cache for ``batch`` rows."""
        from transformers import DynamicCache

        self.cache = DynamicCache()
        if getattr(self.cache, "layer_class_to_replicate", None) is not None:
            self.cache.layer_class_to_replicate = _growing_layer()
        self._mask = torch.zeros(batch, 64, dtype=torch.int64, device=self.device)
        self._positions = torch.zeros_like(self._mask)
        self.width = 0

    def _grow(self, extra: int) -> None:
        capacity = self._mask.shape[1]
        if self.width + extra <= capacity:
            return
        size = max(2 * capacity, self.width + extra)
        self._mask, self._positions = (
            torch.nn.functional.pad(slots[:, : self.width], (0, size - self.width))
            for slots in (self._mask, self._positions)
        )

    def _masks(
        self, positions: torch.Tensor, visible: torch.Tensor | None
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The 4-D additive masks of a forward whose queries sit at ``positions [batch, n]``.

        A query sees the valid slots up to its own, those less than the sliding window
        before it on sliding layers, and, among the last ``t`` slots, only those that
        ``visible [n, t]`` (bool) allows (a token tree: its ancestors and itself).

        ``[batch, 1, n, width]`` in the model's dtype, 0 where a query may attend and a
        very negative value elsewhere: the lowest float32 (or the dtype's lowest, if
        higher), never ``-inf``, so that a query of a padding slot, which sees nothing,
        produces no NaN, even where attention takes its softmax in float32. Hybrid models
        get one mask per layer type.
        """
        n, width = positions.shape[1], self.width
        slots = torch.arange(width, device=positions.device)
        causal = slots <= (slots[width - n :]).unsqueeze(-1)
        if visible is not None:
            causal[:, width - visible.shape[1] :] &= visible
        allowed = self._mask[:, None, :width].bool() & causal
        dtype = getattr(self.model, "dtype", torch.float32)
        low = max(torch.finfo(dtype).min, torch.finfo(torch.float32).min)
        zeros = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
        full = zeros.masked_fill(allowed.logical_not(), low).unsqueeze(1)
        window = self.attention.window
        if window is None:
            return full
        near = positions.unsqueeze(-1) - self._positions[:, None, :width] < window
        sliding = zeros.masked_fill_((allowed & near).logical_not_(), low).unsqueeze(1)
        return {_SLIDING: sliding, _FULL: full} if self.attention.hybrid else sliding

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
        n = input_ids.shape[1]
        self._grow(n)
        new = self._mask[:, self.width : self.width + n]
        if valid is None:
            new.fill_(1)
        else:
            new.copy_(valid)
        if self.max_positions:
            position_ids = position_ids.clamp(max=self.max_positions - 1)
        if self.attention.window is not None:
            self._positions[:, self.width : self.width + n].copy_(position_ids)
        self.width += n
        if self.fused is not None:
            full = cast(torch.Tensor, self._masks(position_ids, visible))  # no window: one mask
            return self.fused(input_ids, position_ids, full, self.cache, keep)
        mask: torch.Tensor | dict[str, torch.Tensor] = self._mask[:, : self.width]
        if self.attention.window is not None or visible is not None:
            mask = self._masks(position_ids, visible)
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": position_ids,
            self._cache_arg: self.cache,
            "use_cache": True,
        }
        if self._keep_arg is not None:
            kwargs[self._keep_arg] = keep
        logits = self.model(**kwargs).logits
        return logits if keep == 0 else logits[:, -keep:]

    def set_tail_valid(self, valid: torch.Tensor) -> None:
        """Set the mask of the last ``n`` slots to ``valid [batch, n]`` (rejected drafts: 0)."""
        n = valid.shape[1]
        self._mask[:, self.width - n : self.width].copy_(valid)

    def drop_tail(self, n: int) -> None:
        """Drop the last ``n`` slots (masked in every row: rejected drafts of every row).

        At batch 1 every rejected draft goes this way, so the mask stays all ones and the
        model may skip building an attention mask. Caches of unknown layout keep the slots
        (masked).
        """
        if n <= 0 or self.cache is None:
            return
        tensors = self._tensors()
        if tensors is None:
            return
        self._replace([tensor[:, :, : self.width - n] for tensor in tensors])
        self._mask[:, self.width - n : self.width] = 0
        self.width -= n

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows at ``index`` (``[kept]`` int64), in that order."""
        if self.cache is not None and self.width:
            self.cache.batch_select_indices(index)
        self._mask = self._mask[index]
        self._positions = self._positions[index]

    def _layer_tensors(self) -> list[tuple[Any, str, int | None]]:
        """Where the key and value tensors live: ``(holder, attribute, list index)``."""
        cache = self.cache
        found: list[tuple[Any, str, int | None]] = []
        layers = getattr(cache, "layers", None)
        if layers is not None:
            for layer in layers:
                for name in ("keys", "values"):
                    found.append((layer, name, None))
        else:
            for name in ("key_cache", "value_cache"):
                for i in range(len(getattr(cache, name, ()))):
                    found.append((cache, name, i))
        return found

    def _tensors(self) -> list[torch.Tensor] | None:
        """The ``[batch, heads, width, dim]`` keys and values, ``None`` if laid out otherwise."""
        tensors = []
        for holder, name, i in self._layer_tensors():
            value = getattr(holder, name)
            tensor = value if i is None else value[i]
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
                return None
            if tensor.shape[2] != self.width:
                return None
            tensors.append(tensor)
        return tensors or None

    def _replace(self, tensors: list[torch.Tensor]) -> None:
        """Store ``tensors`` where :meth:`_tensors` found them."""
        for (holder, name, i), tensor in zip(self._layer_tensors(), tensors, strict=True):
            if i is None:
                setattr(holder, name, tensor)
            else:
                getattr(holder, name)[i] = tensor

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

        Raises
        ------
        ValueError
            The model's cache has a layout other than ``[batch, heads, slots, dim]`` tensors.
        """
        fresh = CachedLM(self.model, self.role, check=False)
        fresh.reset(input_ids.shape[0])
        if input_ids.shape[1]:
            fresh.forward(input_ids, position_ids, valid=valid)
        width = max(self.width, fresh.width)
        if width:
            self._concatenate(fresh, width)
        old = self._mask.shape[0]
        joined = []
        for mine, theirs in ((self._mask, fresh._mask), (self._positions, fresh._positions)):
            shape = (old + theirs.shape[0], width + 64)
            slots = torch.zeros(shape, dtype=torch.int64, device=mine.device)
            slots[:old, width - self.width : width] = mine[:, : self.width]
            slots[old:, width - fresh.width : width] = theirs[:, : fresh.width]
            joined.append(slots)
        self._mask, self._positions = joined
        self.width = width

    def _concatenate(self, fresh: CachedLM, width: int) -> None:
        """Stack this cache's rows and ``fresh``'s, both left-padded to ``width`` slots."""
        mine, theirs = self._tensors() if self.width else None, fresh._tensors()
        if (fresh.width and theirs is None) or (self.width and mine is None):
            raise ValueError(
                f"the {self.role} model's cache is not a list of [batch, heads, slots, dim] "
                "tensors; new sequences cannot join a running batch"
            )
        base = mine if mine is not None else theirs
        if base is None:
            return
        old_rows, new_rows = self._mask.shape[0], fresh._mask.shape[0]
        joined = []
        for index, reference in enumerate(base):
            parts = []
            for tensors, rows in ((mine, old_rows), (theirs, new_rows)):
                if tensors is None:
                    shape = (rows, reference.shape[1], width, reference.shape[3])
                    parts.append(reference.new_zeros(shape))
                    continue
                tensor = tensors[index]
                pad = width - tensor.shape[2]
                parts.append(torch.nn.functional.pad(tensor, (0, 0, pad, 0)) if pad else tensor)
            joined.append(torch.cat(parts))
        if mine is None:
            self.cache = fresh.cache
        self._replace(joined)

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
            Whether the cache was compacted (caches of unknown layout never are).
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
            Whether the cache was compacted (caches of unknown layout never are).
        """
        if self.cache is None:
            return False
        tensors = self._tensors()
        if tensors is None:
            return False
        mask = self._mask[:, : self.width]
        longest = int(mask.sum(dim=1).max()) if mask.shape[0] else 0
        slots = torch.arange(self.width, device=mask.device)
        order = torch.where(mask.bool(), slots, -1).sort(dim=1).values
        kept = order[:, self.width - longest :]
        index = kept.clamp(min=0)
        gathered = []
        for tensor in tensors:
            batch, heads, _, dim = tensor.shape
            gathered.append(tensor.gather(2, index[:, None, :, None].expand(batch, heads, -1, dim)))
        self._replace(gathered)
        positions = self._positions[:, : self.width].gather(1, index)
        self.width = kept.shape[1]
        self._mask = torch.zeros(
            mask.shape[0], self.width + 64, dtype=torch.int64, device=mask.device
        )
        self._mask[:, : self.width] = (kept >= 0).to(torch.int64)
        self._positions = torch.zeros_like(self._mask)
        self._positions[:, : self.width] = positions
        return True


def _append(
    cached: torch.Tensor | None, room: torch.Tensor | None, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cached [batch, heads, n, dim]`` followed by ``new [batch, heads, m, dim]``, in place.

    ``room`` is the buffer that ``cached`` may be a prefix of (its first ``n`` slots): then
    ``new`` is written after them and the first ``n + m`` slots are returned. Otherwise (a
    first call, ``cached`` replaced by another tensor: compacted, rows selected or joined;
    or a full buffer) a buffer with twice the room needed is allocated and ``cached`` copied
    into it. Returns the cached slots and the buffer.
    """
    length = cached.shape[2] if cached is not None and cached.dim() == 4 else 0
    total = length + new.shape[2]
    if not (length and room is not None and _prefix_of(cached, room, total)):
        batch, heads, _, dim = new.shape
        fresh = new.new_empty(batch, heads, max(2 * total, 64), dim)
        if length and cached is not None:
            fresh[:, :, :length].copy_(cached)
        room = fresh
    room[:, :, length:total].copy_(new)
    return room[:, :, :total], room


def _prefix_of(cached: torch.Tensor | None, room: torch.Tensor, total: int) -> bool:
    """Whether ``cached`` is ``room``'s first slots and ``room`` holds ``total`` slots."""
    return (
        cached is not None
        and cached.data_ptr() == room.data_ptr()
        and cached.stride() == room.stride()
        and room.shape[2] >= total
        and cached.shape[:2] == room.shape[:2]
        and cached.shape[3] == room.shape[3]
    )


@functools.cache
def _growing_layer() -> type:
    """A ``transformers`` cache layer that appends in place into a buffer with room to spare.

    ``DynamicLayer`` concatenates on every forward, copying the whole cache each time; this
    layer copies only the new slots (and the cache when its buffer is full, doubling it).
    """
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):  # type: ignore[misc]
        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys, self._key_room = _append(
                self.keys, getattr(self, "_key_room", None), key_states
            )
            self.values, self._value_room = _append(
                self.values, getattr(self, "_value_room", None), value_states
            )
            return self.keys, self.values

    return GrowingLayer


def check_masked_cache(model: Any, *, role: str = "target", atol: float | None = None) -> None:
    """Check that ``model`` honours a masked slot and explicit positions with a cache.

    The logits of a short sequence are compared with those obtained by feeding it through
    the cache in two blocks, with a masked garbage slot between them, left padding, and
    explicit position ids. For a model with a sliding window of up to 37 positions the
    sequence is longer than the window, so the check also covers the window's edge.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The causal LM to check (in eval mode).
    role : str
        Name used in the error message.
    atol : float, optional
        Tolerance on the logits (default: scaled to the model's dtype).

    Raises
    ------
    ValueError
        The model ignores the mask or the position ids.
    """
    lm = CachedLM(model, role=role, check=False, fused=False)
    got, reference, tokens = _probe(lm)
    error = float((got - reference).abs().max())
    if math.isnan(error) and _nan_when_padded(lm.model, tokens):
        implementation = getattr(_config(lm.model), "_attn_implementation", None)
        raise ValueError(
            f"the {role} model returns NaN for a left-padded input even without a cache "
            f"(attention {implementation!r}, {getattr(lm.model, 'dtype', 'unknown dtype')}): "
            "a padding slot that attends to nothing turns its softmax into NaN, as "
            "transformers' own padded batches do; load the model with "
            "attn_implementation='sdpa' or in float32"
        )
    if not error <= _tolerance(model, reference, atol):
        raise ValueError(
            f"the {role} model does not honour attention_mask and position_ids with a cache "
            f"(logits differ by {error:.3g}); it cannot be used for batched speculative decoding"
        )
    with contextlib.suppress(TypeError):
        _CHECKED.add(model)


def _probe(lm: CachedLM) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The last two logits of a probe sequence through ``lm``'s cache, and without a cache.

    The sequence goes through the cache in two blocks, with left padding and a masked
    garbage slot between them, at explicit positions; for a model with a sliding window of
    up to 37 positions it is longer than the window. Returns ``(cached, reference,
    tokens)``: ``[2, vocab]`` float32 each, and the probe's ``[1, length]`` tokens.
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


def _tolerance(model: Any, reference: torch.Tensor, atol: float | None) -> float:
    """How far probe logits may stray: ``atol`` (default by dtype) times the logits' scale."""
    if atol is None:
        half = getattr(model, "dtype", torch.float32) in (torch.float16, torch.bfloat16)
        atol = 5e-2 if half else 1e-3
    return atol * (1.0 + float(reference.abs().max()))


def _fused_agrees(model: Any, fused: FusedForward) -> bool:
    """Whether ``fused`` gives ``model``'s own logits on the probe of :func:`check_masked_cache`."""
    lm = CachedLM(model, check=False, fused=False)
    lm.fused = fused
    got, reference, _ = _probe(lm)
    return bool((got - reference).abs().max() <= _tolerance(model, reference, None))


def _nan_when_padded(model: Any, tokens: torch.Tensor) -> bool:
    """Whether ``model`` gives NaN logits for ``tokens [1, n]`` behind one padding slot."""
    padded = torch.cat([torch.zeros_like(tokens[:, :1]), tokens], dim=1)
    mask = torch.ones_like(padded)
    mask[:, 0] = 0
    with torch.inference_mode():
        logits = model(input_ids=padded, attention_mask=mask).logits
    return bool(logits[:, 1:].isnan().any())


def load_model(path: str | Path, *, role: str = "target") -> Any:
    """Load a causal LM from a local model directory or GGUF file (never from a hub), in eval mode.

    A ``.gguf`` file is loaded by transformers' GGUF support, which dequantizes quantized
    tensors to a dense model (see :mod:`specsample.generate.loading`).

    Parameters
    ----------
    path : str or Path
        A directory holding ``config.json`` and the weights, or a ``.gguf`` file.
    role : str
        ``"target"`` or ``"draft"``, for error messages.

    Raises
    ------
    ValueError
        ``path`` is neither a directory holding a ``config.json`` nor a GGUF file (the
        message names it and what was expected).
    ImportError
        ``path`` is a GGUF file and the ``gguf`` or ``accelerate`` package is missing.
    """
    from specsample.generate import loading

    source = loading.model_source(path, role=role)
    if source.is_gguf:
        loading.require_gguf()
    from transformers import AutoModelForCausalLM

    options = loading.from_pretrained_options(source)
    model = AutoModelForCausalLM.from_pretrained(source.directory, **options)
    return model.eval()


def load_tokenizer(path: str | Path, *, role: str = "target") -> Any:
    """Load the tokenizer of a local model directory or GGUF file (never from a hub).

    Parameters
    ----------
    path : str or Path
        A directory holding a tokenizer file (``tokenizer.json``, ...), or a ``.gguf`` file.
    role : str
        ``"target"`` or ``"draft"``, for error messages.

    Raises
    ------
    ValueError
        ``path`` is neither a directory holding a tokenizer file nor a GGUF file (the
        message names it and what was expected).
    ImportError
        ``path`` is a GGUF file and the ``gguf`` or ``accelerate`` package is missing.
    """
    from specsample.generate import loading

    source = loading.model_source(path, role=role, part="tokenizer")
    if source.is_gguf:
        loading.require_gguf()
    from transformers import AutoTokenizer

    options = loading.from_pretrained_options(source, model=False)
    return AutoTokenizer.from_pretrained(source.directory, **options)


def check_same_tokenizer(
    target: Any, draft: Any, probes: Sequence[str] = _TOKENIZER_PROBES
) -> None:
    """Check that two tokenizers agree: same vocabulary, same encodings of a few strings.

    Raises
    ------
    ValueError
        Naming the first difference found.
    """
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    if target_vocab != draft_vocab:
        only_target = len(set(target_vocab.items()) - set(draft_vocab.items()))
        only_draft = len(set(draft_vocab.items()) - set(target_vocab.items()))
        raise ValueError(
            "the target and draft tokenizers differ: vocabularies of "
            f"{len(target_vocab)} and {len(draft_vocab)} tokens, {only_target} entries only in "
            f"the target's and {only_draft} only in the draft's"
        )
    for text in probes:
        a = target.encode(text, add_special_tokens=True)
        b = draft.encode(text, add_special_tokens=True)
        if a != b:
            raise ValueError(
                f"the target and draft tokenizers encode {text!r} differently: {a} vs {b}"
            )


def default_pair() -> tuple[Path, Path] | None:
    """The installed default ``(target, draft)`` directories, or ``None`` when there is none.

    They live under :data:`specsample.models.DEFAULT_DIR`; a model directory counts as
    installed when it holds a ``config.json``.

    Examples
    --------
    >>> pair = default_pair()
    >>> pair is None or [p.name for p in pair] == ["target", "draft"]
    True
    """
    target, draft = models.DEFAULT_DIR / "target", models.DEFAULT_DIR / "draft"
    if (target / "config.json").is_file() and (draft / "config.json").is_file():
        return target, draft
    return None
