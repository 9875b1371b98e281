"""Compilation of the CPU kernels (:mod:`specsample.kernels.cpu.compiler`): where the cache lives,
that
nothing is written inside the installed package, that machine code is kept per version of the
kernels' sources and of the compiler, one cache for every checkout, that a compilation is
announced and a load is not, and the serial twins of the parallel kernels
(:func:`specsample.kernels.cpu.compiler.serial`)."""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

import specsample
from specsample.kernels.cpu import compiler


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSAMPLE_CACHE_DIR", "/somewhere")
    assert compiler.cache_dir() == Path("/somewhere/numba")
    monkeypatch.delenv("SPECSAMPLE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert compiler.cache_dir() == Path("/xdg/specsample/numba")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compiler.cache_dir() == Path.home() / ".cache" / "specsample" / "numba"


@pytest.mark.skipif(not compiler.available(), reason="needs numba")
def test_compiled_kernels_are_cached_outside_the_package() -> None:
    compiler.warm_up()
    assert compiler.ready()
    package = Path(specsample.__file__).parent
    assert not [p for p in package.rglob("*") if p.suffix in (".nbi", ".nbc")]
    assert any((compiler.cache_dir() / compiler.sources_key()).rglob("*.nbi"))


@pytest.fixture
def package_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the package's sources, which :func:`compiler.sources_key` reads instead."""
    package = Path(specsample.__file__).parent
    for source in package.rglob("*.py"):
        copy = tmp_path / "specsample" / source.relative_to(package)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(source.read_bytes())
    copy = tmp_path / "specsample" / "kernels" / "cpu" / "compiler.py"
    monkeypatch.setattr(compiler, "__file__", str(copy))
    compiler.sources_key.cache_clear()
    yield tmp_path / "specsample"
    monkeypatch.undo()
    compiler.sources_key.cache_clear()


@pytest.mark.parametrize(
    "source",
    [
        "kernels/cpu/floats.py",
        "kernels/cpu/compiler.py",
        "adapter/int_products.py",
        "rules/residual.py",
    ],
)
def test_the_cache_folder_follows_every_kernel_source(package_copy: Path, source: str) -> None:
    """A kernel inlines functions and bakes in constants of other modules (``rules.residual.BLOCK``
    in the chain rule): editing any source it is compiled from gives its machine code a new
    folder."""
    before = compiler.sources_key()
    compiler.sources_key.cache_clear()
    edited = package_copy / source
    edited.write_text(edited.read_text() + "\n")
    assert compiler.sources_key() != before


@pytest.mark.skipif(not compiler.available(), reason="needs numba")
def test_the_cache_folder_follows_the_compiler(
    package_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Machine code compiled by another numba is never loaded."""
    import numba

    before = compiler.sources_key()
    compiler.sources_key.cache_clear()
    monkeypatch.setattr(numba, "__version__", "0.0.1")
    assert compiler.sources_key() != before


def test_sources_not_compiled_leave_the_cache_folder(package_copy: Path) -> None:
    """Only what the kernels are compiled from counts: the command line does not."""
    before = compiler.sources_key()
    compiler.sources_key.cache_clear()
    edited = package_copy / "cli" / "demo.py"
    edited.write_text(edited.read_text() + "\n")
    assert compiler.sources_key() == before


KERNEL = (
    "from specsample.kernels.cpu.compiler import njit\n\n\n@njit\ndef twice(x):\n    return 2 * x\n"
)


@pytest.mark.skipif(not compiler.available(), reason="needs numba")
def test_one_cache_for_every_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kernel in two folders (two checkouts, or a checkout and an installation)
    shares one cache entry: the second copy loads what the first compiled."""
    monkeypatch.setenv("SPECSAMPLE_CACHE_DIR", str(tmp_path / "cache"))
    copies = []
    for folder in ("one", "two"):
        path = tmp_path / folder / "kernel_copy.py"
        path.parent.mkdir()
        path.write_text(KERNEL)
        spec = importlib.util.spec_from_file_location(f"kernel_copy_{folder}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        copies.append(module.twice)
    assert copies[0](21) == 42 and not copies[0].stats.cache_hits
    assert copies[1](21) == 42 and sum(copies[1].stats.cache_hits.values()) == 1
    assert {p.parent for p in (tmp_path / "cache").rglob("*.nbi")} == {
        tmp_path / "cache" / "numba" / compiler.sources_key()
    }


@pytest.mark.skipif(not compiler.available(), reason="needs numba")
def test_compiling_is_announced_and_loading_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the cache's mark of a complete warm-up, the kernels' warm-up says on the
    stream that it compiles, and how long it took; with it, nothing is printed."""
    monkeypatch.setenv("SPECSAMPLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_KERNELS", ("specsample.kernels.cpu.hashing",))
    (tmp_path / "numba" / compiler.sources_key()).mkdir(parents=True)
    first, second = io.StringIO(), io.StringIO()
    compiler._compile_all(first)
    compiler._compile_all(second)
    lines = first.getvalue().splitlines()
    assert len(lines) == 2 and "compiling the CPU kernels" in lines[0]
    assert "compiled in" in lines[1]
    assert second.getvalue() == ""


def test_without_numba_njit_leaves_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "_NUMBA", False)
    assert compiler.njit(len) is len
    assert compiler.njit(parallel=True)(len) is len
    assert not compiler.ready()


@pytest.mark.skipif(not compiler.available(), reason="needs numba")
def test_the_serial_twin_computes_the_same_and_is_cached_apart() -> None:
    from specsample.kernels.cpu import chain, logits

    compiler.warm_up()
    for parallel, twin in (
        (chain.chain_rule, chain.chain_rule_serial),
        (logits.row_norms, logits.row_norms_serial),
        (logits.chain_logits, logits.chain_logits_serial),
    ):
        assert twin.py_func.__code__ is parallel.py_func.__code__
        assert twin.py_func.__qualname__ == f"{parallel.py_func.__qualname__}_serial"
        assert not twin.targetoptions.get("parallel")
        assert parallel.targetoptions.get("parallel")
    names = {p.name for p in compiler.cache_dir().rglob("*.nbi")}
    assert any(name.startswith("chain.chain_rule_serial-") for name in names)
    assert any(name.startswith("chain.chain_rule-") for name in names)
