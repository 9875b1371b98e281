"""Host time of a verification step on the Triton backend: what the host spends per call.

Usage::

    python benchmarks/host_time.py --batch 4 --k 4 --vocab 4096

On a GPU a step costs the larger of two times: the device's (its kernels) and the host's
(checking the arguments, building what the kernels read, launching them). Where the host's
is the larger, back-to-back calls are host-bound and no kernel work shows. The host's part
needs no GPU to measure: the script runs the Triton backend's code on CPU tensors with every
kernel launch replaced by a no-op (it sets ``TRITON_INTERPRET=1`` for its own process, so the
backend accepts CPU tensors; no kernel runs, so the outputs are left unset), and prints the
median host time per call over ``--rounds`` rounds of ``--calls`` calls, for

* :func:`specsample.verify` given its parameters as a user gives them (a list of counts, a
  temperature): the layout and the requests are built at every call;
* the same with :class:`specsample.params.layout.BatchLayout` and
  :class:`specsample.params.Requests` built once, as an engine that reuses them;
* the same with top-k 50 and top-p 0.9 (the filter kernel's launch besides);
* :func:`specsample.kernels.triton.chain_kernel_verify` on probabilities,

each with its ratio to the first. Its device work beside the kernels is counted by
``tests/test_kernels_norms.py``. The figures depend on the CPU: the script prints its model
and vector extensions.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from vllm_e2e import cpu_description


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="requests per step")
    parser.add_argument("--k", type=int, default=4, help="drafts per request")
    parser.add_argument("--vocab", type=int, default=4096, help="tokens per row")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the median is shown)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("triton") is None:
        print("skipped: host_time.py: triton is not installed: pip install 'specsample[triton]'")
        return 0
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from specsample import verify
    from specsample.kernels import triton as kernels
    from specsample.kernels.triton import launch
    from specsample.params import Requests, SamplingParams
    from specsample.params.layout import BatchLayout

    if not launch.interpreting():
        parser.error("needs Triton's interpreter: run with TRITON_INTERPRET=1")
    torch.set_num_threads(1)
    launch._LOADED = _NoLaunches()
    batch, k, vocab = args.batch, args.k, args.vocab
    logits = torch.randn(batch * (k + 1), vocab)
    draft = torch.softmax(torch.randn(batch * k, vocab), -1)
    ids = torch.multinomial(draft, 1).view(-1)
    counts = [k] * batch
    layout = BatchLayout.build(counts, logits.device)
    step = partial(verify, logits, ids, draft_probs=draft, backend="triton")
    params = {"top_k": 50, "top_p": 0.9}
    filtered = Requests.build(batch, logits.device, SamplingParams(temperature=0.8, **params))
    q, p = draft.view(batch, k, vocab), draft.view(batch, k, vocab).flip(-1)
    bonus = torch.zeros(batch, 1, dtype=torch.int64)
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64)
    paths: list[tuple[str, Callable[[], Any]]] = [
        ("verify, counts and temperature given", partial(step, counts, temperature=0.8)),
        (
            "verify, layout and requests built once",
            partial(step, layout, requests=Requests.build(batch, logits.device)),
        ),
        ("verify, built once, top-k 50 top-p 0.9", partial(step, layout, requests=filtered)),
        (
            "chain_kernel_verify, probabilities",
            partial(kernels.chain_kernel_verify, q, p, ids.view(batch, k), bonus, uniforms),
        ),
    ]
    print(f"host time per call, kernel launches replaced by no-ops: {cpu_description()}")
    print(f"batch {batch}, k {k}, vocab {vocab}, one thread; median of {args.rounds} rounds")
    print("| path | host us per call | ratio |\n|---|---|---|")
    first = None
    for label, run in paths:
        seconds = _host_seconds(run, args.calls, args.rounds)
        first = first or seconds
        print(f"| {label} | {seconds * 1e6:.1f} | {seconds / first:.2f} |")
    return 0


class _NoLaunches(dict[Any, Any]):
    """In place of the loaded kernels: every kernel's launch does nothing."""

    def get(self, key: Any, default: Any = None) -> Any:
        return _NoKernel()


class _NoKernel:
    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def _host_seconds(run: Callable[[], Any], calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean seconds per call of ``calls`` calls (after 20)."""
    from specsample.timing import per_call

    for _ in range(20):
        run()
    return statistics.median(per_call(run, calls=calls) for _ in range(rounds))


if __name__ == "__main__":
    sys.exit(main())
