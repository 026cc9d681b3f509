"""The default driver: the fastest one that applies, asked in turn."""

from __future__ import annotations

from typing import ClassVar

from .base import AbstractDriver, refuse
from .batched import Batched
from .kernel import Kernel, kernel_allowed
from .lanes import Lanes


class Auto(AbstractDriver):
    """The default ``driver=``: per call, the first driver that applies.

    Record: `Kernel` (CPU, explicit solvers, a translatable field, a compiler), else
    `Batched`. Replay: `Kernel`, else `Lanes` (explicit solvers with a small field; GPU and
    TPU), else `Batched` (stiff and Diffrax solvers, known-time events, anything else). A solve with a solver
    that has no error estimate runs `gradsolve.drivers.Diffrax` in constant steps.
    `gradsolve.use_compiled_kernel` (or ``GRADSOLVE_KERNEL=0`` at import) takes `Kernel` out
    of the list. ``Solution.route`` names the driver that ran, never ``Auto``.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, p)      # driver=gs.drivers.Auto()
        >>> sol.route                                # on CPU with a compiler
        'gradsolve-kernel'
        >>> gs.drivers.Auto().choose("replay", f, gs.Rodas5P(), y0, p).name
        'gradsolve-batched'
    """

    name: ClassVar[str] = "auto"

    def choose(self, kind: str, f, solver, y0, params, *, events: bool = False) -> AbstractDriver:
        """The driver that runs the ``kind`` (``"record"`` or ``"replay"``) of ``f`` with
        ``solver`` on batched ``y0 (n, d)`` and ``params``; ``events``: with known-time
        events (``jumps=``/``tstops=``), which only `Batched` applies so far."""
        order = (Kernel(), Batched()) if kind == "record" else (Kernel(), Lanes(), Batched())
        for driver in order:
            if isinstance(driver, Kernel) and not kernel_allowed():
                continue
            if reason_for(driver, kind, f, solver, y0, params, events) is None:
                return driver
        return Batched()


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
