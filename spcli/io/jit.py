"""numba's njit as spcli's compiled loops use it: nogil (a scan runs in parts on threads) and cached, with a cache
that never fails an import.

numba caches compiled kernels in `__pycache__` beside the module, else in the user's cache (~/.cache/numba); where
neither can be written (a read-only install and home, as in some containers) it refuses to define a cached function
at all. There the cache goes to the system's temporary directory instead (`numba.config.CACHE_DIR`), or where
NUMBA_CACHE_DIR says.
"""

from __future__ import annotations

import functools
import os
import tempfile

import numba


def _is_writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def cache_dir_fallback(here: str) -> str | None:
    """The directory numba.config.CACHE_DIR must be set to for modules in `here` (None: numba finds one itself)."""
    if numba.config.CACHE_DIR:
        return None
    user = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "numba")
    if _is_writable(os.path.join(here, "__pycache__")) or _is_writable(user):
        return None
    return os.path.join(tempfile.gettempdir(), f"spcli-numba-{os.getuid()}")


if (_fallback := cache_dir_fallback(os.path.dirname(os.path.abspath(__file__)))) is not None:
    numba.config.CACHE_DIR = _fallback

njit = functools.partial(numba.njit, nogil=True, cache=True)
