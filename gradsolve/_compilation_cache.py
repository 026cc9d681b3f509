"""JAX's persistent compilation cache for the long-running calls (fits and samplers).

A lynx–hare posterior (2 chains x (500 + 1,000)) spends about as long compiling its fit,
warmup and sampling loops as running them; a second run in a new process compiles the same
programs again. JAX can keep compiled programs on disk (its persistent compilation cache),
but only when asked. `inference.fit` and `inference.sample` ask, through
`ensure_compilation_cache`, unless the user opted out or configured the cache themselves;
importing gradsolve still changes no JAX configuration.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax

from . import _config

__all__ = ["use_compilation_cache", "ensure_compilation_cache"]

_OFF = ("0", "false", "no", "off")
# programs that compile faster than this are not written. JAX's default is 1 s; a lynx–hare
# posterior compiles ~110 programs, nearly all under 0.1 s each and 3.4 s together, so every
# program is kept (second run in a new process: 11.8 s at 1 s, 8.7-9.2 s at 0)
MIN_COMPILE_TIME_S = 0.0
_STATE: dict[str, object] = {"choice": None, "done": False}


def _default_dir() -> Path:
    root = _config.SETTINGS.xla_cache
    if root and root.lower() not in _OFF:
        return Path(root)
    home = Path.home() / ".cache" / "gradsolve" / "xla"
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"gradsolve-xla-{os.getuid()}"


def use_compilation_cache(enable: bool = True, path: str | os.PathLike | None = None) -> None:
    """Keep the XLA programs that fits and samplers compile on disk (the default), or not.

    `inference.fit` and `inference.sample` switch on JAX's persistent compilation cache
    (``jax_compilation_cache_dir``) at their first call, in ``~/.cache/gradsolve/xla`` (or
    ``$GRADSOLVE_XLA_CACHE``), so a second run in a new process loads its compiled loops
    instead of compiling them again (lynx–hare NUTS, 2-core CPU: about 15 s to 9 s). They
    leave it alone when JAX's cache is already configured (yours wins) and when it was
    switched off here or by ``GRADSOLVE_XLA_CACHE=0``.

    Args:
        enable: ``True``: switch the cache on now; ``False``: never switch it on (a cache
            already switched on by gradsolve is switched off again).
        path: the folder (``None``: the default above).

    Example:
        >>> gs.use_compilation_cache(False)   # compile afresh in every process
    """
    if not enable:
        if _STATE["choice"] is not None and jax.config.jax_compilation_cache_dir == _STATE["choice"]:
            jax.config.update("jax_compilation_cache_dir", None)
        _STATE.update(choice=None, done=True)
        return
    folder = Path(path) if path is not None else _default_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    if jax.config.jax_persistent_cache_min_compile_time_secs == 1.0:  # JAX's default
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    _STATE.update(choice=str(folder), done=True)


def ensure_compilation_cache() -> str | None:
    """Switch the persistent cache on, once per process, unless somebody decided otherwise.

    What `inference.fit` and `inference.sample` call first (see `use_compilation_cache`);
    a script of its own long-running loops can call it too.

    Returns:
        The cache folder in use, or ``None`` when there is none.

    Example:
        >>> gs.ensure_compilation_cache()
        '/home/me/.cache/gradsolve/xla'
    """
    if not _STATE["done"]:
        setting = _config.SETTINGS.xla_cache
        if jax.config.jax_compilation_cache_dir:
            _STATE["done"] = True  # configured by the user: theirs
        elif setting is not None and setting.lower() in _OFF:
            _STATE["done"] = True
        else:
            try:
                use_compilation_cache(True)
            except OSError:
                _STATE["done"] = True  # no writable folder: compile as before
    return jax.config.jax_compilation_cache_dir or None
