"""A lean forward for Llama-style causal LMs: the same function, less work per call.

On a CPU a decoding step of a small model spends much of its time outside the arithmetic:
``transformers`` builds its masks, dispatches through decorators, output recorders and cache
classes, and runs each projection as its own matrix product, which the default BLAS does
poorly for the few rows a decoding step has (one to a few dozen). :class:`FusedForward`
computes the same logits from the model's own parameters with the fewest operations:

* the query, key and value projections as one matrix product, and the gate and up
  projections of the MLP as another;
* on a CPU, for float32 weights (up to :data:`PACK_LIMIT_BYTES`), those products run on
  weights laid out once for oneDNN (``torch.ops.mkldnn``), 1.5 to 2.7 times faster than the
  default matrix product for 1 to 48 rows on a two-core x86-64 machine;
* rotary tables computed once per forward, the keys and values appended in place to the
  loop's own :class:`~specsample.adapter.cache.KVCache` (the one the model's forward writes
  through its ``transformers`` boundary), attention by
  :func:`torch.nn.functional.scaled_dot_product_attention` under the cache's additive mask;
* the LM head applied to the kept positions only.

It serves Llama, Mistral and Qwen2 models without a sliding window whose rotary embedding
is static (default, linear or Llama 3 scaling). :func:`fused_forward` builds one and checks
it against the model's own forward on a short masked, cached, left-padded sequence before
anything uses it; a model it does not serve, or that fails the check, keeps the plain
forward. The logits equal the model's own up to floating-point rounding (about ``1e-6``
relative in float32; the norms and rotary tables follow ``transformers`` step by step,
float32 where it takes float32).

The weights are read when it is built: a model whose parameters change afterwards needs a
new one (each :class:`~specsample.adapter.lm.CachedLM` checks a fingerprint of the
parameters, see :func:`fused_forward`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from specsample.adapter.cache import KVCache

PACK_LIMIT_BYTES = 1 << 30
"""Largest total size of a model's projection weights laid out for oneDNN (the layout is a
copy of the weights, so it costs their memory once more)."""

PACK_MIN_ELEMENTS = 1 << 17
"""Smallest joined weight laid out for oneDNN: a oneDNN product costs about 15 us more per
call, which smaller weights do not win back (measured on a two-core x86-64 machine)."""

_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
_ROPE_TYPES = frozenset({"default", "linear", "llama3"})

_BUILT: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], FusedForward | None]] = (
    weakref.WeakKeyDictionary()
)
"""Per model: the parameter fingerprint a fused forward was built for, and the forward (or
``None`` where it does not serve the model)."""


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``weight`` may be laid out for oneDNN's matrix product (float32 on a CPU).

    Examples
    --------
    >>> can_pack(torch.zeros(4, 3, dtype=torch.float64))
    False
    """
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


class Projection:
    """Linear layers that read the same input, applied as one matrix product.

    Parameters
    ----------
    layers : sequence of torch.nn.Linear
        Layers with the same ``in_features``; their outputs are returned in order.
    pack : bool
        Lay the joined weight out for oneDNN (see :func:`can_pack`) when it has at least
        :data:`PACK_MIN_ELEMENTS` elements; otherwise the layers run one by one on their
        own weights, which are not copied.

    Examples
    --------
    >>> q, k = torch.nn.Linear(4, 3), torch.nn.Linear(4, 2, bias=False)
    >>> x = torch.randn(2, 4)
    >>> a, b = Projection([q, k], pack=False)(x)
    >>> bool(torch.equal(a, q(x))) and bool(torch.equal(b, k(x)))
    True
    """

    def __init__(self, layers: Sequence[torch.nn.Linear], *, pack: bool) -> None:
        self.sizes = [layer.out_features for layer in layers]
        self.layers = [(layer.weight.detach(), _bias(layer)) for layer in layers]
        self.packed: tuple[torch.Tensor, torch.Tensor | None] | None = None
        if pack and sum(w.numel() for w, _ in self.layers) >= PACK_MIN_ELEMENTS:
            weight = torch.cat([w for w, _ in self.layers])
            if all(b is None for _, b in self.layers):
                bias = None
            else:
                bias = torch.cat(
                    [b if b is not None else w.new_zeros(w.shape[0]) for w, b in self.layers]
                )
            self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight), bias)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The layers' outputs for ``x [..., in_features]``."""
        if self.packed is None:
            return [F.linear(x, weight, bias) for weight, bias in self.layers]
        weight, bias = self.packed
        joined = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return list(joined.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [joined]


def _bias(layer: torch.nn.Linear) -> torch.Tensor | None:
    return None if layer.bias is None else layer.bias.detach()


class _Layer:
    """One decoder layer's parameters, as :class:`FusedForward` applies them."""

    def __init__(self, layer: Any, pack: bool) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.input_norm = _norm(layer.input_layernorm)
        self.post_norm = _norm(layer.post_attention_layernorm)
        self.qkv = Projection([attention.q_proj, attention.k_proj, attention.v_proj], pack=pack)
        self.out = Projection([attention.o_proj], pack=pack)
        self.gate_up = Projection([mlp.gate_proj, mlp.up_proj], pack=pack)
        self.down = Projection([mlp.down_proj], pack=pack)
        self.projections = (self.qkv, self.out, self.gate_up, self.down)
        self.act: Callable[[torch.Tensor], torch.Tensor] = mlp.act_fn


def _norm(module: Any) -> tuple[torch.Tensor, float]:
    return module.weight.detach(), float(module.variance_epsilon)


def _rms_norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """``transformers``' RMS norm: statistics in float32, the weight in the input's dtype."""
    weight, eps = norm
    wide = x.to(torch.float32)
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class FusedForward:
    """The logits of a Llama-style causal LM, computed with the fewest operations.

    Build it with :func:`fused_forward`, which checks that the model is one it serves and
    that its logits equal the model's own.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A ``LlamaForCausalLM``, ``MistralForCausalLM`` or ``Qwen2ForCausalLM`` (without a
        sliding window).
    pack : bool
        Lay the larger projection weights out for oneDNN where :func:`can_pack` allows and
        they total at most :data:`PACK_LIMIT_BYTES` (``False``: the model's own weights).

    Attributes
    ----------
    packed : bool
        Whether some weights were laid out for oneDNN.

    Examples
    --------
    >>> import transformers
    >>> from specsample.adapter import CachedLM
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...     num_attention_heads=2, max_position_embeddings=64)
    >>> lm = CachedLM(transformers.LlamaForCausalLM(config).eval())
    >>> lm.runs, isinstance(lm.fused, FusedForward)
    ('fused forward', True)
    >>> lm.reset(1)
    >>> with torch.inference_mode():
    ...     logits = lm.forward(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]]), keep=2)
    >>> tuple(logits.shape)
    (1, 2, 32)
    """

    def __init__(self, model: Any, *, pack: bool = True) -> None:
        inner = model.model
        config = model.config
        modules = [module for layer in inner.layers for module in _projections(layer)]
        weights = [module.weight for module in (*modules, model.lm_head)]
        size = sum(w.numel() * w.element_size() for w in weights)
        pack = pack and all(can_pack(w) for w in weights) and size <= PACK_LIMIT_BYTES
        self.embedding = inner.embed_tokens.weight.detach()
        self.layers = [_Layer(layer, pack) for layer in inner.layers]
        self.norm = _norm(inner.norm)
        self.head = Projection([model.lm_head], pack=pack)
        self.packed = self.head.packed is not None or any(
            p.packed is not None for layer in self.layers for p in layer.projections
        )
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.scaling = float(inner.layers[0].self_attn.scaling)
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().to(torch.float32)
        self.rotary_scaling = float(rotary.attention_scaling)

    def __call__(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        keep: int,
    ) -> torch.Tensor:
        """Append ``n`` slots to ``cache`` and return the logits of the last ``keep``.

        Parameters
        ----------
        input_ids, position_ids : torch.Tensor
            ``[batch, n]`` int64.
        mask : torch.Tensor
            ``[batch, 1, n, width]`` additive mask in the model's dtype (``width`` slots
            after this forward's).
        cache : KVCache
            The KV cache; each layer's keys and values are appended through
            :meth:`KVCache.update`.
        keep : int
            How many of the last positions get logits (``0``: all).

        Returns
        -------
        torch.Tensor
            ``[batch, keep or n, vocab]`` in the model's dtype.
        """
        batch, n = input_ids.shape
        x = F.embedding(input_ids, self.embedding)
        freqs = position_ids[..., None].to(torch.float32) * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = (angles.cos() * self.rotary_scaling).to(x.dtype).unsqueeze(1)
        sin = (angles.sin() * self.rotary_scaling).to(x.dtype).unsqueeze(1)
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        for index, layer in enumerate(self.layers):
            query, key, value = layer.qkv(_rms_norm(x, layer.input_norm))
            query = _rotate(query.view(batch, n, heads, dim).transpose(1, 2), cos, sin)
            key = _rotate(key.view(batch, n, kv_heads, dim).transpose(1, 2), cos, sin)
            value = value.view(batch, n, kv_heads, dim).transpose(1, 2)
            keys, values = cache.update(index, key, value)
            attended = F.scaled_dot_product_attention(
                query,
                keys,
                values,
                attn_mask=mask,
                scale=self.scaling,
                enable_gqa=kv_heads != heads,
            )
            (out,) = layer.out(attended.transpose(1, 2).reshape(batch, n, heads * dim))
            x = x + out
            gate, up = layer.gate_up(_rms_norm(x, layer.post_norm))
            (down,) = layer.down(layer.act(gate) * up)
            x = x + down
        if keep:
            x = x[:, -keep:]
        (logits,) = self.head(_rms_norm(x, self.norm))
        return logits


def _projections(layer: Any) -> tuple[Any, ...]:
    attention, mlp = layer.self_attn, layer.mlp
    return (
        attention.q_proj,
        attention.k_proj,
        attention.v_proj,
        attention.o_proj,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    )


def unsupported(model: Any) -> str | None:
    """Why :class:`FusedForward` does not serve ``model``, or ``None`` when it does.

    Examples
    --------
    >>> unsupported(torch.nn.Linear(2, 2))
    'no config'
    """
    config = getattr(model, "config", None)
    if config is None:
        return "no config"
    model_type = getattr(config, "model_type", None)
    if model_type not in _MODEL_TYPES:
        return f"model type {model_type!r}"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(model, "lm_head"):
        return "no .model or .lm_head"
    rotary = getattr(inner, "rotary_emb", None)
    if getattr(rotary, "rope_type", "default") not in _ROPE_TYPES or not hasattr(
        rotary, "inv_freq"
    ):
        return f"rotary embedding {getattr(rotary, 'rope_type', None)!r}"
    for layer in getattr(inner, "layers", ()):
        if not all(isinstance(module, torch.nn.Linear) for module in _projections(layer)):
            return "projections that are not torch.nn.Linear"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "variance_epsilon"):
                return "norms that are not RMS norms"
        if getattr(layer.self_attn, "sliding_window", None) is not None:
            return "a sliding window"
    return None


def fused_forward(model: Any, check: Callable[[FusedForward], bool]) -> FusedForward | None:
    """The :class:`FusedForward` of ``model``, or ``None`` where it does not serve it.

    Built once per model and parameter fingerprint (the parameters' storage and version
    counters), so a model whose weights are replaced or changed in place gets a new one.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The causal LM.
    check : callable
        Called once on a new forward; ``False`` (its logits differ from the model's own)
        means the model keeps its plain forward.

    Returns
    -------
    FusedForward or None
    """
    try:
        fingerprint = tuple(
            value
            for parameter in model.parameters()
            for value in (parameter.data_ptr(), parameter._version)
        )
        built = _BUILT.get(model)
    except (AttributeError, TypeError):
        return None
    if built is not None and built[0] == fingerprint:
        return built[1]
    fused: FusedForward | None = None
    if unsupported(model) is None:
        fused = FusedForward(model)
        if not check(fused):
            fused = None
    _BUILT[model] = (fingerprint, fused)
    return fused
