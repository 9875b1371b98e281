"""Cold-cache latency and peak-memory benchmark of the verification step.

For each shape ``(batch, k, vocab)`` one run times, on the same inputs:

* ``ours``: :class:`specsample.sampler.RejectionSampler`;
* ``naive``: :func:`specsample.testing.reference.naive_rejection_sample`, which builds the
  residual and draws a recovered token at every position (``[batch, k, vocab]`` temporaries);
* ``hf``: transformers' ``_speculative_sampling`` (Algorithm 1 of Leviathan et al.), when
  transformers can be imported. It verifies one sequence per call and takes logits, so it is
  called once per sequence on ``log(probs)`` prepared beforehand and applies its own softmax;
* ``floor``: one read of the rows any exact verifier must read, the target and draft rows at
  one position per sequence (``2 * batch * vocab`` elements), as ``target[:, 0].sum(-1)``
  and ``draft[:, 0].sum(-1)``.

Methodology
-----------
Inputs are realistic: target rows are ``softmax(4 z)`` with ``z ~ N(0, 1)``, draft rows are
the softmax of correlated logits (``4 (0.98 z + 0.2 z')``), the drafts are sampled from the
draft rows and the bonus tokens from one more target row, so acceptance is what such rows
give (the ``alpha`` column: mean ``sum_x min(q, p)`` per position). A verifier meets its
inputs right after the target model's forward pass, with caches full of other data, so every
call is timed *cold*: before each timed call a buffer larger than the last-level cache
(at least 768 MiB) is overwritten, and every contestant, the floor included, reads its inputs
from memory. Each contestant is warmed up once; then rounds of cold calls interleave the
contestants (one call of each per round, each after its own flush) and the median of each
contestant's calls is reported (fewer calls for the slow naive and transformers contestants).
On a shared machine other processes inflate multi-threaded timings, so the share of the CPUs
they used during the timed calls is reported too (``others``). Peak memory is the largest
number of bytes allocated during one call beyond its inputs (the output included), reported
as a multiple of one ``[batch, k, vocab]`` probability tensor: on CUDA from
:func:`torch.cuda.max_memory_allocated`, on the CPU from the allocation and free events that
:mod:`torch.profiler` records with ``profile_memory=True``. Timings depend on the machine
and its load; they are never used as a pass/fail criterion.

The harness is kept apart from the verifier it measures: :mod:`specsample.bench.inputs`
builds the inputs, :mod:`specsample.bench.measure` times calls cold and measures their peak
memory (reusable for any calls), :mod:`specsample.bench.contestants` lists what is timed,
:mod:`specsample.bench.runner` runs the shapes, :mod:`specsample.bench.table` prints the
table; the ``specsample bench`` command is :mod:`specsample.cli.bench`.
"""

from specsample.bench.contestants import CONTESTANTS, SLOW
from specsample.bench.inputs import (
    DEFAULT_SHAPES,
    DRAFT_MIX,
    MAX_SHAPE_BATCH,
    MAX_SHAPE_K,
    MAX_SHAPE_VALUES,
    MAX_SHAPE_VOCAB,
    QUICK_SHAPES,
    TARGET_SCALE,
    BenchInputs,
    Shape,
    correlated_logits,
    make_inputs,
)
from specsample.bench.measure import (
    MIN_FLUSH_BYTES,
    CallProfile,
    CpuShare,
    Flusher,
    cache_flush_bytes,
    cold_medians,
    extra_peak_bytes,
    profile_calls,
)
from specsample.bench.runner import run_benchmark
from specsample.bench.table import format_table

__all__ = [
    "CONTESTANTS",
    "DEFAULT_SHAPES",
    "DRAFT_MIX",
    "MAX_SHAPE_BATCH",
    "MAX_SHAPE_K",
    "MAX_SHAPE_VALUES",
    "MAX_SHAPE_VOCAB",
    "MIN_FLUSH_BYTES",
    "QUICK_SHAPES",
    "SLOW",
    "TARGET_SCALE",
    "BenchInputs",
    "CallProfile",
    "CpuShare",
    "Flusher",
    "Shape",
    "cache_flush_bytes",
    "cold_medians",
    "correlated_logits",
    "extra_peak_bytes",
    "format_table",
    "make_inputs",
    "profile_calls",
    "run_benchmark",
]
