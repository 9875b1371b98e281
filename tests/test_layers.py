"""The floors of the house (docs/architecture.md): no module imports one on a higher floor,
and a batch's target logits go from :func:`specsample.verify` down to the kernel without a
call that climbs back up, passing through each module once on every chain of calls.

The first test reads every module's imports (those inside functions too) from its source;
the second follows one tensor through a real call, recording each function that receives
it, or a step object that holds it, with the chain of calls that led there.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch

import specsample
from specsample import verify

PACKAGE = Path(specsample.__file__).parent

FLOORS = (
    ("foundation", ("methods", "random", "extras", "stats", "models")),
    ("parameter objects", ("params",)),
    ("processing", ("probs", "uniforms", "noise", "timing")),
    ("planned steps", ("plan",)),
    ("rules and kernels", ("rules", "kernels")),
    ("backend seam", ("backends",)),
    ("pipeline", ("pipeline",)),
    ("public API", ("api", "sampler", "")),
    ("beside the runtime", ("adapter", "testing", "bench")),
    ("generation loop and engines", ("generate", "integrations")),
    ("command line", ("cli", "__main__")),
)
"""Floors from the bottom up, each with the top-level names under ``specsample`` it holds
(``""``: the package itself)."""


def floor_of(module: str) -> int:
    """The floor index of a ``specsample`` module (0 the foundation)."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    for index, (_, names) in enumerate(FLOORS):
        if top in names:
            return index
    raise AssertionError(f"{module} is on no floor: add it to FLOORS and docs/architecture.md")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The ``specsample`` modules ``path`` imports (``from specsample import x`` counts as
    importing module ``specsample.x`` where there is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specsample")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("specsample"):
                continue
            inner = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= inner or {node.module}
    return found


def test_no_module_imports_one_on_a_higher_floor() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    climbs = []
    for path in paths:
        module = _module_name(path)
        for imported in _imports(path, modules):
            if floor_of(imported) > floor_of(module):
                up = FLOORS[floor_of(imported)][0]
                climbs.append(f"{module} ({FLOORS[floor_of(module)][0]}) imports {imported} ({up})")
    assert not climbs, "\n".join(climbs)


def _holds(value: Any, tensor: torch.Tensor) -> bool:
    """Whether ``value`` is ``tensor`` or a named tuple with it as a field."""
    if value is tensor:
        return True
    return (
        isinstance(value, tuple) and hasattr(value, "_fields") and any(v is tensor for v in value)
    )


def _follow(tensor: torch.Tensor, call: Any) -> list[list[str]]:
    """Run ``call()`` and return, for every function that received ``tensor`` (or a step
    holding it), the chain of ``specsample`` modules of such functions that led to it."""
    chains: list[list[str]] = []
    stack: dict[int, list[str]] = {}

    def chain_of(frame: FrameType | None) -> list[str] | None:
        while frame is not None:
            if id(frame) in stack:
                return stack[id(frame)]
            frame = frame.f_back
        return None

    def forget(frame: FrameType, event: str, arg: object) -> Any:
        if event == "return":  # a frame's id may be reused once it is gone
            stack.pop(id(frame), None)
        return forget

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("specsample"):
            return None
        if not any(_holds(v, tensor) for v in frame.f_locals.values()):
            return None
        chain = [*(chain_of(frame.f_back) or []), module]
        stack[id(frame)] = chain
        chains.append(chain)
        return forget

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return chains


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "greedy"])
def test_target_logits_go_down_from_verify_to_the_kernel(backend: str, sampled: bool) -> None:
    torch.manual_seed(0)
    batch, k, vocab = 3, 2, 64
    logits = torch.randn(batch * (k + 1), vocab)
    drafts = torch.randint(0, vocab, (batch * k,))
    options: dict[str, Any] = {"temperature": 0.7 if sampled else 0.0}
    if sampled:
        options.update(seeds=[1, 2, 3], positions=[5, 6, 7])

    def call() -> Any:
        return verify(logits, drafts, [k] * batch, backend=backend, **options)

    call()  # anything loaded or compiled once is not part of the path
    chains = _follow(logits, call)
    assert chains and chains[0] == ["specsample.api.chain"]
    reached = {module for chain in chains for module in chain}
    assert (
        "specsample.pipeline" in reached
        and f"specsample.backends.{backend if backend == 'cpu' else 'eager'}" in reached
    )
    for chain in chains:
        floors = [floor_of(m) for m in chain]
        assert floors == sorted(floors, reverse=True), f"a call climbs up: {' -> '.join(chain)}"
        runs = [m for i, m in enumerate(chain) if i == 0 or chain[i - 1] != m]
        assert len(runs) == len(set(runs)), f"a module is entered twice: {' -> '.join(chain)}"
