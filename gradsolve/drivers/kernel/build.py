"""Compile generated kernel source with the system C++ compiler and register it with XLA.

One source holds four FFI handlers, each selected by a macro (`gradsolve.drivers.kernel.source`'s
``GS_PART_*``): the replay's forward (``fwd``), its adjoint (``bwd``), the record (``rec``)
and the adjoint with node-time cotangents (``bwdt``, for a replay given ``ts``). The first
three are compiled in parallel, one compiler process per CPU (`_groups`); ``bwdt`` only
when first used. The compiler's time grows with the inlined stages, so for large vector
fields this matters: a 64-state Lorenz-96 kernel took 25 s as one library on two cores and
takes ~11 s now; a 2-state one 3.9 s then, ~3.4 s now.

Shared objects are cached on disk under ``$GRADSOLVE_KERNEL_CACHE`` (default
``~/.cache/gradsolve/kernels``), keyed by a hash of the source, the compiler command and the
CPU's feature flags (the code is built with ``-march=native``). Compiling takes a few
seconds once per vector field; a cached kernel loads in milliseconds. The cache keeps the
most recently used kernels within ``$GRADSOLVE_KERNEL_CACHE_MB`` (default 1024) megabytes.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax

from ... import _config
from ..._caches import cache

_lock = threading.Lock()
# Registered FFI targets are process state, not a cache: XLA cannot unregister them.
_registered: dict[str, str] = {}  # source hash -> target prefix
_failed = cache("failed kernel builds")  # source hash -> True (cleared: try again)
_built: dict[str, tuple[str, str, str, set]] = {}  # prefix -> (cxx, source, key, parts)
_warned = False

# Part -> (macro selecting it in the source, exported handler symbol).
_PARTS = {"fwd": ("GS_PART_FWD", "Fwd"), "bwd": ("GS_PART_BWD", "Bwd"),
          "bwdt": ("GS_PART_BWDT", "Bwd"), "rec": ("GS_PART_REC", "Rec")}
_EAGER_PARTS = ("fwd", "bwd", "rec")


def _groups(parts: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Parts compiled together, one compiler process (and shared library) per group.

    Each process pays ~1 s for the headers, so there are no more groups than CPUs; with
    two, the adjoint (the largest part) is compiled alone.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    if cpus >= len(parts):
        return [(part,) for part in parts]
    if cpus == 2 and "bwd" in parts:
        return [tuple(p for p in parts if p != "bwd"), ("bwd",)]
    return [tuple(parts)]

_FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno",
          "-fopenmp-simd", "-w", "-pthread"]
# First choice: SIMD libm from glibc's libmvec (see source.py), compiler flags before the
# source and linker flags after it. Every symbol must resolve at link time, else the build
# is retried with scalar libm. Without -fno-builtin-sin/cos, sin and cos of one argument (a
# reverse sweep recomputes sin(x) and differentiates it) are merged into a scalar sincos.
_VECTOR_MATH_FLAGS = (["-DGRADSOLVE_VECTOR_MATH", "-fno-builtin-sin", "-fno-builtin-cos",
                 "-fno-builtin-sinf", "-fno-builtin-cosf"],
                ["-Wl,-z,defs", "-lmvec", "-lm"])


def compiler() -> str | None:
    """The C++ compiler used for kernels (``$CXX``, else ``g++``/``c++``/``clang++``), or None."""
    for cand in (_config.SETTINGS.cxx, "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return cand
    return None


def _cpu_key() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$GRADSOLVE_KERNEL_CACHE``, else
    ``~/.cache/gradsolve/kernels``, else (not writable) a folder in the temp directory."""
    root = _config.SETTINGS.kernel_cache
    if root:
        return Path(root)
    home = Path.home() / ".cache" / "gradsolve" / "kernels"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "gradsolve-kernels"


def load(source: str) -> str | None:
    """Compile (or fetch from cache) and register ``source``'s ``fwd``, ``bwd`` and ``rec``
    handlers as FFI targets ``{prefix}_fwd`` etc.; returns the target prefix.

    Returns None when no compiler is available or compilation fails (the caller then uses
    the XLA replay); warns once in that case.
    """
    cxx = compiler()
    key = hashlib.sha256(
        "\0".join([source, str(cxx), " ".join(_FLAGS), str(_VECTOR_MATH_FLAGS), _cpu_key(),
                   jax.__version__, str(_groups(_EAGER_PARTS))]).encode()
    ).hexdigest()[:24]
    with _lock:
        if key in _registered:
            return _registered[key]
        if key in _failed:
            return None
        if cxx is None:
            _failed[key] = True
            _warn_once("no C++ compiler found (set $CXX)")
            return None
        prefix = f"gradsolve_{key}"
        try:
            _build_and_register(cxx, source, key, prefix, _EAGER_PARTS)
        except Exception as e:  # noqa: BLE001 - any failure means: use the XLA replay
            _failed[key] = True
            _warn_once(str(e))
            return None
        _built[prefix] = (cxx, source, key, set(_EAGER_PARTS))
        _registered[key] = prefix
        return prefix


def load_part(prefix: str, part: str) -> None:
    """Make sure the on-demand ``part`` (``"bwdt"``) of the kernel ``prefix`` (from `load`)
    is built and registered as FFI target ``{prefix}_{part}``."""
    with _lock:
        cxx, source, key, done = _built[prefix]
        if part not in done:
            _build_and_register(cxx, source, key, prefix, (part,))
            done.add(part)


def _build_and_register(cxx: str, source: str, key: str, prefix: str, parts) -> None:
    groups = _groups(tuple(parts))
    paths = {g: cache_dir() / f"gs_{key}_{'-'.join(g)}.so" for g in groups}
    todo = [g for g in groups if not paths[g].exists()]
    if todo:
        with ThreadPoolExecutor(max_workers=len(todo)) as ex:
            for fut in [ex.submit(_compile, cxx, source, paths[g], g) for g in todo]:
                fut.result()
        _prune_cache(keep=set(paths.values()))
    for g in groups:
        try:
            os.utime(paths[g])  # last use, for the cache's least-recently-used pruning
        except OSError:
            pass
        lib = ctypes.cdll.LoadLibrary(str(paths[g]))
        for part in g:
            target = f"{prefix}_{part}"
            handler = jax.ffi.pycapsule(getattr(lib, _PARTS[part][1]))
            jax.ffi.register_ffi_target(target, handler, platform="cpu")
            # Every operand and result leads with the ensemble axis and trajectories are
            # independent, so a sharded ensemble runs the kernel on each shard.
            jax.ffi.register_ffi_target_as_batch_partitionable(target)


def _prune_cache(keep: set) -> None:
    """Delete the least recently used kernels while the cache exceeds its size limit
    (``$GRADSOLVE_KERNEL_CACHE_MB``, default 1024). Loaded libraries stay valid."""
    try:
        limit = _config.SETTINGS.kernel_cache_mb * 2**20
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in cache_dir().glob("gs_*.so")]
    except (OSError, ValueError):
        return
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda x: x[0]):
        if total <= limit:
            break
        if path in keep:
            continue
        try:
            path.unlink()
            total -= size
        except OSError:
            pass


def _warn_once(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"gradsolve: could not build the compiled kernel ({reason}); using the XLA record "
            "and replay (same results, slower). GRADSOLVE_KERNEL=0 silences this.",
            RuntimeWarning, stacklevel=4,
        )


def _compile(cxx: str, source: str, path: Path, parts: tuple[str, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cc"
        src.write_text(source)
        out = Path(tmp) / "kernel.so"
        macros = [f"-D{_PARTS[part][0]}" for part in parts]
        base = [cxx, *_FLAGS, *macros, f"-I{jax.ffi.include_dir()}"]
        pre, post = _VECTOR_MATH_FLAGS
        res = subprocess.run([*base, *pre, str(src), "-o", str(out), *post],
                             capture_output=True, text=True)
        if res.returncode != 0:  # no libmvec (or not glibc): scalar libm
            res = subprocess.run([*base, str(src), "-o", str(out)], capture_output=True,
                                 text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{cxx} failed: {res.stderr[-2000:]}")
        # Atomic publish: concurrent processes may build the same kernel.
        fd, tmp_target = tempfile.mkstemp(dir=path.parent, suffix=".so")
        os.close(fd)
        shutil.copyfile(out, tmp_target)
        os.replace(tmp_target, path)
