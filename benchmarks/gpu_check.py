"""GPU check of the Triton kernels: exactness, parity, no host synchronisation, timings.

Run through ``benchmarks/gpu_check.sh`` (see ``docs/gpu.md``); this is its CUDA part:

1. **exactness** on the GPU, through :func:`specsample.testing.exactness_report` with
   reduced sizes: the PyTorch path (:class:`specsample.RejectionSampler`, both rules) and the
   Triton path (:func:`specsample.kernels.triton.chain_kernel_verify`,
   :func:`specsample.kernels.triton.block_kernel_verify`) on several toy families, and the logits
   path (:func:`specsample.verify` and the kernels'
   :func:`specsample.kernels.triton.verify_logits`);
2. **parity** of the two paths on shared uniforms at large vocabularies (float32 and
   bfloat16 probabilities, and logits with a mixed greedy/sampled ragged batch): rows that
   differ must be floating-point ties (a uniform moved by at most 1e-6 reproduces them);
3. **no host synchronisation**: forward passes under
   ``torch.cuda.set_sync_debug_mode("error")`` (the ``RejectionSampler`` module with its own
   rules and with the kernel rules swapped in, :func:`specsample.verify`, the kernels'
   logits path, with a filter and with a temperature alone, whose row statistics the
   statistics kernel computes); and the kernels' logits path captured in a CUDA graph,
   whose replay must give the tokens of an eager call on the same uniforms;
4. **timings** (``benchmarks/gpu_timings.py``) at the benchmark shapes ``(batch, k,
   vocab)``: the PyTorch chain rule, the Triton chain rule and, when ``flashinfer`` is
   importable, FlashInfer's ``chain_speculative_sampling``, with time ratios and the
   bandwidth achieved against the bytes that must be read (one target row and one draft row
   per sequence); the logits path end to end; then the **effective bandwidth** of the
   probabilities path, the logits path and the row statistics at 64x4x128256 and
   16x5x151936, in GB/s and as a fraction of the device's peak, PyTorch against Triton in
   the same run, and vLLM's own rejection sampler on the logits path where
   ``vllm.v1.sample.rejection_sampler`` is importable.

``--smoke`` runs every part that does not need CUDA on the CPU under Triton's interpreter
(it sets ``TRITON_INTERPRET=1`` unless the variable is set) with tiny sizes, to check this
script itself. Exit status: 0 when every check passed, 1 otherwise; without a CUDA device or
without triton (``--smoke``: without triton) the script prints one ``skipped: ...`` line and
exits with 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from gpu_timings import BANDWIDTH_SHAPES, capture, check_timings, probs_case

from specsample import RejectionSampler, verify
from specsample.kernels import triton as kernels
from specsample.params import Requests, SamplingParams
from specsample.params.layout import BatchLayout
from specsample.probs import processed_probs
from specsample.rules.block import block_verify
from specsample.rules.chain import chain_verify
from specsample.testing import Family, exactness_report, make_family
from specsample.timing import Stopwatch

SHAPES = [
    (1, 4, 32000),
    (8, 4, 32000),
    (64, 4, 128256),
    (16, 5, 151936),
    (128, 8, 32000),
    (256, 4, 128256),
]
SMOKE_SHAPES = [(2, 2, 1100), (3, 3, 2100)]
FAMILIES = ("random", "sparse", "onehot_target", "markov")
ALPHA = 1e-4
NUDGES = (1e-12, -1e-12, 1e-9, -1e-9, 1e-6, -1e-6)

FAILURES: list[str] = []


def report(ok: bool, line: str) -> None:
    """Print one check's line, remembering failures."""
    print(f"  [{'PASS' if ok else 'FAIL'}] {line}", flush=True)
    if not ok:
        FAILURES.append(line)


# --------------------------------------------------------------------------------------
# The kernels' logits path with the front end of specsample.verify
# --------------------------------------------------------------------------------------


def kernel_verify(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    *,
    uniforms: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    method: str = "chain",
    **params: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``specsample.verify`` on the Triton backend.

    Returns ``token_ids [batch, max_drafts + 1]`` and ``num_emitted [batch]``.
    """
    out = verify(
        target_logits,
        draft_token_ids,
        num_draft_tokens,
        uniforms=uniforms,
        draft_probs=draft_probs,
        draft_logits=draft_logits,
        method=method,
        backend="triton",
        **params,
    )
    return out.token_ids, out.num_emitted


def _torch_verifier(rule: str) -> Callable[..., torch.Tensor]:
    return RejectionSampler(method=rule)


def _kernel_verifier(rule: str) -> Callable[..., torch.Tensor]:
    kernel_rule = kernels.RULES[rule]

    def verifier(
        target: torch.Tensor, bonus: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        uniforms = torch.rand(
            ids.shape[0], ids.shape[1] + 1, dtype=torch.float64, device=ids.device
        )
        return kernel_rule(target, draft, ids, bonus, uniforms).token_ids

    return verifier


def _logits_verifier(logits: torch.Tensor, path: str, params: dict[str, Any]) -> Callable[..., Any]:
    """A logits-path verifier with the harness's signature (draft rows passed as probs)."""

    def verifier(
        target: torch.Tensor, bonus: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        del target, bonus
        rows, k = ids.shape
        context = torch.cat([torch.zeros_like(ids[:, :1]), ids], dim=1)
        positions = torch.arange(k + 1, device=ids.device).expand(rows, k + 1)
        raw = logits.to(ids.device)[positions, context].reshape(-1, logits.shape[-1])
        kwargs = {"draft_probs": draft.reshape(-1, draft.shape[-1]), **params}
        if path == "pytorch":
            return verify(raw, ids.reshape(-1), [k] * rows, **kwargs).token_ids
        return kernel_verify(raw, ids.reshape(-1), [k] * rows, **kwargs)[0]

    return verifier


# --------------------------------------------------------------------------------------
# 1. Exactness
# --------------------------------------------------------------------------------------


def check_exactness(device: torch.device, rows: int) -> None:
    print(f"\n== 1. exactness on {device} ({rows} rows, k=3, vocab 8, alpha={ALPHA:g}) ==")
    for path, make in (("pytorch", _torch_verifier), ("triton", _kernel_verifier)):
        for rule in ("chain", "block"):
            for name in FAMILIES:
                family = make_family(name, k=3, vocab=8, seed=FAMILIES.index(name) + 5)
                watch = Stopwatch()
                result = exactness_report(
                    make(rule), family, rows=rows, seed=11, device=device, rule=rule
                )
                p_min = min(position.p_value for position in result.positions)
                tv = result.detectable_tv(0, ALPHA) if result.positions[0].df else 0.0
                report(
                    result.passed(ALPHA),
                    f"{path:7} {rule:5} {name:13} min p={p_min:.3g} "
                    f"acceptance z={result.acceptance_z:+.2f} detectable TV={tv:.4f} "
                    f"({watch.elapsed():.1f} s)",
                )
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 8, 8, generator=gen) * 1.5
    noise = torch.randn(3, 8, 8, generator=gen)
    draft = torch.softmax(0.7 * logits[:3] + 0.8 * noise, dim=-1)
    params = {"temperature": 0.8, "top_k": 5}
    flat = logits.reshape(-1, 8)
    target = processed_probs(
        flat,
        torch.full((flat.shape[0],), 0.8),
        top_k=torch.full((flat.shape[0],), 5, dtype=torch.int64),
    )
    family = Family("logits", target.view(4, 8, 8), draft)
    for path in ("pytorch", "triton"):
        verifier = _logits_verifier(logits, path, params)
        result = exactness_report(verifier, family, rows=rows, seed=13, device=device)
        p_min = min(position.p_value for position in result.positions)
        report(result.passed(ALPHA), f"{path:7} logits (T=0.8, top-k 5) min p={p_min:.3g}")


# --------------------------------------------------------------------------------------
# 2. Parity on shared uniforms
# --------------------------------------------------------------------------------------


def _explained(
    reference: Callable[[torch.Tensor], torch.Tensor],
    uniforms: torch.Tensor,
    row: int,
    wanted: torch.Tensor,
) -> bool:
    for col in range(uniforms.shape[1]):
        for nudge in NUDGES:
            moved = uniforms.clone()
            moved[row, col] = min(max(float(moved[row, col]) + nudge, 0.0), 1.0 - 2.0**-53)
            if torch.equal(reference(moved)[row], wanted):
                return True
    return False


def _compare(
    label: str,
    reference: Callable[[torch.Tensor], torch.Tensor],
    kernel: torch.Tensor,
    uniforms: torch.Tensor,
) -> None:
    expected = reference(uniforms)
    differ = [int(r) for r in (expected != kernel).any(dim=1).nonzero().flatten()]
    explained = sum(_explained(reference, uniforms, r, kernel[r]) for r in differ)
    rows = kernel.shape[0]
    ok = explained == len(differ) and len(differ) <= 1e-3 * rows
    report(ok, f"{label}: {rows - len(differ)}/{rows} rows equal, {explained} ties explained")


def check_parity(device: torch.device, shapes: list[tuple[int, int, int]]) -> None:
    print(f"\n== 2. parity of the PyTorch and Triton paths on shared uniforms ({device}) ==")
    for batch, k, vocab in shapes:
        q, p, ids, bonus, uniforms = probs_case(4 * batch, k, vocab, device, seed=vocab + k)
        for dtype in (torch.float32, torch.bfloat16):
            qd, pd = q.to(dtype), p.to(dtype)
            for rule, reference_rule in (("chain", chain_verify), ("block", block_verify)):
                kernel = kernels.RULES[rule](qd, pd, ids, bonus, uniforms).token_ids

                def reference(
                    u: torch.Tensor, rule=reference_rule, qd=qd, pd=pd, ids=ids, bonus=bonus
                ) -> Any:
                    return rule(qd, pd, ids, bonus, u).token_ids

                label = f"{rule:5} {dtype!s:14} ({4 * batch}, {k}, {vocab})"
                _compare(label, reference, kernel, uniforms)
    _logits_parity(device, shapes[len(shapes) // 2])


def _logits_parity(device: torch.device, shape: tuple[int, int, int]) -> None:
    """Parity of the logits path on a mixed greedy/sampled ragged batch, with filters (row
    statistics by PyTorch) and with temperatures alone (by the statistics kernel)."""
    batch, k, vocab = shape
    gen = torch.Generator(device=device).manual_seed(5)
    counts = [(i % (k + 1)) for i in range(4 * batch)]
    total = sum(counts)
    logits = torch.randn(total + len(counts), vocab, device=device, generator=gen) * 3
    draft_logits = torch.randn(total, vocab, device=device, generator=gen) * 3
    ids = torch.multinomial(torch.softmax(draft_logits, -1), 1, generator=gen).view(-1)
    temperature = [0.0 if i % 3 == 0 else 0.7 for i in range(len(counts))]
    filtered = {
        "temperature": temperature,
        "top_k": [0 if i % 2 else 50 for i in range(len(counts))],
        "top_p": 0.95,
    }
    uniforms = torch.rand(len(counts), k + 1, dtype=torch.float64, device=device, generator=gen)
    for label, params in (("filtered", filtered), ("temperature", {"temperature": temperature})):
        for method in ("chain", "block"):
            kernel, _ = kernel_verify(
                logits,
                ids,
                counts,
                uniforms=uniforms,
                draft_logits=draft_logits,
                method=method,
                **params,
            )

            def reference(
                u: torch.Tensor, method: str = method, params: dict[str, Any] = params
            ) -> torch.Tensor:
                return verify(
                    logits,
                    ids,
                    counts,
                    draft_logits=draft_logits,
                    method=method,
                    uniforms=u,
                    backend="torch",
                    **params,
                ).token_ids

            name = f"logits {method:5} {label:11} mixed greedy/sampled, ragged"
            _compare(name, reference, kernel, uniforms)


# --------------------------------------------------------------------------------------
# 3. No host synchronisation
# --------------------------------------------------------------------------------------


def _sync_cases(device: torch.device) -> list[tuple[str, Callable[[], Any]]]:
    """The forward passes that must not synchronise, each with its label."""
    batch, k, vocab = 16, 4, 32000
    q, p, ids, bonus, _ = probs_case(batch, k, vocab, device, seed=1)
    seeds = torch.arange(batch, device=device)
    counts = [k, 0, 2, k] * (batch // 4)
    total = sum(counts)
    logits = torch.randn(total + len(counts), vocab, device=device)
    draft_probs = torch.softmax(torch.randn(total, vocab, device=device), -1)
    flat_ids = torch.multinomial(draft_probs, 1).view(-1)
    temperature = [0.0, 0.8, 1.0, 0.5] * (batch // 4)
    filtered = {"temperature": temperature, "top_k": 40, "top_p": 0.9}
    logits_args = (logits, flat_ids, counts)
    cases: list[tuple[str, Callable[[], Any]]] = []
    for rule in ("chain", "block"):
        torch_module = RejectionSampler(method=rule, backend="torch")
        module = RejectionSampler(method=rule)
        triton_module = RejectionSampler(method=rule, backend="triton")
        cases += [
            (
                f"RejectionSampler({rule!r}), PyTorch backend",
                lambda m=torch_module: m(q, bonus, p, ids),
            ),
            (
                f"RejectionSampler({rule!r}), seeded",
                lambda m=module: m(q, bonus, p, ids, seeds=seeds, positions=seeds),
            ),
            (
                f"RejectionSampler({rule!r}), Triton backend",
                lambda m=triton_module: m(q, bonus, p, ids, seeds=seeds, positions=seeds),
            ),
            (
                f"specsample.verify method={rule!r}",
                lambda r=rule: verify(*logits_args, draft_probs=draft_probs, method=r, **filtered),
            ),
            (
                f"specsample.verify backend='triton' method={rule!r}",
                lambda r=rule: kernel_verify(
                    *logits_args, draft_probs=draft_probs, method=r, **filtered
                ),
            ),
            (
                f"specsample.verify backend='triton' method={rule!r}, row-statistics kernel",
                lambda r=rule: kernel_verify(
                    *logits_args, draft_probs=draft_probs, method=r, temperature=temperature
                ),
            ),
        ]
    return cases


def check_sync(device: torch.device) -> None:
    print("\n== 3. no host synchronisation (torch.cuda.set_sync_debug_mode('error')) ==")
    for label, run in _sync_cases(device):
        run()
        torch.cuda.synchronize(device)
        error = ""
        torch.cuda.set_sync_debug_mode("error")
        try:
            run()
        except RuntimeError as exc:
            error = str(exc).splitlines()[0]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize(device)
        report(not error, f"{label}{': ' + error if error else ''}")


def check_graph(device: torch.device) -> None:
    """The kernels' logits path captured in a CUDA graph: a replay gives the tokens of an
    eager call on the same uniforms (parameters and layout built once, before capturing)."""
    batch, k, vocab = 16, 4, 32000
    counts = [k, 0, 2, k] * (batch // 4)
    layout = BatchLayout.build(counts, device)
    logits = torch.randn(layout.target_rows, vocab, device=device)
    draft_probs = torch.softmax(torch.randn(layout.total_drafts, vocab, device=device), -1)
    ids = torch.multinomial(draft_probs, 1).view(-1)
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64, device=device)
    temperature = [0.0, 0.8, 1.0, 0.5] * (batch // 4)
    for label, params in (
        ("temperature", SamplingParams(temperature=temperature)),
        ("top-k/p", SamplingParams(temperature=temperature, top_k=40, top_p=0.9)),
    ):
        requests = Requests.build(batch, device, params)
        outputs: list[Any] = []

        def run(r: Requests = requests, out: list[Any] = outputs) -> None:
            out[:] = [verify(logits, ids, layout, draft_probs=draft_probs, requests=r,
                             uniforms=uniforms, backend="triton")]  # fmt: skip

        run()
        expected = outputs[0]
        graph = capture(run, device, 1)
        if isinstance(graph, str):
            report(False, f"specsample.verify backend='triton', {label}, CUDA graph: {graph}")
            continue
        outputs[0].token_ids.fill_(-2)
        graph.replay()
        same = torch.equal(outputs[0].token_ids, expected.token_ids) and torch.equal(
            outputs[0].num_accepted, expected.num_accepted
        )
        report(same, f"specsample.verify backend='triton', {label}: a CUDA graph replays it")


def _skipped(reason: str) -> int:
    """Print the one ``skipped`` line; return 0, a skipped run's status."""
    print(f"skipped: gpu_check.py: {reason}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the checks the options ask for; the exit status (0 also when skipped)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU interpreter")
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows per exactness report (default 200000, --smoke 3000)",
    )
    parser.add_argument(
        "--iters", type=int, default=20, help="timed calls per round (default 20, --smoke 1)"
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["exactness", "parity", "sync", "timings"],
        help="leave this part out (repeatable)",
    )
    args = parser.parse_args(argv)
    if importlib.util.find_spec("triton") is None:
        return _skipped("triton is not installed: pip install 'specsample[triton]'")
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device, shapes, rows, iters = torch.device("cpu"), SMOKE_SHAPES, args.rows or 3000, 1
        if not kernels.supports(torch.zeros(1)):
            parser.error("--smoke runs the kernels under Triton's interpreter: TRITON_INTERPRET=1")
    else:
        if not torch.cuda.is_available():
            return _skipped("no CUDA device is visible (--smoke checks this script on the CPU)")
        device, shapes = torch.device("cuda"), SHAPES
        rows, iters = args.rows or 200_000, args.iters
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    watch = Stopwatch()
    if "exactness" not in args.skip:
        check_exactness(device, rows)
    if "parity" not in args.skip:
        check_parity(device, shapes[:3] if not args.smoke else shapes)
    if "sync" not in args.skip:
        if device.type == "cuda":
            check_sync(device)
            check_graph(device)
        else:
            print("\n== 3. no host synchronisation: needs CUDA, skipped ==")
    if "timings" not in args.skip:
        check_timings(device, shapes, iters, shapes if args.smoke else BANDWIDTH_SHAPES)
    print(f"\n{len(FAILURES)} failed check(s) in {watch.elapsed():.0f} s")
    for line in FAILURES:
        print(f"  FAILED: {line}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
