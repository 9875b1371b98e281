"""The timing part of ``benchmarks/gpu_check.py``: time ratios and effective bandwidth.

:func:`check_timings` prints three tables, every time the median of three rounds of calls
timed on the device (:func:`specsample.timing.per_call`):

1. the chain rule on ``[batch, k, vocab]`` float32 probabilities at every benchmark shape:
   PyTorch's rule, the Triton kernel and, where ``flashinfer`` is importable, FlashInfer's
   ``chain_speculative_sampling``;
2. the logits path end to end (row statistics included) at every benchmark shape:
   :func:`specsample.verify` on the PyTorch and the Triton backend;
3. the **effective bandwidth** at the bandwidth shapes: the bytes of the rows a step must
   read divided by its time, in GB/s and as a fraction of the device's peak memory bandwidth
   (:data:`PEAK_BANDWIDTH`, by device name; GB/s alone for a device not listed), for

   * the probabilities path (:class:`specsample.RejectionSampler`, ``backend="torch"`` and
     ``"triton"``), which must read one target row and one draft row per sequence (the
     residual's; the accept test reads ``k`` entries);
   * the logits path (:func:`specsample.verify`, both backends, and vLLM's own
     ``RejectionSampler`` where ``vllm.v1.sample.rejection_sampler`` is importable on a CUDA
     device; otherwise one ``skipped: vllm not importable`` line), which must read every
     target row once (the statistics of its normaliser) and one target row and one draft row
     per sequence (the residual);
   * the row statistics alone (the Triton backend's ``row_norms`` against
     :func:`specsample.backends.eager.row_norms`), which must read every target row once,
     at the temperature alone and with top-k 50 and top-p 0.9 (:data:`FILTERS`: the filter
     kernel's searches read a row several times).

All three use draft probabilities and temperature 0.8, float32 rows. Bandwidth figures count
only those bytes: a path reading more (several passes, temporaries) shows as a lower figure.

The bandwidth table gives two times per path. *Eager*: back-to-back calls, as a program
calls the path; where the host takes longer to launch a call's kernels than the device to run
them, this is the host's time. *Graph*: the same calls captured once in a CUDA graph
(:data:`GRAPH_CALLS` to a graph) and replayed, so no host work lies between the kernels: the
device's time alone, which is what a step costs in an engine whose host runs ahead of the
device. The specsample paths there take their parameters built once
(:class:`specsample.params.Requests`, :class:`specsample.params.layout.BatchLayout`), as an
engine reusing them does; a path that cannot be captured says why in its graph column.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from specsample import RejectionSampler, verify
from specsample.backends import eager
from specsample.backends import triton as triton_backend
from specsample.kernels import triton as kernels
from specsample.params import Requests, SamplingParams
from specsample.params.layout import BatchLayout
from specsample.params.metadata import SamplingMetadata
from specsample.rules.chain import chain_verify
from specsample.timing import per_call

BANDWIDTH_SHAPES = [(64, 4, 128256), (16, 5, 151936)]
"""``(batch, k, vocab)`` of the effective-bandwidth table on a GPU."""

PEAK_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100 SXM", 3.35e12),
    ("H100 80GB HBM3", 3.35e12),
)
"""Peak memory bandwidth (bytes/s) of devices whose name contains the text (first match)."""

GRAPH_CALLS = 10
"""Calls captured in one CUDA graph for the bandwidth table's graph column."""

TEMPERATURE = 0.8
FILTERS = {"top_k": 50, "top_p": 0.9}
"""The filters of the filtered row-statistics lines."""


def peak_bandwidth(name: str) -> float | None:
    """The peak memory bandwidth of the device called ``name`` in bytes/s, ``None`` if unknown.

    Examples
    --------
    >>> peak_bandwidth("NVIDIA H100 PCIe"), peak_bandwidth("NVIDIA H200"), peak_bandwidth("cpu")
    (2000000000000.0, 4800000000000.0, None)
    """
    for text, peak in PEAK_BANDWIDTH:
        if text.lower() in name.lower():
            return peak
    return None


def probs_case(batch: int, k: int, vocab: int, device: torch.device, seed: int) -> tuple[Any, ...]:
    """Random ``q``, ``p`` ``[batch, k, vocab]``, drafts from ``p``, bonus ids and uniforms."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.softmax(torch.randn(batch, k, vocab, device=device, generator=gen) * 3, -1)
    p = torch.softmax(torch.randn(batch, k, vocab, device=device, generator=gen) * 3, -1)
    ids = torch.multinomial(p.view(-1, vocab), 1, generator=gen).view(batch, k)
    bonus = torch.randint(vocab, (batch, 1), device=device, generator=gen)
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64, device=device, generator=gen)
    return q, p, ids, bonus, uniforms


def _time(run: Callable[[], Any], device: torch.device, iters: int) -> float:
    """Median seconds per call over three rounds of ``iters`` calls (after warm-up)."""
    for _ in range(3):
        run()
    return statistics.median(per_call(run, calls=iters, device=device) for _ in range(3))


def _flashinfer(device: torch.device) -> Callable[..., Any] | None:
    if device.type != "cuda":
        return None
    try:
        from flashinfer.sampling import chain_speculative_sampling
    except ImportError:
        return None
    return chain_speculative_sampling


def _probs_timing(
    device: torch.device,
    shape: tuple[int, int, int],
    iters: int,
    flashinfer: Callable[..., Any] | None,
    takes_uniforms: bool,
) -> str:
    batch, k, vocab = shape
    q, p, ids, bonus, uniforms = probs_case(batch, k, vocab, device, seed=7)
    reference = _time(partial(chain_verify, q, p, ids, bonus, uniforms), device, iters)
    triton_s = _time(
        partial(kernels.chain_kernel_verify, q, p, ids, bonus, uniforms), device, iters
    )
    needed = 2 * batch * vocab * q.element_size()
    fi_text = f"{'-':>10} {'-':>9}"
    if flashinfer is not None:
        bonus_row = torch.softmax(torch.randn(batch, 1, vocab, device=device), -1)
        target = torch.cat([q, bonus_row], dim=1)
        ids32 = ids.to(torch.int32)
        args = (
            (p, ids32, uniforms.to(torch.float32), target) if takes_uniforms else (p, ids32, target)
        )
        try:
            fi_s = _time(partial(flashinfer, *args), device, iters)
            fi_text = f"{fi_s * 1e6:8.1f}us {fi_s / triton_s:9.2f}"
        except Exception as exc:
            fi_text = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
    return (
        f"  {batch:>5} {k:>2} {vocab:>6} | {reference * 1e6:7.1f}us {triton_s * 1e6:7.1f}us "
        f"{reference / triton_s:6.2f}x | {needed / triton_s / 1e9:11.1f} "
        f"{needed / reference / 1e9:10.1f} | {fi_text}"
    )


class LogitsCase:
    """A logits step at one shape: ``[batch * (k + 1), vocab]`` target logits (draft rows,
    then the bonus row, per request), ``[batch * k, vocab]`` draft probabilities, drafts."""

    def __init__(self, shape: tuple[int, int, int], device: torch.device) -> None:
        batch, k, vocab = shape
        self.shape = shape
        self.logits = torch.randn(batch * (k + 1), vocab, device=device)
        self.draft = torch.softmax(torch.randn(batch * k, vocab, device=device), -1)
        self.ids = torch.multinomial(self.draft, 1).view(-1)
        self.counts = [k] * batch
        self.layout = BatchLayout.build(self.counts, device)
        self.requests = Requests.build(batch, device, SamplingParams(temperature=TEMPERATURE))

    def verify(self, backend: str, *, built: bool = False) -> Callable[[], Any]:
        """One call of :func:`specsample.verify` on ``backend``: its parameters given as a
        user gives them (a list of counts, a temperature), or ``built`` once (the layout and
        the requests: nothing copied from the host, so a CUDA graph can hold the call)."""
        if built:
            return partial(verify, self.logits, self.ids, self.layout, requests=self.requests,
                           draft_probs=self.draft, backend=backend)  # fmt: skip
        return partial(verify, self.logits, self.ids, self.counts, temperature=TEMPERATURE,
                       draft_probs=self.draft, backend=backend)  # fmt: skip


def _logits_timing(device: torch.device, shape: tuple[int, int, int], iters: int) -> str:
    batch, k, vocab = shape
    case = LogitsCase(shape, device)
    torch_s = _time(case.verify("torch"), device, iters)
    kernel_s = _time(case.verify("triton"), device, iters)
    return (
        f"  {batch:>5} {k:>2} {vocab:>6} | {torch_s * 1e6:7.1f}us {kernel_s * 1e6:7.1f}us "
        f"{torch_s / kernel_s:6.2f}x"
    )


def vllm_sampler(case: LogitsCase) -> Callable[[], Any] | str:
    """One call of vLLM's own rejection sampler on ``case`` (its sampler draws the bonus
    tokens from the bonus rows), or why it cannot run here."""
    try:
        importlib.import_module("vllm.v1.sample.rejection_sampler")
        from vllm.v1.sample.sampler import Sampler

        from specsample.integrations.vllm.sampler import VllmRejectionSampler
        from specsample.integrations.vllm.testing import sampling_metadata, spec_metadata
    except Exception as exc:
        return f"skipped: vllm not importable ({type(exc).__name__}: {str(exc)[:80]})"
    if case.logits.device.type != "cuda":
        return "skipped: vLLM's sampler is timed on a CUDA device only"
    batch, k, vocab = case.shape
    device = case.logits.device
    drafts = case.ids.view(batch, k).tolist()
    metadata = spec_metadata(drafts, device)
    meta = sampling_metadata([TEMPERATURE] * batch, vocab=vocab, device=device)
    sampler = VllmRejectionSampler(Sampler(), None, device)
    return partial(sampler, metadata, case.draft, case.logits, meta)


def graph_time(run: Callable[[], Any], device: torch.device, iters: int) -> float | str:
    """Seconds per call of ``run`` replayed from a CUDA graph of :data:`GRAPH_CALLS` calls
    (median of three rounds of about ``iters`` calls), or why it was not timed.

    The warm-up calls before the capture (:func:`capture`) compile what needs compiling.

    Examples
    --------
    >>> graph_time(lambda: None, torch.device("cpu"), 1)
    'CUDA only'
    """
    if device.type != "cuda":
        return "CUDA only"
    graph = capture(run, device, GRAPH_CALLS)
    if isinstance(graph, str):
        return graph
    return _time(graph.replay, device, max(1, iters // GRAPH_CALLS)) / GRAPH_CALLS


def capture(run: Callable[[], Any], device: torch.device, calls: int) -> Any:
    """A :class:`torch.cuda.CUDAGraph` of ``calls`` calls of ``run`` (after three warm-up
    calls on a side stream, as capturing requires), or why it could not be captured."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                run()
    except Exception as exc:
        torch.cuda.synchronize(device)
        return f"not captured: {type(exc).__name__}: {str(exc).splitlines()[0][:40]}"
    return graph


def _cells(needed: int, seconds: float | str, peak: float | None) -> str:
    """Time, GB/s and share of the peak of one timing (or why there is none)."""
    if isinstance(seconds, str):
        return seconds
    rate = needed / seconds
    share = f"{rate / peak:8.1%}" if peak else f"{'-':>8}"
    return f"{seconds * 1e6:9.1f}us {rate / 1e9:9.1f} {share}"


def _row(label: str, needed: int, eager: float, graph: float | str, peak: float | None) -> str:
    """One line of the bandwidth table: the eager timing, then the graph's."""
    return f"    {label:<30} {_cells(needed, eager, peak)} | {_cells(needed, graph, peak)}"


def _timed_row(
    label: str, needed: int, run: Callable[[], Any], iters: int, device: torch.device,
    peak: float | None,
) -> str:  # fmt: skip
    """The bandwidth line of a path: ``run`` timed eagerly, then replayed from a graph."""
    seconds = _time(run, device, iters)
    return _row(label, needed, seconds, graph_time(run, device, iters), peak)


def _bandwidth_rows(
    device: torch.device, shape: tuple[int, int, int], iters: int, peak: float | None
) -> list[str]:
    """The bandwidth lines of one shape: probabilities, logits, row statistics."""
    batch, k, vocab = shape
    row_bytes = vocab * 4
    lines = [f"  ({batch}, {k}, {vocab})"]
    q, p, ids, bonus, _ = probs_case(batch, k, vocab, device, seed=11)
    probs_bytes = 2 * batch * row_bytes
    timed = partial(_timed_row, iters=iters, device=device, peak=peak)
    for backend in ("torch", "triton"):
        run = partial(RejectionSampler(backend=backend), q, bonus, p, ids)
        lines.append(timed(f"probabilities, {backend}", probs_bytes, run))
    del q, p
    case = LogitsCase(shape, device)
    logits_bytes = (batch * (k + 1) + 2 * batch) * row_bytes
    for backend in ("torch", "triton"):
        lines.append(timed(f"logits, {backend}", logits_bytes, case.verify(backend, built=True)))
    rows = case.logits.shape[0]
    for filters, options in (("", {}), (" top-k/p", FILTERS)):
        sampling = SamplingMetadata.build(rows, device, temperature=TEMPERATURE, **options)
        for name, norms in (("torch", eager.row_norms), ("triton", triton_backend.row_norms)):
            run = partial(norms, case.logits, sampling)
            lines.append(timed(f"row statistics{filters}, {name}", rows * row_bytes, run))
    vllm = vllm_sampler(case)
    if isinstance(vllm, str):
        lines.append(f"    logits, vLLM: {vllm}")
    else:
        try:
            lines.append(timed("logits, vLLM", logits_bytes, vllm))
        except Exception as exc:
            lines.append(f"    logits, vLLM: failed: {type(exc).__name__}: {str(exc)[:80]}")
    return lines


def check_bandwidth(device: torch.device, shapes: list[tuple[int, int, int]], iters: int) -> None:
    """Print the effective-bandwidth table (see the module docstring)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    peak = peak_bandwidth(name)
    known = f"peak {peak / 1e12:.2f} TB/s" if peak else "peak unknown: GB/s only"
    print(f"\n  effective bandwidth on {name} ({known}), float32, T={TEMPERATURE}")
    print("    bytes: probabilities 1 target + 1 draft row per sequence; logits every target")
    print("    row + 1 target + 1 draft row per sequence; row statistics every target row")
    print(f"    eager: back-to-back calls; graph: {GRAPH_CALLS} calls replayed from a CUDA graph")
    rate = f"{'GB/s':>9} {'of peak':>8}"
    print(f"    {'path':<30} {'eager':>11} {rate} | {'graph':>11} {rate}")
    for shape in shapes:
        for line in _bandwidth_rows(device, shape, iters, peak):
            print(line, flush=True)


def check_timings(
    device: torch.device,
    shapes: list[tuple[int, int, int]],
    iters: int,
    bandwidth_shapes: list[tuple[int, int, int]],
) -> None:
    """Print the three timing tables (see the module docstring)."""
    print(f"\n== 4. timings on {device} (median of 3 x {iters} calls, float32) ==")
    flashinfer = _flashinfer(device)
    takes_uniforms = False
    if flashinfer is None:
        print("  flashinfer not importable: its columns are left out")
    else:
        takes_uniforms = "uniform_samples" in inspect.signature(flashinfer).parameters
    print("  chain rule on probabilities; GB/s against one target and one draft row per sequence")
    print(
        f"  {'batch':>5} {'k':>2} {'vocab':>6} | {'pytorch':>9} {'triton':>9} {'speedup':>7} "
        f"| {'triton GB/s':>11} {'torch GB/s':>10} | {'flashinfer':>10} {'fi/triton':>9}"
    )
    for shape in shapes:
        print(_probs_timing(device, shape, iters, flashinfer, takes_uniforms), flush=True)
    print(
        "\n  logits path end to end (row statistics included), draft probabilities, "
        f"T={TEMPERATURE}"
    )
    print(f"  {'batch':>5} {'k':>2} {'vocab':>6} | {'verify':>9} {'kernels':>9} {'speedup':>7}")
    for shape in shapes:
        print(_logits_timing(device, shape, iters), flush=True)
    check_bandwidth(device, bandwidth_shapes, iters)
