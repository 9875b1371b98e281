"""numba kernels: compiled once per machine and user, in the foreground and announced, on the
caller's thread count.

* **Cache.** :func:`njit` caches machine code in :func:`cache_dir` (``$SPECSAMPLE_CACHE_DIR``,
  else ``$XDG_CACHE_HOME/specsample/numba``, else ``~/.cache/specsample/numba``), never inside
  the installed package, in a folder named by :func:`sources_key`: a digest of numba's and
  llvmlite's versions and of every source the kernels are compiled from. Every checkout or
  installation of the same sources shares it (numba's own cache is kept per source folder).
* **Compilation.** :func:`warm_up` loads every kernel from that cache on the calling thread,
  once per process. When the cache does not hold them yet, it says so on standard error
  first, one line (the elapsed seconds on a terminal), and compiles them into the cache in a
  child process before loading them: the caller never carries the compiler's leftovers, so
  its timings are those of any later process. Loading is silent. The first use of a kernel
  (:func:`ready`) warms up the same way, so no call ever compiles behind the caller's back;
  ``specsample warm`` (or ``make kernels``) does it ahead of time. After the warm-up no
  kernel compiles again.
* **Threads.** The kernels use no more threads than PyTorch's count (:func:`threads`), and
  starting numba's thread pool leaves that count as it was.

Without numba installed, :func:`available` is ``False`` and :func:`njit` returns the
function unchanged (it is then never called).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

_NUMBA = importlib.util.find_spec("numba") is not None
_KERNELS = tuple(
    f"specsample.{name}"
    for name in (
        "kernels.cpu.hashing",
        "kernels.cpu.chain",
        "kernels.cpu.logits",
        "adapter.int_products",
        "kernels.cpu.rowexact",
        "kernels.cpu.gumbel",
    )
)
"""The modules whose ``warm()`` compiles their numba kernels: the CPU kernels of
:mod:`specsample.kernels.cpu`, and the integer products of the quantized weight formats
(:mod:`specsample.adapter.int_products`), named as strings so that nothing here imports them."""
_warmed = threading.Lock()
_state = {"done": False, "compiled": False}
_pool = threading.Lock()
_pool_size: list[int] = []
"""numba's thread count, once :func:`_start_pool` has started its pool."""


def available() -> bool:
    """Whether numba is installed (the fused CPU backend can run here).

    Examples
    --------
    >>> isinstance(available(), bool)
    True
    """
    return _NUMBA


def cache_dir() -> Path:
    """Where the compiled kernels are cached: writable by the user, outside the package.

    Examples
    --------
    >>> cache_dir().name
    'numba'
    """
    explicit = os.environ.get("SPECSAMPLE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "numba"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specsample" / "numba"


def kernel_sources() -> list[Path]:
    """Every source file the kernels are compiled from: the modules of this package and of
    :data:`_KERNELS`, and the project's modules they import (a kernel bakes in the constants
    and inlines the functions it reads from them).

    Examples
    --------
    >>> Path(__file__) in kernel_sources()
    True
    """
    here = Path(__file__).parent
    root = here.parents[2]
    sources = set(here.glob("*.py")) | {
        root.joinpath(*m.split(".")).with_suffix(".py") for m in _KERNELS
    }
    for path in list(sources):
        for name in re.findall(r"^from (specsample(?:\.\w+)+) import", path.read_text(), re.M):
            module = root.joinpath(*name.split("."))
            sources.add(module / "__init__.py" if module.is_dir() else module.with_suffix(".py"))
    return sorted(sources)


@functools.cache
def sources_key() -> str:
    """A digest of numba's and llvmlite's versions and of :func:`kernel_sources`, naming the
    folder of :func:`cache_dir` the kernels are cached in: machine code compiled by another
    compiler, or from other sources, is never loaded.

    Examples
    --------
    >>> len(sources_key())
    16
    """
    digest = hashlib.sha256()
    if _NUMBA:
        import llvmlite
        import numba

        digest.update(f"numba {numba.__version__} llvmlite {llvmlite.__version__}".encode())
    for path in kernel_sources():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_folder() -> Path:
    return cache_dir() / sources_key()


@functools.cache
def _kernel_cache() -> type:
    """numba's function cache, located in :func:`_cache_folder` whatever the source file's
    path, with :func:`sources_key` as the sources' stamp."""
    from numba.core import caching

    class Locator(caching._CacheLocator):
        def __init__(self, path: Path) -> None:
            self._path = str(path)

        def get_cache_path(self) -> str:
            return self._path

        def get_source_stamp(self) -> str:
            return sources_key()

        def get_disambiguator(self) -> str:
            return "kernel"

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Locator | None:
            locator = cls(_cache_folder())
            try:
                locator.ensure_cache_path()
            except OSError:  # not writable: no cache, the kernel compiles in every process
                return None
            return locator

    class Impl(caching.CompileResultCacheImpl):
        _locator_classes = [Locator]  # type: ignore[list-item]  # noqa: RUF012

    class KernelCache(caching.FunctionCache):
        _impl_class = Impl

    return KernelCache


def njit(function: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``numba.njit(nogil=True, error_model="numpy", **options)`` caching into
    :func:`cache_dir` (its folder :func:`sources_key`): a float division by zero gives an
    infinity or NaN, as in PyTorch, not an exception.

    Usable bare (``@njit``) or with options (``@njit(parallel=True)``). Where no cache
    directory can be written, the function is compiled in each process instead.
    """
    if function is None:
        return lambda f: njit(f, **options)
    if not _NUMBA:
        return function
    import numba

    dispatcher = numba.njit(nogil=True, error_model="numpy", **options)(function)
    with contextlib.suppress(RuntimeError):  # no locator: the cache cannot be written
        dispatcher._cache = _kernel_cache()(dispatcher.py_func)
    return dispatcher


def serial(kernel: Any) -> Any:
    """The serial twin of a parallel :func:`njit` kernel: the same Python function compiled
    without ``parallel`` (its ``prange`` loops run as ``range`` on the calling thread), for
    work too small to share between threads.

    The twin is a copy of the function under the name ``<name>_serial``, so that numba
    caches its machine code apart from the parallel kernel's.
    """
    function = getattr(kernel, "py_func", kernel)
    twin = types.FunctionType(
        function.__code__,
        function.__globals__,
        f"{function.__name__}_serial",
        function.__defaults__,
        function.__closure__,
    )
    twin.__qualname__ = f"{function.__qualname__}_serial"
    twin.__doc__ = f"``{function.__name__}`` on the calling thread (see :func:`serial`)."
    twin.__module__ = function.__module__
    return njit(twin)


def __getattr__(name: str) -> Any:
    """``prange``: ``numba.prange`` (a parallel loop inside :func:`njit` functions), or
    ``range`` without numba; looked up lazily, so that importing this module does not import
    numba."""
    if name == "prange":
        if _NUMBA:
            from numba import prange

            return prange
        return range
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _marker() -> Path:
    """The file :func:`warm_up` leaves once every kernel is in the cache."""
    return _cache_folder() / "complete"


def _announce(stream: TextIO, text: str, *, end: str = "\n") -> None:
    stream.write(text + end)
    stream.flush()


def warm_modules(names: Sequence[str]) -> None:
    """Run the ``warm()`` of each named module (:data:`_KERNELS`): compile (or load) and
    freeze its kernels."""
    for name in names:
        importlib.import_module(name).warm()


_CHILD = (
    "import sys; from specsample.kernels.cpu import compiler; compiler.warm_modules(sys.argv[1:])"
)
"""What the process :func:`_compile_apart` starts runs."""


def _compile_apart(stream: TextIO, notice: str, terminal: bool) -> None:
    """Compile the kernels into the cache in a child process (the same interpreter and
    sources), the elapsed seconds on a terminal meanwhile.

    The calling process then only loads them: what compiling leaves behind (numba's and
    LLVM's objects, hundreds of megabytes) never slows it, so its timings are those of any
    later process. Where the child fails, loading compiles what is missing instead."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])  # the folder holding the package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *_KERNELS],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while True:
        try:
            child.wait(timeout=1.0)
            return
        except subprocess.TimeoutExpired:
            if terminal:
                _announce(stream, f"\r{notice}: {time.perf_counter() - started:.0f} s", end="")


def _compile_all(stream: TextIO) -> None:
    """Compile every kernel into the cache, announced on ``stream``, unless the cache
    already holds them; then load them here (silently)."""
    loud = not _marker().exists()
    notice = "specsample: compiling the CPU kernels for this machine, once (about a minute)"
    terminal = loud and stream.isatty()
    started = time.perf_counter()
    if loud:
        _announce(stream, notice if terminal else f"{notice}...", end="" if terminal else "\n")
        _compile_apart(stream, notice, terminal)
    warm_modules(_KERNELS)
    if loud:
        seconds = time.perf_counter() - started
        _announce(stream, f"\r{notice}: done in {seconds:.0f} s" if terminal else
                  f"specsample: CPU kernels compiled in {seconds:.0f} s")  # fmt: skip
    with contextlib.suppress(OSError):  # a cache that cannot be written: compiled again
        _marker().touch()


def warm_up(stream: TextIO | None = None) -> bool:
    """Compile (or load from the cache) every kernel on the calling thread, once per
    process; other threads asking meanwhile wait for it. Announced on ``stream`` (standard
    error by default) when it compiles.

    Returns
    -------
    bool
        Whether the kernels are ready (``False`` without numba, or if a compilation failed:
        then a :class:`RuntimeWarning` says why and the PyTorch code runs instead).
    """
    if not _NUMBA:
        return False
    with _warmed:
        if not _state["done"]:
            try:
                with _keeping_threads():  # loading a parallel kernel starts numba's pool
                    _compile_all(sys.stderr if stream is None else stream)
                threads()
                _state["compiled"] = True
            except Exception as error:  # a failed compilation leaves the PyTorch code in charge
                warnings.warn(
                    f"specsample: the fused CPU kernels did not compile ({error}); using PyTorch",
                    RuntimeWarning,
                    stacklevel=2,
                )
            finally:
                _state["done"] = True
    return _state["compiled"]


def ready() -> bool:
    """Whether the kernels can run: numba is installed and they are compiled. The first call
    warms them up (:func:`warm_up`, in the foreground, announced if it compiles).

    Examples
    --------
    >>> ready() == available()
    True
    """
    if not _NUMBA:
        return False
    if _state["done"]:
        return _state["compiled"]
    return warm_up()


def warmed() -> bool:
    """Whether this process has warmed the kernels up already (nothing is warmed by asking).

    Examples
    --------
    >>> warm_up() == warmed() == available()
    True
    """
    return bool(_state["done"] and _state["compiled"])


@contextlib.contextmanager
def _keeping_threads() -> Iterator[None]:
    """Restore PyTorch's thread count on the calling thread after the block: starting
    numba's OpenMP thread pool (which compiling or loading a parallel kernel does too) sets
    the calling thread's OpenMP count, which is PyTorch's, to numba's."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _start_pool() -> None:
    """Start numba's thread pool, once, leaving PyTorch's thread count as it was, and note
    its size (:data:`_pool_size`)."""
    with _pool:
        if not _pool_size:
            import numba

            with _keeping_threads():
                numba.get_num_threads()
            _pool_size.append(int(numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]


def threads() -> int:
    """How many threads a parallel kernel may share: PyTorch's count, at most numba's pool
    (``torch.set_num_threads(1)`` keeps every kernel on the calling thread); 1 without
    numba. numba's count on the calling thread is set to it, so a parallel kernel started
    next uses no more.

    Examples
    --------
    >>> 1 <= threads() <= max(1, torch.get_num_threads())
    True
    """
    if not _NUMBA:
        return 1
    import numba

    if not _pool_size:
        _start_pool()
    count = max(1, min(torch.get_num_threads(), _pool_size[0]))
    if numba.get_num_threads() != count:
        numba.set_num_threads(count)
    return count


def runs_on(tensor: torch.Tensor) -> bool:
    """Whether a kernel may take this tensor now: a CPU tensor, in a call that is not being
    recorded (neither traced by :func:`torch.compile` nor under a dispatch mode such as
    ``make_fx`` or fake tensors, which must see PyTorch operations, not a kernel's result
    baked in as a constant), and the kernels compiled (:func:`ready`, which compiles them
    on first use).

    Examples
    --------
    >>> import torch
    >>> runs_on(torch.zeros(1)) == available()
    True
    """
    return (
        tensor.is_cpu
        and not torch.compiler.is_compiling()
        and not is_in_torch_dispatch_mode()
        and ready()
    )
