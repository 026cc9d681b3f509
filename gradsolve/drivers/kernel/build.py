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
recently used kernels within ``$GRADSOLVE_KERNEL_CACHE_MB`` (default 1024) megabytes. A
library built with another grouping (another CPU count) is used as it is, so a cache filled
by `gradsolve.drivers.Kernel.prebuild` serves jobs with any number of cores.

Background builds: `start` compiles a kernel whose build is estimated to take longer than
``$GRADSOLVE_KERNEL_BACKGROUND_S`` (`estimated_build_s`) in a daemon thread, at low CPU
priority, and returns at once; only `gradsolve.drivers.Auto` asks for it, and runs the XLA
drivers meanwhile. The thread only runs the compiler: the libraries are loaded and
registered by the next `load` (on the caller's thread), which waits for a build still
running. `wait` waits for them all; a compiler still running when the process exits is
stopped.

Safety: a shared object in the cache is code this process will run, so the cache is private
to the user: the folder is created ``0700`` (the temp-directory fallback is a per-user folder),
a folder or file not owned by the user or writable by others is refused (a file is deleted
and rebuilt), and a file that does not load (truncated, corrupted) is rebuilt once. Every
failure (no compiler, a failed or timed-out build, an oversized source, an unusable cache)
falls back to the XLA drivers with a warning naming the reason, once per reason.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import jax

from ... import _config
from ..._cpus import usable_cpus
from ..._caches import cache

_lock = threading.Lock()
# Registered FFI targets are process state, not a cache: XLA cannot unregister them.
_registered: dict[str, str] = {}  # source hash -> target prefix
_failed = cache("failed kernel builds")  # source hash -> True (cleared: try again)
_built: dict[str, "Built"] = {}  # prefix -> what was built for it
_background: dict[str, "_Background"] = {}  # source hash -> its build in a daemon thread
_children: set = set()  # compiler processes of background builds, stopped at exit
_scratch: set = set()  # their temporary folders, removed at exit
_exiting = threading.Event()  # set at exit: no more compilers start
_spawn_lock = threading.Lock()
_warned = cache("kernel warnings")  # reasons already warned about (cleared: warn again)
_compilers = cache("compiler versions")  # compiler path -> its --version line
_log = logging.getLogger("gradsolve")
_NOTICE_AFTER_S = 2.0  # a build still running after this long says so
_NICE = shutil.which("nice")  # background builds run at low CPU priority

# Part -> (macro selecting it in the source, exported handler symbol).
_PARTS = {"fwd": ("GS_PART_FWD", "Fwd"), "bwd": ("GS_PART_BWD", "Bwd"),
          "bwdt": ("GS_PART_BWDT", "Bwd"), "rec": ("GS_PART_REC", "Rec")}
_EAGER_PARTS = ("fwd", "bwd", "rec")
ALL_PARTS = (*_EAGER_PARTS, "bwdt")


@dataclass
class Built:
    """A registered kernel: its source and compiler (for parts built later), its libraries
    by part, and the compiler time this process spent on it (0 when all came from the
    cache)."""

    cxx: str
    source: str
    key: str
    label: str
    files: dict = field(default_factory=dict)  # part -> Path of its shared library
    compile_s: float = 0.0


@dataclass
class _Background:
    """A build running in a daemon thread; ``error`` is set if it failed, ``seconds`` when
    it finished."""

    label: str
    thread: threading.Thread | None = None
    error: str | None = None
    seconds: float = 0.0


def _groups(parts: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Parts compiled together, one compiler process (and shared library) per group.

    Each process pays ~1 s for the headers, so there are no more groups than CPUs; with
    two, the adjoint (the largest part) is compiled alone.
    """
    cpus = usable_cpus()
    if cpus >= len(parts):
        return [(part,) for part in parts]
    if cpus == 2 and "bwd" in parts:
        return [tuple(p for p in parts if p != "bwd"), ("bwd",)]
    return [tuple(parts)]

_FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno",
          "-fopenmp-simd", "-w", "-pthread"]
# First choice: SIMD libm from glibc's libmvec (see cc/kernel.cc), compiler flags before the
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


def _key(source: str, cxx: str | None) -> str:
    """The cache key of ``source``: a hash of it, the compiler (path and version), the
    flags, the CPU's features and the jax/jaxlib versions."""
    import jaxlib

    return hashlib.sha256(
        "\0".join([source, _compiler_id(cxx) if cxx else "none", " ".join(_FLAGS),
                   str(_VECTOR_MATH_FLAGS), _cpu_key(), jax.__version__,
                   getattr(jaxlib, "__version__", "?")]).encode()
    ).hexdigest()[:24]


def estimated_build_s(source: str) -> float:
    """Seconds the first build of ``source``'s ``fwd``, ``bwd`` and ``rec`` parts is
    expected to take: ``5.5 + 6 m + 8 m**2`` for ``m`` megabytes of C++.

    A least-squares fit to builds on a 2-core x86 machine with g++ 12: Lotka–Volterra
    (0.06 MB) 6 s; Lorenz-96 with d = 16 (0.22 MB) 9 s, d = 64 (0.81 MB) 18 s;
    ``eqx.nn.MLP`` fields 2-8-8-2 (0.46 MB) 5 s, 4-32-4 (1.0 MB) 21 s, 4-16-16-4 (1.7 MB)
    38 s, 4-16-16-16-4 (3.1 MB) 103 s. The compiler's time grows faster than the
    straight-line code it optimises; with more cores the parts build in parallel, faster.
    """
    m = len(source) / 1e6
    return 5.5 + 6.0 * m + 8.0 * m * m


def start(source: str, label: str = "a vector field") -> bool:
    """Compile ``source``'s kernel in a background daemon thread if its build is worth not
    waiting for: not loaded, not in the cache, not failed, within the size limit, and
    `estimated_build_s` above ``$GRADSOLVE_KERNEL_BACKGROUND_S``. Returns whether a
    background build of it is running (`load` would wait for it); ``False``: call `load`
    (it loads from the cache, builds a cheap kernel, or warns why not). The first call
    that starts a build says so through the ``"gradsolve"`` logger."""
    cxx = compiler()
    if cxx is None:
        return False
    key = _key(source, cxx)
    with _lock:
        job = _background.get(key)
        if job is not None:
            return job.thread.is_alive()
        if key in _registered or key in _failed:
            return False
        if len(source) > _config.SETTINGS.kernel_max_source_mb * 1e6:
            return False
        estimate = estimated_build_s(source)
        if estimate <= _config.SETTINGS.kernel_background_s:
            return False
        try:
            folder = cache_dir()
        except OSError:
            return False  # load warns
        todo = _plan(folder, key, _EAGER_PARTS)[1]
        if not todo:
            return False  # in the cache: loads in milliseconds
        job = _Background(label)
        job.thread = threading.Thread(target=_build_in_background,
                                      args=(job, cxx, source, key, folder, todo),
                                      name=f"gradsolve kernel build {key}", daemon=True)
        job.thread.start()
        _background[key] = job  # after start: `load` may join it without the lock
    _log.warning(
        "gradsolve: compiling the CPU kernel for %s in the background (%.1f MB of C++, "
        "about %.0f s; cached in %s). Until it is ready gradsolve runs the XLA drivers, and "
        "functions traced before then keep them (a jax.jit function is traced once). "
        "gs.drivers.Auto.wait_for_kernels() waits for it; gs.drivers.Kernel().prebuild or "
        "`gradsolve build-cache` builds it ahead of time.",
        label, len(source) / 1e6, estimate, folder)
    return True


def _build_in_background(job: _Background, cxx: str, source: str, key: str, folder: Path,
                         todo: list) -> None:
    """A background build's thread: compile ``todo`` into the cache (registering is the
    next `load`'s, on its caller's thread); a failure is kept for that `load` to report."""
    t = time.perf_counter()
    try:
        paths = {g: _path(folder, key, g) for g in todo}
        _compile_all(cxx, source, paths, todo, job.label, folder, background=True)
    except Exception as e:  # noqa: BLE001 - reported (once) by the next load
        job.error = str(e)
        return
    job.seconds = time.perf_counter() - t
    _log.warning("gradsolve: the CPU kernel for %s was built in the background in %.1f s; "
                 "calls traced from now on run it.", job.label, job.seconds)


def wait(timeout: float | None = None) -> bool:
    """Wait for the background builds (`start`), at most ``timeout`` seconds in all;
    returns whether none is still running. Their kernels are loaded by the next call that
    asks for them."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for job in list(_background.values()):
        job.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return not any(job.thread.is_alive() for job in list(_background.values()))


def building() -> list[str]:
    """The labels of the kernels compiling in the background now."""
    return [job.label for job in list(_background.values()) if job.thread.is_alive()]


@atexit.register
def _stop_background_compilers() -> None:
    """A process that exits stops its background compilers, each with the processes it
    started (their daemon threads die with it; the compilers would run on, unowned), and
    removes their temporary folders. Nothing half-built reaches the cache."""
    labels = building()
    with _spawn_lock:
        _exiting.set()  # no compiler starts from now on
    for proc in list(_children):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the compiler's children
        except OSError:
            pass
    for folder in list(_scratch):
        shutil.rmtree(folder, ignore_errors=True)
    for label in labels:
        _log.warning("gradsolve: stopped the background build of the CPU kernel for %s at "
                     "exit; the next process starts it again (gs.drivers.Kernel().prebuild "
                     "or `gradsolve build-cache` builds it ahead of time).", label)


def load(source: str, label: str = "a vector field") -> str | None:
    """Compile (or fetch from cache) and register ``source``'s ``fwd``, ``bwd`` and ``rec``
    handlers as FFI targets ``{prefix}_fwd`` etc.; returns the target prefix. ``label``
    names the vector field in messages. Waits for a background build of it (`start`).

    Returns None when no compiler is available, the source is over the size limit or the
    build fails (the caller then uses an XLA driver); warns once per reason.
    """
    cxx = compiler()
    key = _key(source, cxx)
    job = _background.get(key)
    if job is not None:
        job.thread.join()  # without the lock: other kernels load meanwhile
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
        job = _background.pop(key, None)
        if job is not None and job.error is not None:
            _failed[key] = True
            _warn_once(job.error)
            return None
        prefix = f"gradsolve_{key}"
        try:
            files, seconds = _build_and_register(cxx, source, key, prefix, _EAGER_PARTS, label)
        except Exception as e:  # noqa: BLE001 - any failure means: use the XLA replay
            _failed[key] = True
            _warn_once(str(e))
            return None
        _built[prefix] = Built(cxx, source, key, label, _by_part(files),
                               seconds + (job.seconds if job is not None else 0.0))
        _registered[key] = prefix
        return prefix


def load_part(prefix: str, part: str) -> bool:
    """Make sure the on-demand ``part`` (``"bwdt"``) of the kernel ``prefix`` (from `load`)
    is built and registered as FFI target ``{prefix}_{part}``; ``False`` (with a warning)
    if that build fails, so the caller differentiates another way."""
    with _lock:
        kernel = _built[prefix]
        if part not in kernel.files:
            try:
                files, seconds = _build_and_register(kernel.cxx, kernel.source, kernel.key,
                                                     prefix, (part,), kernel.label)
            except Exception as e:  # noqa: BLE001 - any failure: the batched adjoint
                _warn_once(f"its {part} part: {e}", what="differentiate with")
                return False
            kernel.files.update(_by_part(files))
            kernel.compile_s += seconds
        return True


def built(prefix: str) -> Built:
    """What was built and loaded for the kernel ``prefix`` (from `load`)."""
    return _built[prefix]


def threads(prefix: str, n: int, requested: int = 0) -> int:
    """The threads a call of the kernel ``prefix`` (from `load`) on ``n`` trajectories runs
    on now, with the driver's ``threads`` attribute ``requested`` (``0``: the usable CPUs
    or ``$GRADSOLVE_KERNEL_THREADS``, read as the call reads it): the kernel's own rule,
    asked of its loaded library."""
    lib = ctypes.CDLL(str(_built[prefix].files["fwd"]))  # already loaded: the same handle
    fn = lib.GsThreads
    fn.restype, fn.argtypes = ctypes.c_int64, (ctypes.c_int64, ctypes.c_int32)
    return int(fn(n, requested))


def _by_part(files: dict) -> dict:
    return {part: path for group, path in files.items() for part in group}


def _path(folder: Path, key: str, group: tuple[str, ...]) -> Path:
    return folder / f"gs_{key}_{'-'.join(group)}.so"


def _plan(folder: Path, key: str, parts) -> tuple[dict, list]:
    """The libraries of the kernel ``key`` that hold ``parts``: ``(have, todo)``. ``have``:
    the groups already in the cache and their files, whichever grouping (CPU count) built
    them; ``todo``: this machine's grouping (`_groups`) of the parts none of them holds. A
    cached file not owned by this user or writable by others is deleted (planted or
    shared: never loaded)."""
    wanted, found = set(parts), {}
    stem = f"gs_{key}_"
    for path in folder.glob(f"{stem}*.so"):
        group = tuple(path.name[len(stem):-len(".so")].split("-"))
        if not set(group) <= wanted:
            continue
        if not _trusted(path):
            path.unlink(missing_ok=True)
            continue
        found[group] = path
    have, left = {}, set(wanted)
    for group in sorted(found, key=len, reverse=True):
        if set(group) <= left:
            have[group] = found[group]
            left -= set(group)
    todo = _groups(tuple(p for p in parts if p in left)) if left else []
    return have, todo


def _build_and_register(cxx: str, source: str, key: str, prefix: str, parts,
                        label: str = "a vector field") -> tuple[dict, float]:
    """Load ``parts`` of the kernel ``key`` from the cache, compiling those it lacks, and
    register them; returns ``({group: library}, compiler seconds)``."""
    folder = cache_dir()
    have, todo = _plan(folder, key, parts)
    seconds = 0.0
    if todo:
        t = time.perf_counter()
        paths = {g: _path(folder, key, g) for g in todo}
        _compile_all(cxx, source, paths, todo, label, folder, keep=set(have.values()))
        have.update(paths)
        seconds = time.perf_counter() - t
    for g, path in have.items():
        try:
            os.utime(path)  # last use, for the cache's least-recently-used pruning
        except OSError:
            pass
        try:
            lib = ctypes.cdll.LoadLibrary(str(path))
        except OSError:  # truncated or corrupted: rebuild it once
            path.unlink(missing_ok=True)
            t = time.perf_counter()
            _compile_all(cxx, source, {g: path}, [g], label, folder, keep=set(have.values()))
            seconds += time.perf_counter() - t
            lib = ctypes.cdll.LoadLibrary(str(path))
        for part in g:
            target = f"{prefix}_{part}"
            handler = jax.ffi.pycapsule(getattr(lib, _PARTS[part][1]))
            jax.ffi.register_ffi_target(target, handler, platform="cpu")
            # Every operand and result leads with the ensemble axis and trajectories are
            # independent, so a sharded ensemble runs the kernel on each shard.
            jax.ffi.register_ffi_target_as_batch_partitionable(target)
    return have, seconds


def _compile_all(cxx: str, source: str, paths: dict, todo: list, label: str,
                 folder: Path, keep: set = frozenset(), background: bool = False) -> None:
    """Compile the groups ``todo`` in parallel; a build still running after
    `_NOTICE_AFTER_S` says so (and how long it took) through the ``"gradsolve"`` logger,
    unless it runs in the ``background`` (`start` said so). Then prunes the cache,
    keeping ``paths`` and ``keep``."""
    start_t = time.perf_counter()
    noticed = threading.Event()

    def notice():
        noticed.set()
        _log.warning("gradsolve: compiling the CPU kernel for %s (first use; cached in %s, "
                     "later runs load it in milliseconds) ...", label, folder)

    timer = threading.Timer(_NOTICE_AFTER_S, notice)
    timer.daemon = True
    if not background:
        timer.start()
    try:
        _parallel([lambda g=g: _compile(cxx, source, paths[g], g, background) for g in todo])
    finally:
        timer.cancel()
    if noticed.is_set():
        _log.warning("gradsolve: the CPU kernel for %s was built in %.1f s.", label,
                     time.perf_counter() - start_t)
    _prune_cache(keep=set(paths.values()) | set(keep))


def _parallel(calls: list) -> None:
    """Run ``calls`` at once, each in a daemon thread (an exiting process does not wait for
    them: `_stop_background_compilers`), and raise the first one's exception."""
    errors: list = [None] * len(calls)

    def run(i):
        try:
            calls[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised below, on the caller's thread
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e


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


def _compile(cxx: str, source: str, path: Path, parts: tuple[str, ...],
             background: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if background:
            _scratch.add(tmp)
        src = Path(tmp) / "kernel.cc"
        src.write_text(source)
        out = Path(tmp) / "kernel.so"
        macros = [f"-D{_PARTS[part][0]}" for part in parts]
        base = [cxx, *_FLAGS, *macros, f"-I{jax.ffi.include_dir()}"]
        pre, post = _VECTOR_MATH_FLAGS
        timeout = _config.SETTINGS.kernel_build_timeout
        try:
            res = _run([*base, *pre, str(src), "-o", str(out), *post], timeout, background)
            if res.returncode > 0:  # no libmvec (or not glibc): scalar libm
                res = _run([*base, str(src), "-o", str(out)], timeout, background)
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
    _scratch.discard(tmp)


def _run(cmd: list[str], timeout: float, background: bool) -> subprocess.CompletedProcess:
    """Run a compiler command (``TimeoutExpired`` after ``timeout`` s, the process killed);
    in the ``background`` at low priority (``nice``), in a session of its own, and known to
    the exit handler."""
    if background and _NICE:
        cmd = [_NICE, "-n", "10", *cmd]
    with _spawn_lock:  # the exit handler sees every background compiler it must stop
        if _exiting.is_set():
            raise RuntimeError("the process is exiting")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=background)
        if background:
            _children.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if background:
            os.killpg(proc.pid, signal.SIGKILL)  # with the compiler's children
        else:
            proc.kill()
        proc.communicate()
        raise
    finally:
        _children.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
