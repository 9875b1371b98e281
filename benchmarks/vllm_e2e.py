"""vLLM served end to end, with and without the specsample plugin (needs vLLM; GPU or CPU).

Starts vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``,
bound to 127.0.0.1 on a free port) on the shipped default target (or ``--model``) with n-gram
and draft-model speculation, once with ``SPECSAMPLE_VLLM=0`` (vLLM's rejection sampler) and
once with ``SPECSAMPLE_VLLM=1`` (specsample's), each a fresh server process (the plugin is
read when the engine starts), the order alternating from round to round. Against each server
an OpenAI client streams completions of ``--max-tokens`` tokens (``ignore_eos``) from a fixed
list of code-like prompts, for every temperature (requests at temperature 1 are seeded) and
every concurrency (at most that many requests in flight), after a short warm-up.

For each method, temperature and concurrency, the report gives for both samplers:

* tok/s: the output tokens of the cell over its wall time, the median over rounds;
* TTFT: time to first token, the median over requests, in ms;
* ITL: inter-token latency, per request the time from its first token to its last over the
  tokens in between (a streamed chunk carries every token a step accepted), the median;
* tok/step: output tokens per engine step of a request, ``tokens / (tokens - accepted)``
  (a step gives one token and the drafts it accepted), with ``accepted`` the growth over the
  cell of the server's Prometheus counter ``vllm:spec_decode_num_accepted_tokens_total``;
* tok/draft: ``1 + accepted / drafts`` (vLLM's mean acceptance length), counting only the
  steps that drafted (``vllm:spec_decode_num_drafts_total``): n-gram drafts only on a match.

At temperature 0 both samplers must give the same tokens for every request. On a GPU the
model's dtype is used; on vLLM's CPU build float32, with ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB)
unless it is set. Nothing is downloaded (``HF_HUB_OFFLINE=1``).

Usage: python benchmarks/vllm_e2e.py [--model DIR] [--draft DIR] [--methods ngram,draft]
           [--rounds 1] [--concurrency 1,8,32] [--temperatures 0,1] [--requests N]
           [--max-tokens 64] [--k 4] [--json PATH]
Exit status: 0 every server ran and the outputs at temperature 0 are equal, or skipped (one
``skipped: ...`` line: vLLM cannot be imported or sees no device); 1 the outputs differ or a
server or request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from model_loading import skip

MODELS = Path(__file__).resolve().parents[1] / "specsample/models/default"
SERVED_NAME = "benchmarked"
METHODS = {"ngram": "n-gram", "draft": "draft model"}
SAMPLERS = {False: "vLLM's sampler", True: "specsample's sampler"}
PROMPTS = (
    "def parse(text):\n    for line in text.splitlines():\n        if line",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_config(path):\n    with open(path) as handle:\n        for line in handle:\n",
    "import os\n\n\ndef walk(root):\n    for name in os.listdir(root):\n        path =",
    "def count_words(text):\n    counts = {}\n    for word in text.split():\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n    else:\n",
    "def merge(left, right):\n    result = []\n    while left and right:\n        if",
)
"""The prompts, request ``i`` sending ``PROMPTS[i % 8]`` repeated ``1 + i % 3`` times."""
SPEC_COUNTERS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
}


@dataclass
class Request:
    """One streamed completion: its tokens and its latencies in seconds."""

    tokens: list[int]
    ttft: float
    itl: float | None
    """Seconds per token from the first token to the last; ``None`` for a single token."""


@dataclass
class Cell:
    """The requests of one temperature and concurrency against one server."""

    method: str
    plugin: bool
    round: int
    temperature: float
    concurrency: int
    seconds: float = 0.0
    requests: list[Request] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Output tokens per second of wall time."""
        return sum(len(r.tokens) for r in self.requests) / self.seconds


class Deadline:
    """An overall time limit: what is left of it, and a check."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; raises ``TimeoutError`` when none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("out of time (--deadline, or --startup-timeout for a server)")
        return left


def _prompt(index: int) -> str:
    return PROMPTS[index % len(PROMPTS)] * (1 + index % 3)


def _requests(args: argparse.Namespace, concurrency: int) -> int:
    return int(args.requests or max(32, 2 * concurrency))


# --- the machine -----------------------------------------------------------------------------


def cpu_description() -> str:
    """The CPU's model name and its vector extensions (AVX2, AVX-512, AMX), from /proc/cpuinfo."""
    info: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    flags = info.get("flags", "").split()
    vector = [f for f in flags if f == "avx2" or f.startswith(("avx512", "amx"))]
    return f"{info.get('model name', 'unknown CPU')}, {os.cpu_count()} CPUs, " + (
        " ".join(vector) or "no AVX2"
    )


def cpu_busy(seconds: float = 1.0) -> float | None:
    """The share of all CPUs busy over ``seconds`` (from /proc/stat), or ``None`` off Linux."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:]]
        return sum(values), values[3] + values[4]

    try:
        total, idle = sample()
        time.sleep(seconds)
        total2, idle2 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle2 - idle) / max(1, total2 - total)


def _machine(on_cpu: bool) -> dict[str, Any]:
    """The device, vLLM's version, the load average and the CPU share already busy."""
    import vllm
    from vllm.platforms import current_platform

    device = cpu_description() if on_cpu else current_platform.get_device_name()
    return {
        "device": device,
        "vllm": vllm.__version__,
        "load_before": os.getloadavg(),
        "busy_before": cpu_busy(),
        "plugin_env": {k: v for k, v in os.environ.items() if k.startswith("SPECSAMPLE_VLLM_")},
    }


# --- the server ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _server_command(args: argparse.Namespace, method: str, port: int) -> list[str]:
    """The command line of one server: the target, one speculation method, fixed limits."""
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 3}
    else:
        spec = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model]
    command += ["--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--dtype", args.dtype, "--enforce-eager", "--max-model-len", "1024", "--seed", "0"]
    # Whole prompts in one step: vLLM-CPU crashes on seeded requests whose prefill is chunked.
    command += ["--max-num-batched-tokens", "16384", "--max-num-seqs", "64"]
    command += ["--speculative-config", json.dumps(spec), "--disable-uvicorn-access-log"]
    if not args.on_cpu:
        command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    return command


def _server_env(plugin: bool, on_cpu: bool) -> dict[str, str]:
    env = {**os.environ, "SPECSAMPLE_VLLM": "1" if plugin else "0", "HF_HUB_OFFLINE": "1"}
    env.update(TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    if on_cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text: str = response.read().decode()
        return text


def _wait_ready(process: subprocess.Popen[bytes], base: str, deadline: Deadline) -> None:
    """Poll ``/health`` once a second until it answers; fail if the server exits first."""
    for _ in range(int(deadline.left()) + 1):
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        with contextlib.suppress(OSError):
            _get(f"{base}/health", timeout=2)
            return
        time.sleep(min(1.0, deadline.left()))
    raise TimeoutError("the server did not start in time")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT, then after 30 s SIGKILL; then kill whatever is left of its process group."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _tail(log: IO[bytes], lines: int = 40) -> str:
    log.flush()
    log.seek(0)
    return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def _serving(args: argparse.Namespace, method: str, plugin: bool) -> Iterator[str]:
    """A fresh server for ``method`` with the plugin on or off; yields its base URL.

    The server is always stopped on leaving; on failure its log's tail goes to stderr.
    """
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            _server_command(args, method, port),
            env=_server_env(plugin, args.on_cpu),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_ready(process, base, Deadline(args.startup_timeout))
            yield base
        except BaseException:
            print(f"-- server log ({SAMPLERS[plugin]}), last lines:", file=sys.stderr)
            print(_tail(log), file=sys.stderr, flush=True)
            raise
        finally:
            _stop(process)


def _counters(base: str) -> dict[str, float]:
    """The spec-decode counters of ``/metrics``, each summed over its labels."""
    totals = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for line in _get(f"{base}/metrics", timeout=10).splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        for key, metric in SPEC_COUNTERS.items():
            if name == metric:
                totals[key] += float(line.rsplit(" ", 1)[-1])
    return totals


# --- the client ------------------------------------------------------------------------------


async def _complete(
    client: Any, index: int, temperature: float, max_tokens: int, timeout: float
) -> Request:
    """Stream one completion; time its first token and the tokens after it."""
    extra: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True}
    if temperature > 0:
        extra["seed"] = index
    start = time.perf_counter()
    tokens: list[int] = []
    first = last = start

    async def stream() -> None:
        nonlocal first, last
        chunks = await client.completions.create(
            model=SERVED_NAME,
            prompt=_prompt(index),
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
            extra_body=extra,
        )
        async for chunk in chunks:
            for choice in chunk.choices:
                ids = (choice.model_extra or {}).get("token_ids") or []
                if ids and not tokens:
                    first = time.perf_counter()
                if ids:
                    last = time.perf_counter()
                tokens.extend(ids)

    try:
        await asyncio.wait_for(stream(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"request {index} took over {timeout:g} s (--request-timeout)") from None
    if not tokens:
        raise RuntimeError(f"request {index} returned no tokens")
    itl = (last - first) / (len(tokens) - 1) if len(tokens) > 1 else None
    return Request(tokens=tokens, ttft=first - start, itl=itl)


async def _run_cell(
    client: Any, base: str, cell: Cell, args: argparse.Namespace, deadline: Deadline
) -> None:
    """Send the cell's requests, at most ``cell.concurrency`` in flight; fill in ``cell``."""
    gate = asyncio.Semaphore(cell.concurrency)
    timeout = args.request_timeout

    async def one(index: int) -> Request:
        async with gate:
            return await _complete(client, index, cell.temperature, args.max_tokens, timeout)

    before = await asyncio.to_thread(_counters, base)
    start = time.perf_counter()
    jobs = [one(i) for i in range(_requests(args, cell.concurrency))]
    cell.requests = list(await asyncio.wait_for(asyncio.gather(*jobs), deadline.left()))
    cell.seconds = time.perf_counter() - start
    after = await asyncio.to_thread(_counters, base)
    cell.counters = {key: after[key] - before[key] for key in after}


async def _drive(
    base: str, cells: list[Cell], args: argparse.Namespace, deadline: Deadline
) -> None:
    """Warm the server up at every temperature, then run the cells in order."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    try:
        warm = min(4, max(args.concurrency))
        for temperature in args.temperatures:
            jobs = [_complete(client, i, temperature, 8, args.request_timeout) for i in range(warm)]
            await asyncio.wait_for(asyncio.gather(*jobs), deadline.left())
        for cell in cells:
            await _run_cell(client, base, cell, args, deadline)
    finally:
        await client.close()


def _serve_round(
    args: argparse.Namespace, method: str, plugin: bool, rnd: int, deadline: Deadline
) -> list[Cell]:
    """One fresh server: every temperature and concurrency; the cells it measured."""
    cells = [
        Cell(method, plugin, rnd, temperature, concurrency)
        for temperature in args.temperatures
        for concurrency in args.concurrency
    ]
    began = time.monotonic()
    with _serving(args, method, plugin) as base:
        asyncio.run(_drive(base, cells, args, deadline))
    took = time.monotonic() - began
    print(f"   round {rnd + 1}, {METHODS[method]}, {SAMPLERS[plugin]}: {took:.0f} s", flush=True)
    return cells


# --- the report ------------------------------------------------------------------------------


def _figures(cells: list[Cell]) -> dict[str, float]:
    """One sampler's cells over the rounds: median tok/s, TTFT and ITL (ms), tokens/step."""
    requests = [r for c in cells for r in c.requests]
    itls = [r.itl for r in requests if r.itl is not None]
    tokens = sum(len(r.tokens) for r in requests)
    accepted = sum(c.counters["accepted"] for c in cells)
    drafts = sum(c.counters["drafts"] for c in cells)
    return {
        "tok_s": statistics.median(c.throughput for c in cells),
        "ttft_ms": 1e3 * statistics.median(r.ttft for r in requests),
        "itl_ms": 1e3 * statistics.median(itls) if itls else math.nan,
        "tok_step": tokens / (tokens - accepted) if tokens > accepted else math.nan,
        "tok_draft": 1 + accepted / drafts if drafts else math.nan,
    }


def _summary(cells: list[Cell], method: str) -> list[dict[str, Any]]:
    """The table's rows for one method, one per temperature and concurrency."""
    rows = []
    keys = sorted({(c.temperature, c.concurrency) for c in cells if c.method == method})
    for temperature, concurrency in keys:
        row: dict[str, Any] = {"temperature": temperature, "concurrency": concurrency}
        for plugin, name in ((False, "vllm"), (True, "specsample")):
            chosen = [
                c
                for c in cells
                if (c.method, c.plugin, c.temperature, c.concurrency)
                == (method, plugin, temperature, concurrency)
            ]
            row[name] = _figures(chosen)
        rows.append(row)
    return rows


def _latencies(figures: dict[str, float]) -> str:
    """The columns after tok/s (and the ratio): TTFT, ITL, tok/step, tok/draft."""
    draft = figures["tok_draft"]
    draft_text = "-" if math.isnan(draft) else f"{draft:.2f}"
    return (
        f"{figures['ttft_ms']:7.1f} {figures['itl_ms']:6.2f} {figures['tok_step']:8.2f} "
        f"{draft_text:>9}"
    )


def _print_table(method: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """One method's table: both samplers side by side, a row per temperature and concurrency."""
    print(f"\n== {METHODS[method]} speculation, k={args.k}, {args.max_tokens} tokens per request")
    print(f"   {'':9} | {SAMPLERS[False]:<42} | {SAMPLERS[True]}")
    tail = f"{'TTFT ms':>7} {'ITL ms':>6} {'tok/step':>8} {'tok/draft':>9}"
    print(f"   {'T':>3} {'conc':>5} | {'tok/s':>8} {tail} | {'tok/s':>8} {'ratio':>6} {tail}")
    for row in rows:
        theirs, ours = row["vllm"], row["specsample"]
        ratio = f"{ours['tok_s'] / theirs['tok_s']:.2f}x"
        print(
            f"   {row['temperature']:>3g} {row['concurrency']:>5} | "
            f"{theirs['tok_s']:8.1f} {_latencies(theirs)} | "
            f"{ours['tok_s']:8.1f} {ratio:>6} {_latencies(ours)}"
        )


def _differences(cells: list[Cell], method: str) -> tuple[int, int]:
    """At temperature 0: requests whose tokens differ between the samplers, and requests."""
    greedy = {
        (c.round, c.concurrency, c.plugin): c.requests
        for c in cells
        if c.method == method and c.temperature == 0
    }
    differ = total = 0
    for (rnd, concurrency, plugin), ours in greedy.items():
        if plugin and (rnd, concurrency, False) in greedy:
            theirs = greedy[(rnd, concurrency, False)]
            differ += sum(a.tokens != b.tokens for a, b in zip(ours, theirs, strict=True))
            total += len(ours)
    return differ, total


def _report(cells: list[Cell], args: argparse.Namespace) -> tuple[bool, dict[str, Any]]:
    """Print each method's table and its temperature-0 comparison; whether all were equal."""
    equal = True
    summary: dict[str, Any] = {}
    for method in args.methods:
        rows = _summary(cells, method)
        _print_table(method, rows, args)
        differ, total = _differences(cells, method)
        equal &= differ == 0
        verdict = f"EQUAL ({total} requests)" if differ == 0 else "DIFFERENT"
        if differ:
            verdict += f" ({differ} of {total} requests differ)"
        if 0 in args.temperatures:
            print(f"   outputs at temperature 0: {verdict}")
        summary[method] = {"rows": rows, "differ": differ, "compared": total}
    return equal, summary


def _numbers(kind: type[float] | type[int], text: str) -> list[Any]:
    return [kind(part) for part in text.split(",") if part.strip()]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The options (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--model", default=str(MODELS / "target"), help="target model (default: shipped)")
    add("--draft", default=str(MODELS / "draft"), help="draft model (default: the shipped one)")
    add("--methods", default="ngram,draft", help="ngram and/or draft (default: both)")
    add("--rounds", type=int, default=1, help="servers per set-up, alternated (default 1)")
    add("--concurrency", default="1,8,32", help="requests in flight (default 1,8,32)")
    add("--temperatures", default="0,1", help="sampling temperatures (default 0,1)")
    add("--requests", type=int, default=0, help="per cell (default max(32, 2 x concurrency))")
    add("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    add("--k", type=int, default=4, help="speculative tokens per step (default 4)")
    add("--dtype", default=None, help="vLLM's --dtype (default: float32 on CPU, else auto)")
    add("--gpu-memory-utilization", type=float, default=0.3, help="on a GPU (default 0.3)")
    add("--request-timeout", type=float, default=300.0, help="seconds per request (300)")
    add("--startup-timeout", type=float, default=600.0, help="seconds per server start (600)")
    add("--deadline", type=float, default=4 * 3600.0, help="seconds in all (default 4 h)")
    add("--json", type=Path, default=None, help="write every figure measured to this file")
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not args.methods or set(args.methods) - set(METHODS):
        parser.error(f"--methods takes a comma-separated list of {', '.join(METHODS)}")
    args.concurrency = _numbers(int, args.concurrency)
    args.temperatures = _numbers(float, args.temperatures)
    if not args.concurrency or min(args.concurrency) < 1 or not args.temperatures:
        parser.error("--concurrency needs counts of at least 1, --temperatures a value")
    args.draft = str(Path(args.draft).resolve())
    return args


def _header(args: argparse.Namespace, machine: dict[str, Any]) -> None:
    busy = machine["busy_before"]
    load = ", ".join(f"{x:.2f}" for x in machine["load_before"])
    print(f"== vLLM {machine['vllm']} served on {machine['device']}", flush=True)
    busy_text = "" if busy is None else f"; all CPUs busy over 1 s before the start: {busy:.0%}"
    print(f"   load average before: {load}{busy_text}")
    print(f"   model {args.model}, dtype {args.dtype}, {args.rounds} round(s)")
    print(f"   concurrency {args.concurrency}, temperatures {args.temperatures}", end="")
    print(f", plugin settings {machine['plugin_env'] or 'default'}", flush=True)


def _run(args: argparse.Namespace) -> list[Cell]:
    """Every round, method and plugin setting, each a fresh server; all the cells measured."""
    deadline = Deadline(args.deadline)
    cells: list[Cell] = []
    for rnd in range(args.rounds):
        for method in args.methods:
            for plugin in (False, True) if rnd % 2 == 0 else (True, False):
                cells += _serve_round(args, method, plugin, rnd, deadline)
    return cells


def main(argv: list[str] | None = None) -> int:
    """Parse the options, serve every set-up, report; the exit status (see the docstring)."""
    args = _parse(argv)
    try:
        from vllm.platforms import current_platform
    except ImportError as error:
        return skip(f"vLLM cannot be imported ({error}): pip install 'specsample[vllm]'")
    if not current_platform.device_type:
        return skip("vLLM finds no device it can run on (no GPU, and not its CPU build)")
    args.on_cpu = current_platform.is_cpu()
    args.dtype = args.dtype or ("float32" if args.on_cpu else "auto")
    machine = _machine(args.on_cpu)
    _header(args, machine)
    try:
        cells = _run(args)
    except Exception as error:  # a server or a request failed: exit status 1
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    equal, summary = _report(cells, args)
    machine["load_after"] = os.getloadavg()
    print(f"\n   load average after: {', '.join(f'{x:.2f}' for x in machine['load_after'])}")
    if args.json:
        raw: dict[str, Any] = {"machine": machine, "options": vars(args), "summary": summary}
        raw["cells"] = [asdict(cell) for cell in cells]
        args.json.write_text(json.dumps(raw, indent=1, default=str))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
