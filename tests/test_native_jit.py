"""Compilation of the CPU kernels (:mod:`specsample.native.jit`): where the cache lives, that
nothing is written inside the installed package, that machine code is kept per version of the
kernels' sources, and the serial twins of the parallel kernels
(:func:`specsample.native.jit.serial`)."""

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
    assert any((jit.cache_dir() / jit.sources_key()).rglob("*.nbi"))


def test_the_cache_folder_follows_every_kernel_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel inlines functions of other modules: editing any source of the package gives
    its machine code a new folder."""
    for source in Path(jit.__file__).parent.glob("*.py"):
        (tmp_path / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(jit, "__file__", str(tmp_path / "jit.py"))
    jit.sources_key.cache_clear()
    try:
        before = jit.sources_key()
        jit.sources_key.cache_clear()
        (tmp_path / "floats.py").write_text((tmp_path / "floats.py").read_text() + "\n")
        assert jit.sources_key() != before
    finally:
        monkeypatch.undo()
        jit.sources_key.cache_clear()


def test_without_numba_njit_leaves_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jit, "_NUMBA", False)
    assert jit.njit(len) is len
    assert jit.njit(parallel=True)(len) is len
    assert not jit.ready()


@pytest.mark.skipif(not jit.available(), reason="needs numba")
def test_the_serial_twin_computes_the_same_and_is_cached_apart() -> None:
    from specsample.native import chain, logits

    jit.warm_up(wait=True)
    for parallel, twin in (
        (chain.chain_rule, chain.chain_rule_serial),
        (logits.row_stats, logits.row_stats_serial),
        (logits.chain_logits, logits.chain_logits_serial),
    ):
        assert twin.py_func.__code__ is parallel.py_func.__code__
        assert twin.py_func.__qualname__ == f"{parallel.py_func.__qualname__}_serial"
        assert not twin.targetoptions.get("parallel")
        assert parallel.targetoptions.get("parallel")
    names = {p.name for p in jit.cache_dir().rglob("*.nbi")}
    assert any(name.startswith("chain.chain_rule_serial-") for name in names)
    assert any(name.startswith("chain.chain_rule-") for name in names)
