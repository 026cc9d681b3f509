"""Compile generated kernel source with the system C++ compiler and register it with XLA.

Shared objects are cached on disk under ``$GRADSOLVE_KERNEL_CACHE`` (default
``~/.cache/gradsolve/kernels``), keyed by a hash of the source, the compiler command and the
CPU's feature flags (the code is built with ``-march=native``). Compiling takes a few
seconds once per vector field; a cached kernel loads in milliseconds.
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
from pathlib import Path

import jax

_lock = threading.Lock()
_registered: dict[str, str] = {}  # source hash -> target prefix
_failed: set[str] = set()
_warned = False

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
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
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
    root = os.environ.get("GRADSOLVE_KERNEL_CACHE")
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
    """Compile (or fetch from cache) and register ``source``; returns the FFI target prefix.

    Returns None when no compiler is available or compilation fails (the caller then uses
    the XLA replay); warns once in that case.
    """
    cxx = compiler()
    key = hashlib.sha256(
        "\0".join([source, str(cxx), " ".join(_FLAGS), str(_VECTOR_MATH_FLAGS), _cpu_key(),
                   jax.__version__]).encode()
    ).hexdigest()[:24]
    with _lock:
        if key in _registered:
            return _registered[key]
        if key in _failed:
            return None
        if cxx is None:
            _failed.add(key)
            _warn_once("no C++ compiler found (set $CXX)")
            return None
        path = cache_dir() / f"gs_{key}.so"
        try:
            if not path.exists():
                _compile(cxx, source, path)
            lib = ctypes.cdll.LoadLibrary(str(path))
            prefix = f"gradsolve_{key}"
            for name in ("Fwd", "Bwd", "Rec"):
                target = f"{prefix}_{name.lower()}"
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, name)),
                                            platform="cpu")
                # Every operand and result leads with the ensemble axis and trajectories are
                # independent, so a sharded ensemble runs the kernel on each shard.
                jax.ffi.register_ffi_target_as_batch_partitionable(target)
        except Exception as e:  # noqa: BLE001 - any failure means: use the XLA replay
            _failed.add(key)
            _warn_once(str(e))
            return None
        _registered[key] = prefix
        return prefix


def _warn_once(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"gradsolve: could not build the compiled kernel ({reason}); using the XLA record "
            "and replay (same results, slower). GRADSOLVE_KERNEL=0 silences this.",
            RuntimeWarning, stacklevel=4,
        )


def _compile(cxx: str, source: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cc"
        src.write_text(source)
        out = Path(tmp) / "kernel.so"
        base = [cxx, *_FLAGS, f"-I{jax.ffi.include_dir()}"]
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
