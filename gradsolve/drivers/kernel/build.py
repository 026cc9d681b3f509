"""Compile generated kernel source with the system C++ compiler and register it with XLA.

One source holds four FFI handlers, each selected by a macro (`gradsolve.drivers.kernel.source`'s
``GS_PART_*``): the replay's forward (``fwd``), its adjoint (``bwd``), the record (``rec``)
and the adjoint with node-time cotangents (``bwdt``, for a replay given ``ts``). The first
three are compiled in parallel, one compiler process per CPU (`_groups`); ``bwdt`` only
when first used. The compiler's time grows with the inlined stages, so for large vector
fields this matters: a 64-state Lorenz-96 kernel took 25 s as one library on two cores and
takes ~11 s now; a 2-state one 3.9 s then, ~3.4 s now.

Shared objects are cached on disk under ``$GRADSOLVE_KERNEL_CACHE`` (default
``~/.cache/gradsolve/kernels``), keyed by a hash of the source, the compiler (its resolved
path and version), the flags, the CPU's feature flags (the code is built with
``-march=native``) and the jax/jaxlib versions. Compiling takes a few seconds once per
vector field (a build still running after 2 s says so on stderr, through the
``"gradsolve"`` logger); a cached kernel loads in milliseconds. The cache keeps the most
recently used kernels within ``$GRADSOLVE_KERNEL_CACHE_MB`` (default 1024) megabytes.

Safety: a shared object in the cache is code this process will run, so the cache is private
to the user: the folder is created ``0700`` (the temp-directory fallback is a per-user folder),
a folder or file not owned by the user or writable by others is refused (a file is deleted
and rebuilt), and a file that does not load (truncated, corrupted) is rebuilt once. Every
failure (no compiler, a failed or timed-out build, an oversized source, an unusable cache)
falls back to the XLA drivers with a warning naming the reason, once per reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
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
_built: dict[str, tuple] = {}  # prefix -> (cxx, source, key, parts built, label)
_warned = cache("kernel warnings")  # reasons already warned about (cleared: warn again)
_compilers = cache("compiler versions")  # compiler path -> its --version line
_log = logging.getLogger("gradsolve")
_NOTICE_AFTER_S = 2.0  # a build still running after this long says so

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
    """The C++ compiler used for kernels (``$CXX``, else ``g++``/``c++``/``clang++``), as a
    resolved path, or None."""
    for cand in (_config.SETTINGS.cxx, "g++", "c++", "clang++"):
        path = shutil.which(cand) if cand else None
        if path:
            return os.path.realpath(path)
    return None


def _compiler_id(cxx: str) -> str:
    """The compiler's path and the first line of its ``--version`` (part of the cache key:
    an upgraded compiler builds new kernels)."""
    if cxx not in _compilers:
        try:
            out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
            _compilers[cxx] = (out.stdout or out.stderr).splitlines()[0] if out.returncode == 0 \
                else "?"
        except (OSError, subprocess.SubprocessError, IndexError):
            _compilers[cxx] = "?"
    return f"{cxx} {_compilers[cxx]}"


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
    """Where compiled kernels are kept, private to this user: ``$GRADSOLVE_KERNEL_CACHE``,
    else ``~/.cache/gradsolve/kernels``, else (not writable) ``gradsolve-kernels-<uid>`` in
    the temp directory. Created ``0700``; raises ``OSError`` when the folder is not owned by
    this user or is writable by others (its kernels could have been planted)."""
    root = _config.SETTINGS.kernel_cache
    if root:
        return _private_dir(Path(root))
    home = Path.home() / ".cache" / "gradsolve" / "kernels"
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.access(home, os.W_OK):
            return _private_dir(home)
    except OSError:
        pass
    return _private_dir(Path(tempfile.gettempdir()) / f"gradsolve-kernels-{os.getuid()}")


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"the kernel cache {path} is not private to this user (owner uid "
                      f"{st.st_uid}, mode {oct(st.st_mode & 0o777)}); set "
                      "$GRADSOLVE_KERNEL_CACHE to a folder of your own")
    return path


def _trusted(path: Path) -> bool:
    """Whether a cached kernel may be loaded: owned by this user, not writable by others."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def load(source: str, label: str = "a vector field") -> str | None:
    """Compile (or fetch from cache) and register ``source``'s ``fwd``, ``bwd`` and ``rec``
    handlers as FFI targets ``{prefix}_fwd`` etc.; returns the target prefix. ``label``
    names the vector field in messages.

    Returns None when no compiler is available, the source is over the size limit or the
    build fails (the caller then uses an XLA driver); warns once per reason.
    """
    cxx = compiler()
    import jaxlib

    key = hashlib.sha256(
        "\0".join([source, _compiler_id(cxx) if cxx else "none", " ".join(_FLAGS),
                   str(_VECTOR_MATH_FLAGS), _cpu_key(), jax.__version__,
                   getattr(jaxlib, "__version__", "?"), str(_groups(_EAGER_PARTS))]).encode()
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
        limit = _config.SETTINGS.kernel_max_source_mb * 1e6
        if len(source) > limit:
            _failed[key] = True
            _warn_once(f"the C++ generated for {label} is {len(source) / 1e6:.1f} MB, over "
                       f"the {limit / 1e6:g} MB limit ($GRADSOLVE_KERNEL_MAX_SOURCE_MB): its "
                       "build would take minutes and gigabytes")
            return None
        prefix = f"gradsolve_{key}"
        try:
            _build_and_register(cxx, source, key, prefix, _EAGER_PARTS, label)
        except Exception as e:  # noqa: BLE001 - any failure means: use the XLA replay
            _failed[key] = True
            _warn_once(str(e))
            return None
        _built[prefix] = (cxx, source, key, set(_EAGER_PARTS), label)
        _registered[key] = prefix
        return prefix


def load_part(prefix: str, part: str) -> bool:
    """Make sure the on-demand ``part`` (``"bwdt"``) of the kernel ``prefix`` (from `load`)
    is built and registered as FFI target ``{prefix}_{part}``; ``False`` (with a warning)
    if that build fails, so the caller differentiates another way."""
    with _lock:
        cxx, source, key, done, label = _built[prefix]
        if part not in done:
            try:
                _build_and_register(cxx, source, key, prefix, (part,), label)
            except Exception as e:  # noqa: BLE001 - any failure: the batched adjoint
                _warn_once(f"its {part} part: {e}", what="differentiate with")
                return False
            done.add(part)
        return True


def _build_and_register(cxx: str, source: str, key: str, prefix: str, parts,
                        label: str = "a vector field") -> None:
    groups = _groups(tuple(parts))
    folder = cache_dir()
    paths = {g: folder / f"gs_{key}_{'-'.join(g)}.so" for g in groups}
    for path in paths.values():
        if path.exists() and not _trusted(path):  # planted or shared: never load it
            path.unlink()
    todo = [g for g in groups if not paths[g].exists()]
    if todo:
        _compile_all(cxx, source, paths, todo, label, folder)
    for g in groups:
        try:
            os.utime(paths[g])  # last use, for the cache's least-recently-used pruning
        except OSError:
            pass
        try:
            lib = ctypes.cdll.LoadLibrary(str(paths[g]))
        except OSError:  # truncated or corrupted: rebuild it once
            paths[g].unlink(missing_ok=True)
            _compile_all(cxx, source, paths, [g], label, folder)
            lib = ctypes.cdll.LoadLibrary(str(paths[g]))
        for part in g:
            target = f"{prefix}_{part}"
            handler = jax.ffi.pycapsule(getattr(lib, _PARTS[part][1]))
            jax.ffi.register_ffi_target(target, handler, platform="cpu")
            # Every operand and result leads with the ensemble axis and trajectories are
            # independent, so a sharded ensemble runs the kernel on each shard.
            jax.ffi.register_ffi_target_as_batch_partitionable(target)


def _compile_all(cxx: str, source: str, paths: dict, todo: list, label: str,
                 folder: Path) -> None:
    """Compile the groups ``todo`` in parallel; a build still running after
    `_NOTICE_AFTER_S` says so (and how long it took) through the ``"gradsolve"`` logger."""
    start = time.perf_counter()
    noticed = threading.Event()

    def notice():
        noticed.set()
        _log.warning("gradsolve: compiling the CPU kernel for %s (first use; cached in %s, "
                     "later runs load it in milliseconds) ...", label, folder)

    timer = threading.Timer(_NOTICE_AFTER_S, notice)
    timer.daemon = True
    timer.start()
    try:
        with ThreadPoolExecutor(max_workers=len(todo)) as ex:
            for fut in [ex.submit(_compile, cxx, source, paths[g], g) for g in todo]:
                fut.result()
    finally:
        timer.cancel()
    if noticed.is_set():
        _log.warning("gradsolve: the CPU kernel for %s was built in %.1f s.", label,
                     time.perf_counter() - start)
    _prune_cache(keep=set(paths.values()))


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


def _warn_once(reason: str, what: str = "run") -> None:
    """Warn that the kernel could not be built, once per distinct reason."""
    if reason in _warned:
        return
    _warned[reason] = True
    warnings.warn(
        f"gradsolve: could not build the compiled kernel ({reason}); the XLA drivers {what} "
        "it instead (same results, slower). GRADSOLVE_KERNEL=0 or "
        "gs.use_compiled_kernel(False) silences this.",
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
        timeout = _config.SETTINGS.kernel_build_timeout
        try:
            res = subprocess.run([*base, *pre, str(src), "-o", str(out), *post],
                                 capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:  # no libmvec (or not glibc): scalar libm
                res = subprocess.run([*base, str(src), "-o", str(out)], capture_output=True,
                                     text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{cxx} took longer than {timeout:g} s "
                               "($GRADSOLVE_KERNEL_BUILD_TIMEOUT)") from None
        if res.returncode != 0:
            raise RuntimeError(f"{cxx} failed: {res.stderr[-2000:]}")
        # Atomic publish: concurrent processes may build the same kernel.
        fd, tmp_target = tempfile.mkstemp(dir=path.parent, suffix=".so")  # mode 0600
        os.close(fd)
        shutil.copyfile(out, tmp_target)
        os.replace(tmp_target, path)
