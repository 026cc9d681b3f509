"""Every cache the library keeps in a process, behind one registry (`clear_caches`).

gradsolve memoises work that depends only on a vector field and the shapes it is called
with: input checks, the split of non-array parameters, translated fields, generated kernel
sources. Each such table is made here with `cache`, so none is hidden module state and
`gradsolve.clear_caches` empties them all (as Equinox's ``clear_caches`` does).
"""

from __future__ import annotations

import jax

_REGISTRY: dict[str, dict] = {}


def cache(name: str) -> dict:
    """A new, registered dict cache called ``name`` (unique; used in `cache_sizes`)."""
    if name in _REGISTRY:
        raise ValueError(f"gradsolve: a cache named {name!r} already exists.")
    table: dict = {}
    _REGISTRY[name] = table
    return table


def cache_sizes() -> dict[str, int]:
    """Entries per registered cache, by name (diagnostics)."""
    return {name: len(table) for name, table in _REGISTRY.items()}


def clear_caches() -> None:
    """Empty every gradsolve cache and JAX's compilation caches.

    Afterwards the next call re-checks, re-translates and re-traces what it needs; kernels
    already compiled to disk are loaded again from there (their FFI targets stay
    registered with XLA, which cannot unregister them), and a kernel build that failed is
    tried again. Values and gradients are unchanged. Use it to release the vector fields
    (and whatever they close over) that the caches keep alive, or after changing the
    compiler or its environment.

    Example:
        >>> gs.clear_caches()
    """
    for table in _REGISTRY.values():
        table.clear()
    jax.clear_caches()
