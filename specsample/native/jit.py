"""numba, compiled once per machine into the user's cache, and never waited for.

:func:`njit` compiles a function with numba on first use and caches the machine code in
:func:`cache_dir` (``$SPECSAMPLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/specsample/numba``, else
``~/.cache/specsample/numba``): never inside the installed package. :func:`warm_up` compiles
(or loads from that cache) every kernel on a background thread; until it has finished,
:func:`ready` is ``False`` and the backend runs the PyTorch code instead, which gives the same
tokens. So no call waits for a compilation, the first one after installation included.

Without numba installed, :func:`available` is ``False`` and :func:`njit` returns the
function unchanged (it is then never called).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import threading
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

_NUMBA = importlib.util.find_spec("numba") is not None
_done = threading.Event()
_compiled = threading.Event()
_started = threading.Lock()
_warmers: list[Callable[[], None]] = []
_thread: list[threading.Thread] = []


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


@functools.cache
def sources_key() -> str:
    """A digest of the kernels' source files, naming the folder of :func:`cache_dir` they are
    cached in. numba checks a cached function against its own file alone, not against the
    files of the functions it inlines: keyed by every source, machine code compiled from other
    sources is never loaded.

    Examples
    --------
    >>> len(sources_key())
    16
    """
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def njit(function: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``numba.njit(cache=True, nogil=True, error_model="numpy", **options)`` caching into
    :func:`cache_dir` (its folder :func:`sources_key`): a float division by zero gives an
    infinity or NaN, as in PyTorch, not an exception.

    Usable bare (``@njit``) or with options (``@njit(parallel=True)``). numba reads its
    cache directory when a function is decorated, so it is set for that moment only; where
    no cache directory can be written, the function is compiled in each process instead.
    """
    if function is None:
        return lambda f: njit(f, **options)
    if not _NUMBA:
        return function
    import numba

    previous = getattr(numba.config, "CACHE_DIR", "")
    setattr(numba.config, "CACHE_DIR", str(cache_dir() / sources_key()))  # noqa: B010
    try:
        return numba.njit(cache=True, nogil=True, error_model="numpy", **options)(function)
    except RuntimeError:  # no writable cache directory: compile in every process instead
        return numba.njit(nogil=True, error_model="numpy", **options)(function)
    finally:
        setattr(numba.config, "CACHE_DIR", previous)  # noqa: B010


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


def on_warm_up(warmer: Callable[[], None]) -> Callable[[], None]:
    """Register ``warmer`` (a call of kernels on tiny inputs) to run in :func:`warm_up`."""
    _warmers.append(warmer)
    return warmer


def _warm_all() -> None:
    try:
        for warmer in _warmers:
            warmer()
        _compiled.set()
    except Exception as error:  # a failed compilation leaves the PyTorch code in charge
        warnings.warn(
            f"specsample: the fused CPU kernels did not compile ({error}); using PyTorch",
            RuntimeWarning,
            stacklevel=1,
        )
    finally:
        _done.set()


def warm_up(*, wait: bool = False) -> None:
    """Compile (or load) every kernel on a background thread, once; ``wait`` joins it."""
    with _started:
        if not _thread:
            _thread.append(threading.Thread(target=_warm_all, name="specsample-jit", daemon=True))
            _thread[0].start()
    if wait:
        _thread[0].join()


def threads() -> int:
    """How many threads a parallel kernel may share: numba's count, capped by PyTorch's
    (``torch.set_num_threads(1)`` keeps every kernel on the calling thread); 1 without
    numba.

    Examples
    --------
    >>> 1 <= threads() <= max(1, torch.get_num_threads())
    True
    """
    if not _NUMBA:
        return 1
    import numba

    return max(1, min(int(numba.get_num_threads()), torch.get_num_threads()))


def runs_on(tensor: torch.Tensor) -> bool:
    """Whether a kernel may take this tensor now: a CPU tensor, in a call that is not being
    recorded (neither traced by :func:`torch.compile` nor under a dispatch mode such as
    ``make_fx`` or fake tensors, which must see PyTorch operations, not a kernel's result
    baked in as a constant), and the kernels compiled (:func:`ready`).

    Examples
    --------
    >>> import torch
    >>> warm_up(wait=True)
    >>> runs_on(torch.zeros(1)) == available()
    True
    """
    return (
        tensor.is_cpu
        and not torch.compiler.is_compiling()
        and not is_in_torch_dispatch_mode()
        and ready()
    )


def ready() -> bool:
    """Whether the kernels are compiled; the first call starts :func:`warm_up`.

    Examples
    --------
    >>> warm_up(wait=True)
    >>> ready() == available()
    True
    """
    if not _NUMBA:
        return False
    if _done.is_set():
        return _compiled.is_set()
    warm_up()
    return False
