"""The vLLM integration's switches (:mod:`specsample.integrations.vllm.settings`) and its
boundary: the core never imports an integration. Needs no vLLM (its contract tests, in
``tests/vllm_integration/``, run in ``make test-vllm``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specsample
from specsample.integrations.vllm.settings import Settings


def test_disabled_by_default_with_chain_and_auto() -> None:
    assert Settings.from_env({}) == Settings(enabled=False, method="chain", backend="auto")


@pytest.mark.parametrize("value", ["1", "true", "ON", " yes "])
def test_enabled_by_any_yes(value: str) -> None:
    assert Settings.from_env({"SPECSAMPLE_VLLM": value}).enabled


@pytest.mark.parametrize("value", ["", "0", "false", "Off", "no"])
def test_disabled_by_any_no(value: str) -> None:
    assert not Settings.from_env({"SPECSAMPLE_VLLM": value}).enabled


def test_method_and_backend_are_read() -> None:
    settings = Settings.from_env(
        {"SPECSAMPLE_VLLM_METHOD": "Block", "SPECSAMPLE_VLLM_BACKEND": "torch"}
    )
    assert (settings.method, settings.backend) == ("block", "torch")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SPECSAMPLE_VLLM", "maybe"),
        ("SPECSAMPLE_VLLM_METHOD", "tree"),
        ("SPECSAMPLE_VLLM_METHOD", "typical"),
        ("SPECSAMPLE_VLLM_BACKEND", "cuda"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        Settings.from_env({name: value})


def test_core_never_imports_an_integration() -> None:
    root = Path(specsample.__file__).parent
    for path in root.rglob("*.py"):
        if "integrations" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n.startswith("specsample.integrations") for n in names), path
