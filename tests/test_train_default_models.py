"""The command line of ``scripts/train_default_models.py``: where it may write.

The script trains for tens of minutes, so only its argument checks run here: ``--out`` is
required, and a directory inside the ``specsample`` package (where the shipped pair lives)
is refused unless ``--overwrite-shipped`` is given.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "train_default_models.py"


@pytest.fixture(scope="module")
def script() -> Iterator[ModuleType]:
    """The script as a module (registered while loading: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location("train_default_models", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _refused(script: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_out_is_required(script: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert "the following arguments are required: --out" in _refused(script, [], capsys)


def test_the_shipped_models_are_refused_without_the_flag(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = script.SHIPPED_OUT
    for argv in (
        ["--out", str(shipped)],
        ["--out", str(shipped.parent / "other")],
        ["--out", str(shipped / ".." / "default")],
    ):
        error = _refused(script, argv, capsys)
        assert "inside the specsample package" in error and "--overwrite-shipped" in error
    readme = ["--out", "elsewhere", "--readme", str(script.SHIPPED_README)]
    assert "--readme" in _refused(script, readme, capsys)
    args = script.parse_args(["--out", str(shipped), "--overwrite-shipped"])
    assert args.readme == script.SHIPPED_README


def test_a_directory_outside_the_package_is_written_without_a_readme(
    script: ModuleType, tmp_path: Path
) -> None:
    args = script.parse_args(["--out", str(tmp_path / "models")])
    assert args.out == tmp_path / "models" and args.readme is None
    assert not script.in_package(tmp_path) and script.in_package(script.SHIPPED_OUT)
    assert script.REPEAT_OUT == "trained-models" and not script.in_package(Path("trained-models"))
