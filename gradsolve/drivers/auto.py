"""The default driver: the fastest one that applies, asked in turn."""

from __future__ import annotations

import sys
import warnings
from typing import ClassVar


from .._flat import cache_key
from .._solver.rosenbrock import AbstractRosenbrock
from .._caches import cache
from .._sharding import platform
from .base import AbstractDriver, refuse
from .batched import Batched
from .kernel import Kernel, build, kernel_allowed
from .kernel.driver import kernel_target
from .lanes import Lanes, lane_field
from .pallas import Pallas


ROSENBROCK_ON_KERNEL = True
"""Whether `Auto` runs Rosenbrock methods (`gradsolve.Rodas5P`, `gradsolve.Rosenbrock23`)
on the compiled kernel where it applies. Their values and gradients there equal the XLA
replay's to 1e-10 on one mesh, several times faster (``benchmarks/README.md``). Rodas5P
and Rosenbrock23 run in loop form on any number of states, built in seconds at a few
states and in the background past ``$GRADSOLVE_KERNEL_BACKGROUND_S`` (the XLA drivers run
meanwhile), as explicit fields are. False: `Auto` keeps stiff solvers on the XLA drivers
(``driver=gs.drivers.Kernel()`` still runs them on the kernel)."""


class Auto(AbstractDriver):
    """The default ``driver=``: per call, the first driver that applies.

    Record: `Kernel` (CPU, explicit solvers and Rosenbrock methods, a translatable field,
    a compiler), else `Batched`. Replay: `Kernel`, else
    `Lanes` (explicit solvers with a small field; GPU and TPU), else `Batched` (stiff
    solvers off the CPU and the TPU, Diffrax solvers, anything else); on a TPU `Pallas`
    (fused kernels: explicit solvers, and Rodas5P and Rosenbrock23 up to 8 states; float32,
    known-time events included) comes first in both; known-time events
    (``jumps=``, ``tstops=``) change nothing in that order. A solve with a solver
    that has no error estimate runs `gradsolve.drivers.Diffrax` in constant steps. Where
    the kernel or the lanes replay is passed over because the vector field uses something
    their translator does not handle, a ``RuntimeWarning`` says what, once per field.
    `gradsolve.use_compiled_kernel` (or ``GRADSOLVE_KERNEL=0`` at import) takes `Kernel` out
    of the list. ``Solution.route`` names the driver that ran, never ``Auto``.

    First use: a kernel not yet in the cache is compiled (seconds). Where its build is
    estimated to take longer than ``$GRADSOLVE_KERNEL_BACKGROUND_S`` (default 20 s: about
    1 MB of generated C++, e.g. a neural-network field), ``Auto`` does not wait for it: the
    compiler runs in a background thread, at low priority, and the XLA drivers run until
    it is ready (a log line says so once); work traced after that runs the kernel. A
    ``jax.jit`` function is traced once, so one traced before then keeps the XLA route:
    `Auto.wait_for_kernels` waits for the build, and `Kernel.prebuild` (or ``gradsolve
    build-cache``) builds it ahead of time. Smaller fields (Lotka–Volterra: 6 s on two
    cores, Lorenz-96 with 16 states: 9 s) are built before the first call returns, as an
    explicit ``gs.drivers.Kernel()`` always does: their build costs about what the XLA
    route's compile does (5–12 s there), and a loop traced once then runs 10–15x faster
    (``benchmarks/README.md``, first use).

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, p)      # driver=gs.drivers.Auto()
        >>> sol.route                                # on CPU with a compiler
        'gradsolve-kernel'
        >>> gs.drivers.Auto().choose("replay", f, gs.Rodas5P(), y0, p).name  # stiff too
        'gradsolve-kernel'
        >>> gs.drivers.Auto().explain("replay", f, gs.Rodas5P(), y0, p)
        'gradsolve-kernel: the compiled kernel applies.'
    """

    name: ClassVar[str] = "auto"

    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        """``Auto`` runs nothing itself: `choose` names the driver that does."""
        return "Auto chooses a driver (Auto().choose) and runs none itself."

    def choose(self, kind: str, f, solver, y0, params, *, events: bool = False) -> AbstractDriver:
        """The driver that runs the ``kind`` (``"record"`` or ``"replay"``) of ``f`` with
        ``solver`` on batched ``y0 (n, d)`` and ``params``; ``events``: with known-time
        events (``jumps=``/``tstops=``), which every driver applies but the replay of
        `gradsolve.drivers.Diffrax`."""
        return self._choose(kind, f, solver, y0, params, events)[0]

    def explain(self, kind: str, f, solver, y0, params, *, events: bool = False) -> str:
        """Which driver `choose` takes for this work and why: ``"<route>: <reason>"``,
        the reason naming each faster driver passed over and its own reason (e.g. a
        stiff kernel still compiling in the background, the XLA driver serving meanwhile).

        Example:
            >>> gs.drivers.Auto().explain("replay", f, gs.Rodas5P(), y0, p)
            'gradsolve-kernel: the compiled kernel applies.'
        """
        driver, passed = self._choose(kind, f, solver, y0, params, events)
        why = "; ".join(f"{name} passed over: {reason}" for name, reason in passed)
        return f"{driver.name}: " + (why if why else
                                     f"{_DESCRIPTIONS.get(type(driver), driver.name)} applies.")

    def _choose(self, kind, f, solver, y0, params, events):
        """``(driver, [(name, reason) of the drivers passed over before it])``."""
        order = (Kernel(), Batched()) if kind == "record" else (Kernel(), Lanes(), Batched())
        if platform() == "tpu":  # the fused kernels first, where they apply
            order = (Pallas(),) + order
        untranslated = []  # (driver, what its translator did not handle)
        passed = []
        for driver in order:
            if isinstance(driver, Kernel):
                if not kernel_allowed():
                    passed.append((driver.name, "switched off (gs.use_compiled_kernel)."))
                    continue
                if isinstance(solver, AbstractRosenbrock) and not ROSENBROCK_ON_KERNEL:
                    passed.append((driver.name, "Rosenbrock methods are kept off it "
                                                "(ROSENBROCK_ON_KERNEL)."))
                    continue
                target = kernel_target(f, solver, y0, params, background=True)
                if target.building:
                    passed.append((driver.name, target.reason))
                    continue
            reason = reason_for(driver, kind, f, solver, y0, params, events)
            if reason is None:
                if untranslated:
                    warn_untranslated(f, untranslated, driver)
                return driver, passed
            passed.append((driver.name, reason))
            what = None if events else _untranslated(driver, f, solver, y0, params)
            if what is not None:
                untranslated.append((driver, what))
        return Batched(), passed

    @staticmethod
    def wait_for_kernels(timeout: float | None = None) -> bool:
        """Wait for the kernels compiling in the background (at most ``timeout`` seconds);
        returns whether none is still compiling. Work traced afterwards runs them; a
        function already traced (``jax.jit``) keeps the driver it was traced with.

        Example:
            >>> sol = gs.solve(f, 0.0, 1.0, y0, mlp)  # big field: XLA while the kernel builds
            >>> gs.drivers.Auto.wait_for_kernels()
            True
            >>> gs.solve(f, 0.0, 1.0, y0, mlp).route
            'gradsolve-kernel'
        """
        return build.wait(timeout)


def _untranslated(driver: AbstractDriver, f, solver, y0, params) -> str | None:
    """What the translator of the kernel or the lanes replay did not handle in ``f``, where
    that is why ``driver`` does not apply (not its other rules: backend, solver, size)."""
    if isinstance(driver, Kernel):
        return kernel_target(f, solver, y0, params).untranslated
    if isinstance(driver, Lanes):
        return lane_field(f, solver, y0, params).untranslated
    return None


_DESCRIPTIONS = {Kernel: "the compiled kernel", Lanes: "the lanes replay",
                 Batched: "the batched XLA driver"}
# (vector field, what was not translated) already warned about (cleared: warn again)
_warned = cache("translator warnings")


def warn_untranslated(f, untranslated: list, chosen: AbstractDriver) -> None:
    """Warn (once per vector field and untranslated construct) that ``f`` runs on
    ``chosen``, slower, because ``untranslated`` (``(driver, what)`` pairs) passed over
    faster drivers."""
    code = getattr(f, "__code__", None)
    field = code if code is not None else (f if cache_key(f) is not None else type(f))
    whats = {what for _, what in untranslated}
    if all((field, what) in _warned for what in whats):
        return
    _warned.update({(field, what): True for what in whats})
    by_what: dict[str, list[str]] = {}
    for driver, what in untranslated:
        by_what.setdefault(what, []).append(_DESCRIPTIONS[type(driver)])
    uses = ", and ".join(
        f"{what}, which {' and '.join(names)} {'do' if len(names) > 1 else 'does'} not translate"
        for what, names in by_what.items())
    name = getattr(f, "__qualname__", None) or type(f).__name__
    warnings.warn(
        f"gradsolve: the vector field {name!r} uses {uses}; it runs on "
        f"{_DESCRIPTIONS.get(type(chosen), chosen.name)} (same results, slower). Written "
        "without it, the field runs on the faster driver; pass the driver explicitly "
        f"(driver=gs.drivers.{type(chosen).__name__}()) to silence this warning.",
        RuntimeWarning, stacklevel=_caller_outside())


def _caller_outside() -> int:
    """The ``stacklevel`` (for a ``warnings.warn`` made by this function's caller) of the
    first frame outside gradsolve (and its inference package), JAX, Equinox and NumPyro:
    the user's call, also under ``jit``."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARIES:
        frame, level = frame.f_back, level + 1
    return level


_LIBRARIES = frozenset({"gradsolve", "inference", "jax", "equinox", "jaxtyping", "numpyro"})


def reason_for(driver: AbstractDriver, kind: str, f, solver, y0, params,
               events: bool = False) -> str | None:
    """``driver.record_reason`` or ``driver.replay_reason``, by ``kind``; the ``events``
    keyword is passed only when there are events (drivers written without it still work)."""
    method = driver.record_reason if kind == "record" else driver.replay_reason
    if events:
        return method(f, solver, y0, params, events=True)
    return method(f, solver, y0, params)


def resolve(driver: AbstractDriver | None, kind: str, f, solver, y0, params,
            where: str, events: bool = False) -> AbstractDriver:
    """The concrete driver for a ``kind`` of work: `Auto`'s choice, or ``driver`` itself if
    it applies (else a ``ValueError`` with its reason). ``y0`` and ``params`` batched;
    ``events``: the work has known-time events."""
    driver = Auto() if driver is None else driver
    if not isinstance(driver, AbstractDriver):
        raise ValueError(
            f"{where}: `driver` must be a gradsolve driver (gs.drivers.Auto(), Kernel(), "
            f"Lanes(), Batched(), Diffrax()), got {driver!r}."
        )
    if isinstance(driver, Auto):
        return driver.choose(kind, f, solver, y0, params, events=events)
    reason = reason_for(driver, kind, f, solver, y0, params, events)
    if reason is not None:
        raise refuse(driver, reason, where)
    return driver
