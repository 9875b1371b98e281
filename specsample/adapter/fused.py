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
* rotary tables computed once per forward and applied to the queries and keys as one tensor,
  the RMS norms of float32 rows as one operation (``torch.nn.functional.rms_norm``, the same
  values as ``transformers``' step-by-step norm); the keys and values appended in place to the
  loop's own :class:`~specsample.adapter.cache.KVCache` (the one the model's forward writes
  through its ``transformers`` boundary), attention by
  :func:`torch.nn.functional.scaled_dot_product_attention` under the cache's additive mask;
* the LM head applied to the kept positions only.

Weight-only quantized layers (:class:`~specsample.adapter.quantize.QuantizedLinear`) keep
their format, joined the same way (:meth:`~specsample.adapter.weight_formats.QuantizedWeight.join`).
Their products compute each row alone, bit for bit whatever the other rows, but in bfloat16,
which turns the last-bit differences of attention over blocks of different shapes into
differences of about 1% of the logits (0.44 on SmolLM2-135M's logits of scale 41).

So a forward can be *row-exact* (:attr:`FusedForward.row_exact`): each position's logits
are the same bits whether it is computed alone (target-only decoding, one token per sequence
and forward) or inside a verified block, whatever the other sequences of the batch, the
cache's width, its masked slots (rejected drafts, left padding) and the thread count (1 or
2). Verifying a block of drafts then gives exactly the logits target-only decoding gives,
which seeded decoding keyed by position needs to give the same text with and without
drafts (:mod:`~specsample.adapter.exact`). For float32 weights on a CPU (a ``"target"``
:class:`~specsample.adapter.lm.CachedLM`, by default :data:`ROW_EXACT_DEFAULT`) every float
projection is laid out for oneDNN, whose product computes each row alone (probed by
:func:`products_agree`), and attention runs the CPU kernel
:func:`specsample.adapter.exact.attend` (:attr:`FusedForward.exact_ready`), at the speed of
the default forward on the shipped target. Where every projection is quantized and a probe
finds a block's logits bit for bit those of its rows fed one at a time (:func:`rows_agree`),
attention runs the same kernel on float32 activations, else row by row for up to
:data:`ROW_EXACT_ROWS` rows (row-exact then in a cache without masked slots, as at batch 1).

A row-exact forward runs every shape (:mod:`~specsample.adapter.choice` does not hand any to
``transformers``' own forward, which is not row-exact).

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
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from specsample.adapter import exact
from specsample.adapter.cache import KVCache
from specsample.adapter.exact import rows_agree
from specsample.adapter.projection import Projection, can_pack
from specsample.adapter.quantize import QuantizedLinear

PACK_LIMIT_BYTES = 1 << 30
"""Largest total size of a model's projection weights laid out for oneDNN (the layout is a
copy of the weights, so it costs their memory once more)."""

ROW_EXACT_ROWS = 16
"""Most rows a forward of a :attr:`FusedForward.row_exact` model attends to one by one
without the attention kernel (:attr:`FusedForward.exact_ready` false)."""

ROW_EXACT_DEFAULT = True
"""Whether :func:`fused_forward` prepares a row-exact float32 forward unless told."""

_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
_ROPE_TYPES = frozenset({"default", "linear", "llama3"})

_BUILT: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], FusedForward | None]] = (
    weakref.WeakKeyDictionary()
)
"""Per model: the parameter fingerprint a fused forward was built for, and the forward (or
``None`` where it does not serve the model)."""


class _Layer:
    """One decoder layer's parameters, as :class:`FusedForward` applies them."""

    def __init__(self, layer: Any, pack: bool, floor: int | None) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.input_norm = _norm(layer.input_layernorm)
        self.post_norm = _norm(layer.post_attention_layernorm)
        joined = [attention.q_proj, attention.k_proj, attention.v_proj]
        self.qkv = Projection(joined, pack=pack, min_elements=floor)
        self.out = Projection([attention.o_proj], pack=pack, min_elements=floor)
        self.gate_up = Projection([mlp.gate_proj, mlp.up_proj], pack=pack, min_elements=floor)
        self.down = Projection([mlp.down_proj], pack=pack, min_elements=floor)
        self.projections = (self.qkv, self.out, self.gate_up, self.down)
        self.act: Callable[[torch.Tensor], torch.Tensor] = mlp.act_fn


def _norm(module: Any) -> tuple[torch.Tensor, float]:
    return module.weight.detach(), float(module.variance_epsilon)


def _rms_norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """``transformers``' RMS norm: statistics in float32, the weight in the input's dtype
    (on float32 rows and weight, PyTorch's own ``rms_norm``: one operation, the same values)."""
    weight, eps = norm
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
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
        Lay the larger float projection weights out for oneDNN where
        :func:`~specsample.adapter.projection.can_pack` allows and they total at most
        :data:`PACK_LIMIT_BYTES` (``False``: the model's own weights). Quantized layers
        (:class:`~specsample.adapter.quantize.QuantizedLinear`) keep their own format.
    row_exact : bool
        Prepare a row-exact forward where :func:`specsample.adapter.exact.possible` allows
        (float32 on a CPU): every float weight laid out for oneDNN, however small, and
        attention by :func:`specsample.adapter.exact.attend`. Whether it is row-exact is
        then probed by :func:`fused_forward`.

    Attributes
    ----------
    packed : bool
        Whether some float weights were laid out for oneDNN.
    formats : tuple of str
        The formats of the quantized weights it applies (empty for a float model).
    projections : list of Projection
        The LM head's, then each layer's.
    exact_ready : bool
        Whether it was prepared for a row-exact forward (``row_exact`` asked for, and
        possible: every float weight laid out for oneDNN, attention by the CPU kernel).
    row_exact : bool
        Whether each row's logits are computed as if it were alone (set by
        :func:`fused_forward` after :func:`products_agree` and :func:`rows_agree`):
        attention by :func:`specsample.adapter.exact.attend` where :attr:`exact_ready`,
        else (quantized weights without the kernel) row by row for 2 to
        :data:`ROW_EXACT_ROWS` rows.

    Examples
    --------
    >>> import transformers
    >>> from specsample.adapter import CachedLM
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...     num_attention_heads=2, max_position_embeddings=64)
    >>> lm = CachedLM(transformers.LlamaForCausalLM(config).eval())
    >>> lm.runs.startswith("fused forward"), isinstance(lm.fused, FusedForward)
    (True, True)
    >>> lm.reset(1)
    >>> with torch.inference_mode():
    ...     logits = lm.forward(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]]), keep=2)
    >>> tuple(logits.shape)
    (1, 2, 32)
    """

    def __init__(self, model: Any, *, pack: bool = True, row_exact: bool = False) -> None:
        inner = model.model
        config = model.config
        modules = [module for layer in inner.layers for module in _projections(layer)]
        weights = [
            module.weight
            for module in (*modules, model.lm_head)
            if not isinstance(module, QuantizedLinear)
        ]
        size = sum(w.numel() * w.element_size() for w in weights)
        pack = pack and all(can_pack(w) for w in weights) and size <= PACK_LIMIT_BYTES
        self.embedding = inner.embed_tokens.weight.detach()
        device, dtype = self.embedding.device, self.embedding.dtype
        row_exact = row_exact and (pack or not weights) and exact.possible(dtype, device)
        floor = 0 if row_exact else None
        self.layers = [_Layer(layer, pack, floor) for layer in inner.layers]
        self.norm = _norm(inner.norm)
        self.head = Projection([model.lm_head], pack=pack, min_elements=floor)
        projections = [self.head, *(p for layer in self.layers for p in layer.projections)]
        self.projections = projections
        self.packed = any(p.packed is not None for p in projections)
        self.formats = tuple(
            sorted({p.quantized.format for p in projections if p.quantized is not None})
        )
        self.exact_ready = row_exact
        self.row_exact = False
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
        cos = (angles.cos() * self.rotary_scaling).to(x.dtype).unsqueeze(2)
        sin = (angles.sin() * self.rotary_scaling).to(x.dtype).unsqueeze(2)
        heads, dim = self.heads, self.head_dim
        for index, layer in enumerate(self.layers):
            query, key, value = self._heads(layer, _rms_norm(x, layer.input_norm), cos, sin)
            keys, values = cache.update(index, key, value)
            attended = self._attend(query, keys, values, mask)
            (out,) = layer.out(attended.transpose(1, 2).reshape(batch, n, heads * dim))
            x = x + out
            gate, up = layer.gate_up(_rms_norm(x, layer.post_norm))
            (down,) = layer.down(layer.act(gate) * up)
            x = x + down
        if keep:
            x = x[:, -keep:]
        (logits,) = self.head(_rms_norm(x, self.norm))
        return logits

    def _heads(
        self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rotated queries and keys and the values of ``x [batch, n, hidden]``, each
        ``[batch, heads, n, dim]``, under rotary tables ``[batch, n, 1, dim]``: queries and
        keys rotated as one tensor where the projection is one product."""
        batch, n = x.shape[0], x.shape[1]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        joined = layer.qkv.joined(x)
        if joined is None:
            query, key, value = layer.qkv(x)
            query = _rotate(query.view(batch, n, heads, dim), cos, sin)
            key = _rotate(key.view(batch, n, kv_heads, dim), cos, sin)
        else:
            width = (heads + kv_heads) * dim
            both = _rotate(joined[..., :width].view(batch, n, heads + kv_heads, dim), cos, sin)
            query, key, value = both[:, :, :heads], both[:, :, heads:], joined[..., width:]
        value = value.reshape(batch, n, kv_heads, dim)
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

    def _attend(
        self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention of ``query [batch, heads, n, dim]`` over the cache's ``keys`` and
        ``values`` ``[batch, kv_heads, width, dim]`` under ``mask [batch, 1, n, width]``.

        With :attr:`row_exact`, each row attends alone: by
        :func:`specsample.adapter.exact.attend` where :attr:`exact_ready` (any number of
        rows, skipping masked slots), else for at most :data:`ROW_EXACT_ROWS` rows to the
        slots up to its own (a slot never sees later ones), which is the very call a forward
        of that row alone makes.
        """
        if self.row_exact and self.exact_ready:
            attended = exact.attend(query, keys, values, mask, self.scaling)
            if attended is not None:
                return attended
        gqa = self.kv_heads != self.heads
        n, width = query.shape[2], keys.shape[2]
        if not self.row_exact or n == 1 or n > ROW_EXACT_ROWS:
            return F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=gqa
            )
        rows = []
        for row in range(n):
            seen = width - n + row + 1
            rows.append(
                F.scaled_dot_product_attention(
                    query[:, :, row : row + 1],
                    keys[:, :, :seen],
                    values[:, :, :seen],
                    attn_mask=mask[:, :, row : row + 1, :seen],
                    scale=self.scaling,
                    enable_gqa=gqa,
                )
            )
        return torch.cat(rows, dim=2)


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
    linear = (torch.nn.Linear, QuantizedLinear)
    if not isinstance(model.lm_head, linear):
        return "an LM head that is not torch.nn.Linear"
    for layer in getattr(inner, "layers", ()):
        if not all(isinstance(module, linear) for module in _projections(layer)):
            return "projections that are not torch.nn.Linear"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "variance_epsilon"):
                return "norms that are not RMS norms"
        if getattr(layer.self_attn, "sliding_window", None) is not None:
            return "a sliding window"
    return None


def fused_forward(
    model: Any, check: Callable[[FusedForward], bool], *, row_exact: bool | None = None
) -> FusedForward | None:
    """The :class:`FusedForward` of ``model``, or ``None`` where it does not serve it.

    Built once per model, parameter fingerprint (the parameters' storage and version
    counters, and the identity of each quantized weight) and ``row_exact``, so a model whose
    weights are replaced or changed in place gets a new one.

    It is row-exact (:attr:`FusedForward.row_exact`) where every projection is quantized,
    or where it is prepared for it (:attr:`FusedForward.exact_ready`: float32 on a CPU, the
    kernels compiled), and the probes find it so: each product laid out for oneDNN gives a
    block's rows bit for bit as it gives them alone (:func:`products_agree`), and so does
    the whole forward (:func:`rows_agree`). The check then runs on the forward as it will
    run (a row-exact one that fails it is tried again without).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The causal LM.
    check : callable
        Called once on a new forward; ``False`` (its logits differ from the model's own)
        means the model keeps its plain forward.
    row_exact : bool, optional
        Prepare a row-exact float32 forward (default :data:`ROW_EXACT_DEFAULT`).

    Returns
    -------
    FusedForward or None
    """
    try:
        fingerprint = tuple(
            value
            for parameter in model.parameters()
            for value in (parameter.data_ptr(), parameter._version)
        ) + tuple(
            id(module.quantized)
            for module in model.modules()
            if isinstance(module, QuantizedLinear)
        )
        built = _BUILT.get(model)
    except (AttributeError, TypeError):
        return None
    if row_exact is None:
        row_exact = ROW_EXACT_DEFAULT
    fingerprint += (row_exact,)
    if built is not None and built[0] == fingerprint:
        return built[1]
    fused: FusedForward | None = None
    if unsupported(model) is None:
        fused = FusedForward(model, row_exact=row_exact)
        quantized = all(projection.quantized is not None for projection in fused.projections)
        if quantized or fused.exact_ready:
            fused.row_exact = products_agree(fused) and rows_agree(fused)
        agrees = check(fused)
        if not agrees and fused.row_exact:
            fused.row_exact = False
            agrees = check(fused)
        if not agrees:
            fused = None
    _BUILT[model] = (fingerprint, fused)
    return fused


def products_agree(fused: FusedForward) -> bool:
    """Whether each of ``fused``'s products laid out for oneDNN gives a block's rows bit for
    bit as it gives them alone (:func:`specsample.adapter.exact.products_agree`; quantized
    products compute each row alone, float ones the model's own way are not probed).

    Parameters
    ----------
    fused : FusedForward

    Returns
    -------
    bool
    """
    return exact.products_agree([p for p in fused.projections if p.packed is not None])
