"""What ``pyproject.toml`` declares: the build requirement, the tested torch range, and the
files a wheel ships (``py.typed`` among them).

The wheel itself is built only where the installed setuptools is the declared lowest one
(``python -m pip install setuptools==<bound> wheel`` in a virtual environment, then this
file): that is the version the bound promises to work with.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
TESTED_TORCH = ("2.13.0", "2.14.1")
"""The torch releases the test suite has run on (CI installs the first)."""


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text()))


def _setuptools_bound() -> Version:
    """The lowest setuptools the build requirement allows."""
    (requirement,) = (
        Requirement(text)
        for text in _pyproject()["build-system"]["requires"]
        if Requirement(text).name == "setuptools"
    )
    (lower,) = (spec for spec in requirement.specifier if spec.operator == ">=")
    return Version(lower.version)


def test_the_build_requirement_allows_the_string_license() -> None:
    """``project.license = "Apache-2.0"`` (an SPDX expression) needs setuptools >= 77."""
    assert _setuptools_bound() >= Version("77")
    assert _pyproject()["project"]["license"] == "Apache-2.0"


def test_torch_is_bounded_to_the_tested_releases() -> None:
    dependencies = [Requirement(text) for text in _pyproject()["project"]["dependencies"]]
    (torch,) = (r for r in dependencies if r.name == "torch")
    assert all(torch.specifier.contains(version) for version in TESTED_TORCH)
    assert not torch.specifier.contains("2.12.0") and not torch.specifier.contains("2.15.0")


def test_py_typed_is_package_data() -> None:
    assert (ROOT / "specsample" / "py.typed").is_file()
    package_data = _pyproject()["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["specsample"]


def test_the_lowest_setuptools_builds_a_wheel_with_py_typed(tmp_path: Path) -> None:
    import setuptools

    bound = _setuptools_bound()
    if Version(setuptools.__version__) != bound:
        pytest.skip(f"setuptools {setuptools.__version__} is installed, not the bound {bound}")
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"),
    )
    command = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps"]
    subprocess.run([*command, "-w", str(tmp_path), str(source)], check=True)
    (wheel,) = tmp_path.glob("specsample-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert "specsample/py.typed" in names
    assert b"License-Expression: Apache-2.0" in metadata


OPTIONAL_MODULES = (
    "numba", "llvmlite", "transformers", "safetensors", "tokenizers", "tqdm", "gguf",
    "accelerate", "matplotlib", "pytest", "hypothesis", "scipy", "triton", "vllm",
)  # fmt: skip
"""What the extras install: a plain ``pip install specsample`` has none of them."""

WITHOUT_EXTRAS = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed: import fails, find_spec gives None
import torch
import specsample
from specsample.cli import main
sys.exit(main(["--version"]))
"""


def test_a_plain_install_imports_and_runs_without_the_extras() -> None:
    """With the core dependencies alone (every extra's modules made unimportable), the
    package imports and ``specsample --version`` runs: numpy, which the core imports, is a
    core dependency."""
    core = {Requirement(text).name for text in _pyproject()["project"]["dependencies"]}
    assert "numpy" in core
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, ",".join(OPTIONAL_MODULES)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("specsample ")


def test_numba_is_bounded_to_the_tested_releases() -> None:
    """The kernels use numba's internals (its cache and intrinsics): the ``cpu`` extra
    admits the releases tested, from the one vLLM's CPU build pins (0.65) to the one CI
    installs."""
    (requirement,) = [
        Requirement(text)
        for text in _pyproject()["project"]["optional-dependencies"]["cpu"]
        if Requirement(text).name == "numba"
    ]
    assert requirement.specifier.contains("0.65.0") and requirement.specifier.contains("0.68.1")
    assert not requirement.specifier.contains("0.69.0")
    assert not requirement.specifier.contains("0.64.0")
