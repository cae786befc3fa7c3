"""spcli/io/jit.py: numba's cache goes to the system's temporary directory only where neither the install nor the
user's cache can be written (numba would refuse to define a cached function there)."""

import tempfile

import numba

from spcli.io.jit import cache_dir_fallback


def test_the_cache_falls_back_only_where_nothing_else_is_writable(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", "/dev/null/cache")  # under a file: cannot be made
    assert cache_dir_fallback(str(tmp_path)) is None  # the install is writable: numba caches beside it
    fallback = cache_dir_fallback("/dev/null/spcli/io")
    assert fallback is not None and fallback.startswith(tempfile.gettempdir())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_dir_fallback("/dev/null/spcli/io") is None  # the user's cache is
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "given"))
    assert cache_dir_fallback("/dev/null/spcli/io") is None  # NUMBA_CACHE_DIR given: numba's own
