"""The `Kernel` driver: where the compiled kernel applies, and its record and replay as
JAX functions (``jax.ffi`` calls of the generated handlers).

``kernel_record`` returns the `gradsolve.Mesh` fields the record handler computes (lanes run
independent trajectories, one step attempt per lane per iteration, refilled as trajectories
finish; the controller is `gradsolve._controller`'s, written per lane). ``kernel_replay``
returns the same `gradsolve.drivers.base.ReplayOutput` as the batched driver. The replay's
differentiation is `gradsolve.drivers._adjoint.adjoint_replay`'s: ``grad`` runs the compiled
adjoint, forward mode and second derivatives the batched driver.
"""

from __future__ import annotations

import time
import warnings
from functools import partial
from pathlib import Path
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._adjoint import adjoint_replay
from ..._caches import cache
from ..._checks import batch, check_vector_field, split_static
from ..._flat import cache_key, flat_field, flat_params, flatten_spec, per_trajectory
from ..._config import kernel_enabled
from ..._cpus import usable_cpus
from ..._sharding import platform
from ..._events import empty_events
from ..._mesh import Mesh
from ..._solver import Tsit5
from ..._solver.base import AbstractExplicitRK
from ..._solver.rosenbrock import AbstractRosenbrock
from ..._solver.diffrax_adapter import as_solver
from ..base import AbstractDriver, ReplayLayout, ReplayNodes, ReplayOutput
from . import build, lowering
from .codegen import Unsupported
from .rosenbrock_source import StepUnsupported, loop_kind
from .source import generate

# (f, solver type, shapes, dtypes) -> FFI target prefix, or the reason there is none
_sources = cache("kernel sources")
# the same key -> (source, label) of a kernel compiling in the background
_building_sources = cache("kernel sources building")


class Target(NamedTuple):
    """The FFI target prefix of a compiled kernel, or ``None`` and the reason why not;
    ``untranslated``: what the translator did not handle, where that is the reason;
    ``building``: the kernel is compiling in the background (asked with
    ``background=True``), so not ready yet."""

    prefix: str | None
    reason: str | None
    untranslated: str | None = None
    building: bool = False


BUILDING_REASON = ("its kernel is compiling in the background (gs.drivers.Auto."
                   "wait_for_kernels() waits for it).")


def _prefix_for(f, solver, d: int, treedef, shapes, dtypes, dtype,
                background: bool = False) -> Target:
    key = cache_key(f, type(solver), d, treedef, shapes, tuple(map(str, dtypes)), str(dtype))
    found = _sources.get(key) if key is not None else None
    if found is not None and not found.building:
        return found
    pending = _building_sources.get(key) if found is not None else None
    if pending is not None:
        source, label = pending
    else:
        f_flat, p_size = flat_field(f, treedef, shapes, dtypes)
        try:
            source = generate(f_flat, d, p_size, dtype, solver)
        except StepUnsupported as e:
            return _remember(key, Target(None, f"the translator to C++ does not handle {e}."))
        except Unsupported as e:
            return _remember(key, Target(
                None, f"the translator to C++ does not handle this vector field ({e}).", str(e)))
        variant_key = (type(solver), d, treedef, shapes, tuple(map(str, dtypes)), str(dtype))
        if _too_many_variants(f, variant_key, source):
            return _remember(key, Target(
                None, f"{_MAX_VARIANTS} kernels were already compiled for this vector "
                      "field's code with other closed-over values."))
        label = repr(getattr(f, "__qualname__", type(f).__name__))
    if background and build.start(source, label):
        if key is not None:
            _building_sources[key] = (source, label)
        return _remember(key, Target(None, BUILDING_REASON, building=True))
    prefix = build.load(source, label)  # waits for a background build of it
    if key is not None:
        _building_sources.pop(key, None)
    return _remember(key, Target(prefix, None if prefix else
                                 "the kernel could not be built (no working C++ compiler; "
                                 "see the warning)."))


def _remember(key, found: Target) -> Target:
    if key is not None:
        _sources[key] = found
    return found


# Distinct kernel sources generated per vector-field code object in this process. Values a
# vector field closes over are compiled into its kernel as constants, so
# ``gs.solve(lambda t, y, p: -k * y, ...)`` in a loop over ``k`` would compile a new kernel
# (seconds) for every ``k``; past `_MAX_VARIANTS` such variants new ones use the XLA drivers.
_variants = cache("kernel variants")
_WIDE_ROWS_MAX_BYTES = 1 << 30
"""Largest buffer of stored rows (per kernel call) that also carries each node's time: past
it the rows hold the states alone, so a long mesh's replay gradient keeps the memory of
its states (``n x (S + 1) x d``), not a third to a half more. The buffer is sized by the
mesh capacity but only the rows of steps taken are touched, so a ``gs.solve`` at 4,096
slots (10,000 trajectories: ~1 GB reserved, ~25 MB touched) keeps the faster rows."""

_MAX_VARIANTS = 4

ROSENBROCK_MAX_STATES = 10
"""Most states a Rosenbrock method with a ``step`` of its own (neither the tableau form of
`gradsolve.AbstractRosenbrock`, e.g. `gradsolve.Rodas5P`, nor `gradsolve.Rosenbrock23`)
runs with on the kernel. Such a step is translated whole, its dense LU and stage solves
unrolled, so its C++ grows with ``d**3`` and its build faster still (47 s at 8 states, 2
minutes at 10 on a loaded 2-core machine). Rodas5P and Rosenbrock23 run in loop form
(`gradsolve.drivers.kernel.rosenbrock_source.LoopRosenbrockSource`) on any number of
states: their build grows with the Jacobian's nonzeros (``benchmarks/README.md``)."""


def _too_many_variants(f, variant_key, source: str) -> bool:
    """Whether ``f``'s code already compiled `_MAX_VARIANTS` other kernels for the same
    solver and shapes (so the sources differ only by closed-over values)."""
    code = getattr(f, "__code__", None)
    if code is None:
        return False
    # a wrapper (a dosed field) shares its code with every other model's: the codes of
    # what it wraps tell them apart
    codes, inner = [code], getattr(f, "__wrapped__", None)
    while inner is not None and len(codes) < 8:
        codes.append(getattr(inner, "__code__", None))
        inner = getattr(inner, "__wrapped__", None)
    seen = _variants.setdefault((tuple(codes), variant_key), set())
    digest = hash(source)
    if digest in seen:
        return False
    if len(seen) >= _MAX_VARIANTS:
        if len(seen) == _MAX_VARIANTS:
            seen.add(None)  # warn once per code object
            warnings.warn(
                f"gradsolve: the vector field {getattr(f, '__qualname__', f)!r} closes over "
                f"values that change between calls; each new value compiles a new CPU kernel "
                f"(seconds), so after {_MAX_VARIANTS} of them it runs on an XLA driver "
                "(same results, slower). Pass such values through `params` to reuse one "
                "compiled kernel.", RuntimeWarning, stacklevel=6)
        return True
    seen.add(digest)
    return False


def call_threads(threads: int) -> np.int32:
    """The ``threads`` attribute of a kernel call: ``threads`` where given; inside a caller's
    ``shard_map`` (e.g. a sampler's chains split over CPU devices, each device a thread of
    its own) the CPUs this process may use shared among those devices, so the calls do not
    start more threads than there are cores; otherwise ``0`` (the kernel decides)."""
    if threads:
        return np.int32(threads)
    am = jax.sharding.get_abstract_mesh()
    if not am.manual_axes:
        return np.int32(0)
    k = int(np.prod([am.shape[a] for a in am.manual_axes]))
    return np.int32(max(1, usable_cpus() // k))


SPREAD_MIN = 64
"""Trajectories each device must get before a call in one process is split over the
devices. The kernel's own threads already use every core; below this the split's transfers
and synchronisation cost more than they save (theophylline's 48 trajectories under
NumPyro's vectorised chains, 2 CPU devices: one gradient 1.64 ms split against 0.35 ms on
one device, and NUTS 3x slower)."""


def spread(make_call, n: int):
    """``make_call(n_local)`` (an FFI call on ``n_local`` trajectories) run on every device's
    share of the ensemble axis (``shard_map`` over `gradsolve.ensemble_sharding`'s mesh), so
    a sharded ensemble stays where it lives and every device works; with one device, ``n``
    not divisible by the device count, or (in one process) fewer than `SPREAD_MIN`
    trajectories a device, the plain call."""
    devices = jax.devices()
    small = jax.process_count() == 1 and n // max(1, len(devices)) < SPREAD_MIN
    if (len(devices) <= 1 or n % len(devices) or small
            or jax.sharding.get_abstract_mesh().manual_axes):
        # inside a caller's shard_map (e.g. chains split over devices) the call is local
        return make_call(n)
    from jax.sharding import PartitionSpec

    from ..._sharding import ensemble_sharding

    mesh = ensemble_sharding().mesh
    return jax.shard_map(make_call(n // len(devices)), mesh=mesh,
                         in_specs=PartitionSpec("ensemble"), out_specs=PartitionSpec("ensemble"),
                         check_vma=False)


def kernel_target(f, solver, y0, params, background: bool = False) -> Target:
    """The compiled kernel for this problem (``Target.prefix``), or why it does not apply
    (not on CPU, neither an explicit Runge–Kutta solver nor a Rosenbrock method (one with
    a ``step`` of its own on at most `ROSENBROCK_MAX_STATES` states), non-float inputs, a
    vector field the translator does not handle, no compiler). Works on abstract values (under ``jit``).

    Builds the kernel if needed, waiting for it; with ``background=True`` a build
    estimated to take longer than ``$GRADSOLVE_KERNEL_BACKGROUND_S`` runs in a daemon
    thread instead, and until it is done the answer is ``Target(building=True)``
    (`gradsolve.drivers.kernel.build.start`)."""
    if platform() != "cpu":
        return Target(None, f"it runs on CPU only (the default device's platform is "
                            f"{platform()}).")
    if not isinstance(solver, (AbstractExplicitRK, AbstractRosenbrock)):
        return Target(None, f"it runs explicit Runge–Kutta solvers (gs.Tsit5, gs.Dopri5, "
                            f"gs.Vern7) and Rosenbrock methods (gs.Rodas5P, "
                            f"gs.Rosenbrock23), not {type(solver).__name__}.")
    dtype = jnp.result_type(y0)
    if dtype not in (jnp.float64, jnp.float32) or jnp.ndim(y0) != 2:
        return Target(None, f"it runs float32 and float64 states, not {dtype}.")
    d = jnp.shape(y0)[1]
    if (isinstance(solver, AbstractRosenbrock) and loop_kind(solver) is None
            and d > ROSENBROCK_MAX_STATES):
        return Target(None, f"it runs a Rosenbrock method with a step of its own "
                            f"({type(solver).__name__}) on up to {ROSENBROCK_MAX_STATES} "
                            f"states (that step is translated whole, its LU factorisation "
                            f"unrolled into straight-line code), not {d}.")
    leaves, treedef, shapes, dtypes = flatten_spec(params)
    if any(not jnp.issubdtype(dt, jnp.floating) for dt in dtypes):
        return Target(None, "every params leaf must be floating point for it.")
    return _prefix_for(f, solver, jnp.shape(y0)[1], treedef, shapes, dtypes, dtype,
                       background)


def kernel_replay(prefix: str, f, solver, nodes: ReplayNodes, y0, params, rtol, atol,
                  moved: bool, layout: ReplayLayout, threads: int = 0) -> ReplayOutput:
    """The compiled replay of ``nodes`` through the kernel ``prefix`` (`kernel_target`).

    Save slot ``m`` with ``nodes.subst[:, m]`` moves node ``save_index[:, m]`` to
    ``tsave[:, m]`` inside the kernel, which keeps every differentiable input and cotangent
    at ``(n, k)``, not ``(n, S+1)``. Where those save times carry a derivative, reverse
    mode takes the adjoint with node-time cotangents (``bwdt``), built on first use
    (`gradsolve.drivers.kernel.build.load_part`); otherwise the plain one.

    Known-time events (``nodes.events``): the kernel adds each jump after the step into its
    node and recomputes the carried stage after jump and tstop nodes, as the record does;
    its adjoint returns the jump sizes' cotangents. It also places a jump's node and free
    landing node at the jump's time, so no ``(n, S+1)`` node array is formed here. Where
    jump times or save times carry a derivative, reverse mode is the batched driver's
    (same values; the kernel computes no node-time cotangents of moved jump nodes).
    """
    lowering.install()
    dtype = jnp.result_type(y0)
    n, d = y0.shape
    k = nodes.save_index.shape[1]
    s1 = nodes.times.shape[1]
    p_size = int(sum(int(np.prod(s)) for s in flatten_spec(params)[2]))
    has_events = nodes.events is not None
    J = nodes.events.jump_index.shape[1] if has_events else 0
    i32 = jnp.int32

    def event_args(ev):
        """``(jump nodes, sizes, tstop nodes, landing nodes, jump times)``, zero-width
        without events. The kernel places the jump and landing nodes at the jump times."""
        if ev is None:
            none_i, none_r = jnp.zeros((n, 0), i32), jnp.zeros((n, 0), dtype)
            return none_i, jnp.zeros((n, 0, d), dtype), none_i, none_i, none_r
        # reset_index is (jump nodes, tstop nodes); the kernel finds jump nodes itself.
        return (ev.jump_index.astype(i32), ev.jump_sizes.astype(dtype),
                ev.reset_index[:, J:].astype(i32), ev.land_index.astype(i32),
                ev.jump_times.astype(dtype))

    def row_width(m):
        # A stored row holds the node's state and its time (one stream for the reverse
        # sweep: ~12 % faster at d = 2), unless that makes the buffer much larger than the
        # states alone where it is large.
        wide = m * s1 * (d + 1) * jnp.dtype(dtype).itemsize
        return d + 1 if wide <= _WIDE_ROWS_MAX_BYTES else d

    attrs = dict(threads=call_threads(threads))
    fwd_ffi = spread(lambda m: partial(jax.ffi.ffi_call(
        f"{prefix}_fwd",
        (jax.ShapeDtypeStruct((m, k, d), dtype), jax.ShapeDtypeStruct((m, d), dtype),
         jax.ShapeDtypeStruct((m,), dtype), jax.ShapeDtypeStruct((m, s1, row_width(m)), dtype),
         jax.ShapeDtypeStruct((m,), i32), jax.ShapeDtypeStruct((m,), i32)),
        vmap_method="broadcast_all",
    ), **attrs), n)

    def fwd_call(times, n_eff, y, pf, save, tol, tm, subst, ev=None):
        jidx, jsz, tidx, land, jt = event_args(ev)
        ys, y1, err, states, rows, cost = fwd_ffi(times, n_eff, y, pf, save, tol, tm, subst,
                                                  jidx, jsz, land, jt, tidx)
        # The stored states (and node times) are packed by step count; `rows` locates each
        # trajectory's.
        return ys, y1, err, (states, rows), cost

    part = lambda with_times: "bwdt" if with_times else "bwd"

    def bwd_call(times, n_eff, pf, save, states, ct_ys, ct_y1, tm, subst, with_times, ev=None):
        jidx, jsz, _, land, jt = event_args(ev)
        ct_tm, ct_y0, ct_pf, ct_js = spread(lambda m: partial(jax.ffi.ffi_call(
            f"{prefix}_{part(with_times)}",
            (jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((m, d), dtype),
             jax.ShapeDtypeStruct((m, p_size), dtype), jax.ShapeDtypeStruct((m, J, d), dtype)),
            vmap_method="broadcast_all",
        ), **attrs), n)(times, n_eff, pf, save, *states, ct_ys, ct_y1, tm, subst, jidx, jsz, land, jt)
        if ev is None:
            return ct_tm, ct_y0, ct_pf
        # Padded jumps (node 0) are inert: no cotangent. Jump times carry none here (with
        # a live one the batched adjoint runs instead, `before_bwd`).
        ct_js = jnp.where((ev.jump_index > 0)[..., None], ct_js, 0.0)
        return ct_tm, ct_y0, ct_pf, jnp.zeros(ev.jump_times.shape, dtype), ct_js

    def before_bwd(with_times):
        return not (with_times and has_events) and build.load_part(prefix, part(with_times))

    return adjoint_replay(fwd_call, bwd_call, f, solver, nodes, y0, params, rtol, atol, layout,
                          moved, before_bwd=before_bwd)


def kernel_record(prefix: str, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                  max_steps: int, fill: bool = True, events=None, threads: int = 0) -> dict:
    """Record on batched inputs ``y0 (n, d)``, ``ts (n, k)`` through the kernel ``prefix``;
    returns the `gradsolve.Mesh` fields it computes.

    ``fill=False`` leaves mesh slots past each trajectory's ``n_steps`` unwritten (see
    `gradsolve.Mesh`), so the cost follows the steps taken, not ``max_steps``. ``events``:
    ``None`` or the validated `gradsolve._events.Events`, forced nodes and jumps under the
    XLA record's rules (`gradsolve.drivers.batched.record_loop`): the same nodes, to the
    last-bit differences of libm against XLA in the error estimates."""
    lowering.install()
    n, d = y0.shape
    k = ts.shape[1]
    dtype = y0.dtype
    ev = events if events is not None else empty_events(n, d, dtype)
    J, L = ev.jump_times.shape[1], ev.tstops.shape[1]
    leaves = flatten_spec(params)[0]
    pflat = flat_params(leaves, n, dtype)
    t01 = per_trajectory((t0, t1), n, dtype)
    tol = per_trajectory((rtol, atol), n, dtype)
    dt0 = per_trajectory((jnp.nan if dt0 is None else dt0,), n, dtype)[:, 0]  # NaN: pick h0
    ctrl = per_trajectory((controller.pcoeff, controller.icoeff, controller.safety,
                           controller.factormin, controller.factormax), n, dtype)
    i32 = jnp.int32
    call = spread(lambda m: partial(jax.ffi.ffi_call(
        f"{prefix}_rec",
        (jax.ShapeDtypeStruct((m, max_steps + 1), dtype), jax.ShapeDtypeStruct((m,), i32),
         jax.ShapeDtypeStruct((m,), i32), jax.ShapeDtypeStruct((m,), i32),
         jax.ShapeDtypeStruct((m, k), i32), jax.ShapeDtypeStruct((m,), dtype),
         jax.ShapeDtypeStruct((m, d), dtype), jax.ShapeDtypeStruct((m, J), i32),
         jax.ShapeDtypeStruct((m, L), i32)),
        vmap_method="broadcast_all",
    ), fill=bool(fill), threads=call_threads(threads)), n)
    sg = jax.lax.stop_gradient
    times, n_steps, n_rej, status, save_index, dt_next, y_last, jump_index, tstop_index = call(
        t01, y0, pflat, ts.astype(dtype), tol, dt0, ctrl, sg(ev.jump_times).astype(dtype),
        sg(ev.jump_sizes).astype(dtype), sg(ev.tstops).astype(dtype))
    return dict(times=times, n_steps=n_steps, n_rejected=n_rej, status=status,
                save_index=save_index, dt_next=dt_next, y_last=y_last, jump_times=ev.jump_times,
                jump_sizes=ev.jump_sizes, jump_index=jump_index, tstops=ev.tstops,
                tstop_index=tstop_index)


class KernelBuild(NamedTuple):
    """What `Kernel.prebuild` built.

    Attributes:
        folder: the kernel cache it is in (``$GRADSOLVE_KERNEL_CACHE``).
        files: its shared libraries there (``fwd``, ``bwd``, ``rec`` and ``bwdt``, in as
            many files as this machine's CPU count groups them).
        seconds: the wall time of the call (the source's translation, the compiler, the
            loading).
        compile_s: the compiler time this process spent on the kernel; ``0.0`` when every
            library came from the cache.
        source_mb: the size of the generated C++, in MB.

    Example:
        >>> info = gs.drivers.Kernel().prebuild(f, y0, params)
        >>> print(f"{info.source_mb:.2f} MB, {info.compile_s:.1f} s -> {info.folder}")
    """

    folder: Path
    files: tuple[Path, ...]
    seconds: float
    compile_s: float
    source_mb: float


class Kernel(AbstractDriver):
    """The compiled CPU kernel: record, replay and the replay's discrete adjoint in C++.

    Applies on CPU to explicit Runge–Kutta solvers (`gradsolve.Tsit5`, `gradsolve.Dopri5`,
    `gradsolve.Vern7`) and to Rosenbrock methods (`gradsolve.Rodas5P`,
    `gradsolve.Rosenbrock23` on any number of states whose Jacobian's column groups the
    translator takes: not, e.g., a 504-state PEtab model with 145 groups; another
    `gradsolve.AbstractRosenbrock` with a ``step`` of its own on at most
    `ROSENBROCK_MAX_STATES`), with float32/float64 states and a vector field the
    translator handles (no ``while`` loops; see `gradsolve._jaxpr`), where a C++ compiler
    is found. Several times faster than the XLA drivers (``benchmarks/README.md``;
    ``benchmarks/bench_kernel_rosenbrock.py`` for the stiff solvers). ``grad`` runs the
    compiled adjoint; forward mode and second derivatives are the batched driver's.
    ``Solution.route == "gradsolve-kernel"``.

    A Rosenbrock step (Rodas5P's tableau form, Rosenbrock23) runs in loop form: the
    model's ``f``, Jacobian nonzeros and their VJPs generated, the stages, ``W``'s
    factorisation and solves and the step's exact discrete adjoint fixed C++
    (`gradsolve.drivers.kernel.rosenbrock_source.LoopRosenbrockSource`): the XLA replay's
    arithmetic, so the two agree to rounding. A step whose ``W`` cannot be factored (a
    zero pivot) gives that trajectory NaN values and an infinite ``error_ratio`` (the
    record rejects such a step and shrinks it). Another Rosenbrock method's ``step`` is
    translated whole, with its VJP.

    Known-time events (``jumps=``, ``tstops=``) run in C++ too: the record lands their
    forced nodes, the replay applies them, its adjoint gives the jump sizes' gradients
    (jump times, which move nodes, are differentiated through the batched driver's adjoint).

    An explicit ``Kernel()`` builds its kernel before the first call returns (seconds on
    first use, then cached on disk); `Kernel.prebuild` builds it ahead of time.

    Args:
        threads: the most threads one call runs on. A thread runs 8 trajectories (lanes)
            at a time; a Rosenbrock kernel starts a thread for every 8 trajectories of a
            call (the conditions of a PEtab problem, a multi-start's points), an explicit
            one for every 128 (its steps are cheap next to a thread's start), and a call of
            at most 8 runs on one. Values and gradients do not depend on the count.
            ``None`` (default): the CPUs this process may use (its affinity mask), or
            ``$GRADSOLVE_KERNEL_THREADS`` where that is set (read at every call). A number
            is compiled into the calls, so it holds wherever the program runs.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, p, driver=gs.drivers.Kernel())
        >>> sol = gs.solve(f, 0.0, 10.0, y0, p, driver=gs.drivers.Kernel(threads=1))
    """

    threads: int | None = None
    name: ClassVar[str] = "gradsolve-kernel"
    ragged: ClassVar[bool] = True  # each lane takes its trajectory's own steps

    def __check_init__(self):
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer))
                              or t < 1):
            raise ValueError(f"gs.drivers.Kernel: `threads` must be a positive integer or "
                             f"None; got {t!r}.")

    def prebuild(self, f, y0, params, *, solver=None) -> KernelBuild:
        """Build every variant of the kernel for ``f`` into the cache now: the replay, its
        adjoint, the record and the adjoint with save-time cotangents (``fwd``, ``bwd``,
        ``rec``, ``bwdt``), so that later processes load it in milliseconds.

        The kernel depends on the vector field's code and closed-over constants, the
        solver, the state size ``d``, the shapes and dtype of one trajectory's parameters
        and the dtype (float64 under ``gs.enable_x64()``), not on the ensemble size or the
        time span; and the cache key includes the compiler, the CPU's features (it is built
        with ``-march=native``) and the jax version. So prebuild on the kind of machine the
        job runs on, with the same dtype, e.g. as a cluster job's first step with
        ``$GRADSOLVE_KERNEL_CACHE`` on a shared file system (one folder of your own: the
        cache refuses folders others can write). A library built with another CPU count is
        used as it is. The console command ``gradsolve build-cache module:attr`` does the
        same.

        Args:
            f: the vector field, as in `gradsolve.solve`.
            y0: ``(d,)`` or ``(n, d)``, and
            params: as in `gradsolve.solve` (shapes and dtype are what matter).
            solver: an explicit Runge–Kutta solver (default `gradsolve.Tsit5`) or a
                Rosenbrock method (`gradsolve.Rodas5P`, ...).

        Returns:
            A `KernelBuild` (where, which files, how long).

        Raises:
            ValueError: where the kernel does not apply or could not be built, with the
                reason.

        Example:
            >>> info = gs.drivers.Kernel().prebuild(f, y0, params)
            >>> info.folder, info.seconds, info.compile_s
        """
        where = "gs.drivers.Kernel().prebuild"
        t = time.perf_counter()
        solver = as_solver(Tsit5() if solver is None else solver, where)
        if callable(f):
            f, params = split_static(f, params)
        b = batch(0.0, 1.0, y0, params, None, where)
        check_vector_field(f, 0.0, b.y0, b.params, where)
        target = kernel_target(f, solver, b.y0, b.params)
        if target.prefix is None or not build.load_part(target.prefix, "bwdt"):
            reason = target.reason or "its bwdt part could not be built (see the warning)."
            raise ValueError(f"{where}: the compiled kernel does not apply here: {reason}")
        prefix = target.prefix
        kernel = build.built(prefix)
        files = tuple(sorted(set(kernel.files.values())))
        return KernelBuild(build.cache_dir(), files, time.perf_counter() - t, kernel.compile_s,
                           len(kernel.source) / 1e6)

    def record_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return kernel_target(f, solver, y0, params).reason

    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return kernel_target(f, solver, y0, params).reason

    def record(self, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
               max_steps: int, fill: bool, events=None) -> Mesh:
        prefix = kernel_target(f, solver, y0, params).prefix
        out = kernel_record(prefix, f, solver, controller, t0, t1, y0, params, ts, rtol, atol,
                            dt0, max_steps, fill, events, threads=self.threads or 0)
        return Mesh(**out, ts=ts, t0=t0, t1=t1, y0=y0, params=params, solver=solver, rtol=rtol,
                    atol=atol, controller=controller)

    def replay(self, f, solver, nodes, y0, params, rtol, atol, *, moved, layout):
        prefix = kernel_target(f, solver, y0, params).prefix
        return kernel_replay(prefix, f, solver, nodes, y0, params, rtol, atol, moved, layout,
                             threads=self.threads or 0)


def kernel_allowed() -> bool:
    """Whether `gradsolve.drivers.Auto` may pick the kernel (`gradsolve.use_compiled_kernel`)."""
    return kernel_enabled()
