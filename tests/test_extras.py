"""How messages tell a user to install an optional part (:mod:`specsample.extras`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsample.extras import EXTRAS, install_command

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_command_installs_the_checkout_not_a_package_from_an_index() -> None:
    for extra in EXTRAS:
        command = install_command(extra)
        assert command.startswith(f"pip install -e '.[{extra}]'") and "checkout" in command
        assert "specsample[" not in command
    with pytest.raises(ValueError, match="extra must be one of"):
        install_command("gpu")


def test_the_extras_are_those_of_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert set(EXTRAS) == set(project["optional-dependencies"])
