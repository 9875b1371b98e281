"""What a causal LM's config tells the adapter: vocabulary, attention layers, cache keyword.

:func:`text_config` finds the decoder's config, :func:`vocab_size` the width of its logits,
:func:`attention_window` how its layers attend (refusing the kinds the loop cannot honour:
GPT-Neo's local layers, whose window is a fixed slot-indexed buffer; chunked attention;
recurrent and state-space models, :func:`recurrent_kind`) and :func:`cache_argument` the
keyword its forward takes a cache by.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

FULL, SLIDING = "full_attention", "sliding_attention"
"""``transformers``' names of the two layer types the loop serves (``config.layer_types``)."""

RECURRENT = "linear_attention"
"""``transformers``' layer type of every layer that carries a state from token to token
(Mamba blocks, RG-LRU, linear attention), whatever the layer computes."""

_MAMBA, _HYBRID = "a state-space (Mamba) model", "a hybrid of attention and state-space (Mamba)"
RECURRENT_MODELS = {
    "mamba": _MAMBA,
    "mamba2": _MAMBA,
    "falcon_mamba": _MAMBA,
    "bamba": f"{_HYBRID} layers",
    "falcon_h1": f"{_HYBRID} layers",
    "granitemoehybrid": f"{_HYBRID} layers",
    "jamba": f"{_HYBRID} layers",
    "nemotron_h": f"{_HYBRID} layers",
    "zamba": f"{_HYBRID} layers",
    "zamba2": f"{_HYBRID} layers",
    "recurrent_gemma": "a recurrent model (Griffin's RG-LRU layers beside local attention)",
    "rwkv": "a recurrent model (RWKV)",
    "xlstm": "a recurrent model (xLSTM)",
}
"""What each recurrent or state-space ``model_type`` of ``transformers`` is, for messages."""


def text_config(model: Any) -> Any:
    """The decoder config of a causal LM (its text config, for a multimodal one).

    Raises
    ------
    TypeError
        ``model`` is not a callable with a ``.config``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> model = lambda **kwargs: None
    >>> model.config = SimpleNamespace(vocab_size=8)
    >>> text_config(model).vocab_size
    8
    """
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
    vocab = getattr(text_config(model), "vocab_size", None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"the {role} model's config has no valid vocab_size ({vocab!r})")
    return vocab


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


def recurrent_kind(config: Any) -> str | None:
    """What a recurrent or state-space model is, in words; ``None`` for any other model.

    Such a model carries a state from token to token (its ``layer_types`` say
    ``"linear_attention"``, or its ``model_type`` is one of :data:`RECURRENT_MODELS`).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> recurrent_kind(SimpleNamespace(model_type="mamba", layer_types=["linear_attention"]))
    'a state-space (Mamba) model'
    >>> recurrent_kind(SimpleNamespace(model_type="qwen3_next", layer_types=["linear_attention"]))
    'a model with linear-attention layers (qwen3_next)'
    >>> recurrent_kind(SimpleNamespace(model_type="llama")) is None
    True
    """
    model_type = getattr(config, "model_type", None)
    if model_type in RECURRENT_MODELS:
        return RECURRENT_MODELS[model_type]
    if RECURRENT in (getattr(config, "layer_types", None) or ()):
        return f"a model with linear-attention layers ({model_type})"
    return None


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
        Naming what is refused: a recurrent or state-space model (:func:`recurrent_kind`),
        GPT-Neo's ``local`` layers, a ``layer_types`` entry other than full or sliding
        attention, or a sliding layer without a positive window.

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
    recurrent = recurrent_kind(config)
    if recurrent is not None:
        raise ValueError(
            f"the {role} model is {recurrent}, whose layers carry a recurrent state from "
            "token to token: the speculative loop does not support such models (it drops "
            "rejected drafts by masking their cache slots, which a recurrent state cannot "
            "undo); it serves attention models (full or sliding-window attention)"
        )
    local = [t for t in getattr(config, "attention_layers", None) or () if t != "global"]
    if local:
        raise ValueError(
            f"the {role} model has {local[0]!r} attention layers (GPT-Neo style), whose window "
            "counts cache slots rather than positions; the loop cannot serve them"
        )
    layer_types = list(getattr(config, "layer_types", None) or ())
    unknown = sorted({t for t in layer_types if t not in (FULL, SLIDING)})
    if unknown:
        raise ValueError(
            f"the {role} model has {unknown[0]!r} attention layers, which the loop cannot serve "
            "(it serves full and sliding-window attention)"
        )
    window = getattr(config, "sliding_window", None)
    if layer_types:
        sliding = SLIDING in layer_types
    else:
        sliding = window is not None and bool(getattr(config, "use_sliding_window", True))
    if not sliding:
        return AttentionWindow(None, False)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(
            f"the {role} model has sliding_attention layers but no positive sliding_window "
            f"({window!r})"
        )
    return AttentionWindow(window, FULL in layer_types)


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
