"""The model adapter: loading models, the KV cache the loop owns, the fused forward.

Everything the decoding loop (:mod:`specsample.generate`) needs of a Hugging Face causal LM
lives here, below the loop: :func:`load_model` and :func:`load_tokenizer` read a local model
directory or GGUF file (:mod:`~specsample.adapter.loading`, :mod:`~specsample.adapter.gguf`);
:class:`CachedLM` runs a model over a :class:`KVCache` (:mod:`~specsample.adapter.lm`,
:mod:`~specsample.adapter.cache`, handed to ``transformers`` by
:mod:`~specsample.adapter.model_cache`, masked by :mod:`~specsample.adapter.masks`),
with the lean :class:`FusedForward` where it serves the model (:mod:`~specsample.adapter.fused`)
and after :func:`check_masked_cache` (:mod:`~specsample.adapter.checks`);
:mod:`~specsample.adapter.config` reads what a model's config says.

``transformers`` is imported only when a model is loaded or run.
"""

from specsample.adapter.cache import KVCache
from specsample.adapter.config import AttentionWindow, attention_window, cache_argument, vocab_size
from specsample.adapter.fused import FusedForward, fused_forward
from specsample.adapter.gguf import GgufHeader, read_gguf_header
from specsample.adapter.lm import CachedLM, check_masked_cache
from specsample.adapter.loading import (
    ModelSource,
    check_same_tokenizer,
    default_pair,
    describe_model,
    load_model,
    load_tokenizer,
    model_source,
)

__all__ = [
    "AttentionWindow",
    "CachedLM",
    "FusedForward",
    "GgufHeader",
    "KVCache",
    "ModelSource",
    "attention_window",
    "cache_argument",
    "check_masked_cache",
    "check_same_tokenizer",
    "default_pair",
    "describe_model",
    "fused_forward",
    "load_model",
    "load_tokenizer",
    "model_source",
    "read_gguf_header",
    "vocab_size",
]
