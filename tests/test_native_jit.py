"""Compilation of the CPU kernels (:mod:`specsample.native.jit`): where the cache lives, and
that nothing is written inside the installed package."""

from __future__ import annotations

from pathlib import Path

import pytest

import specsample
from specsample.native import jit


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSAMPLE_CACHE_DIR", "/somewhere")
    assert jit.cache_dir() == Path("/somewhere/numba")
    monkeypatch.delenv("SPECSAMPLE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert jit.cache_dir() == Path("/xdg/specsample/numba")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert jit.cache_dir() == Path.home() / ".cache" / "specsample" / "numba"


@pytest.mark.skipif(not jit.available(), reason="needs numba")
def test_compiled_kernels_are_cached_outside_the_package() -> None:
    jit.warm_up(wait=True)
    assert jit.ready()
    package = Path(specsample.__file__).parent
    assert not [p for p in package.rglob("*") if p.suffix in (".nbi", ".nbc")]
    assert any(jit.cache_dir().rglob("*.nbi"))


def test_without_numba_njit_leaves_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jit, "_NUMBA", False)
    assert jit.njit(len) is len
    assert jit.njit(parallel=True)(len) is len
    assert not jit.ready()
