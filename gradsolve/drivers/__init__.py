"""How a record, a replay or a solve runs: drivers as data (``driver=``).

``gs.record``, ``gs.replay`` and ``gs.solve`` take ``driver=`` (default `Auto`), as
``diffrax.diffeqsolve`` takes ``adjoint=``. Every driver runs the same solver steps over the
same mesh, so all give the same values and gradients (to rounding); ``Solution.route`` is
the name of the one that ran.

- `Kernel` (``"gradsolve-kernel"``): the compiled CPU kernel; explicit solvers.
  `Kernel.prebuild` fills the kernel cache ahead of time (`KernelBuild` says what it did).
- `Lanes` (``"gradsolve-lanes"``): structure-of-arrays XLA replay with a hand-written
  adjoint; explicit solvers with small fields, any backend.
- `Batched` (``"gradsolve-batched"``): vmapped steps, JAX's AD; every solver and field.
- `Diffrax` (``"diffrax-diffeqsolve"``): ``diffrax.diffeqsolve`` (reference and fallback).
- `Pallas` (``"gradsolve-pallas"``): record, replay and adjoint as fused Pallas kernels on a
  TPU; explicit solvers in float32 (``Pallas(interpret=True)``: the same kernels anywhere).
- `Auto`: the first of those that applies.

Example:
    >>> sol = gs.solve(f, 0.0, 10.0, y0, p, driver=gs.drivers.Batched())
    >>> sol.route
    'gradsolve-batched'
"""

from .auto import Auto
from .base import AbstractDriver
from .batched import Batched
from .diffrax import Diffrax
from .kernel import Kernel, KernelBuild
from .lanes import Lanes
from .pallas import Pallas

__all__ = ["AbstractDriver", "Auto", "Kernel", "KernelBuild", "Lanes", "Batched", "Diffrax",
           "Pallas", "by_route"]


def by_route(route: str) -> type[AbstractDriver]:
    """The driver class whose ``name`` is ``route``.

    Args:
        route: a driver's name, as ``Solution.route`` reports it.

    Example:
        >>> gs.drivers.by_route(sol.route).ragged     # True for the compiled kernel
    """
    for driver in (Kernel, Lanes, Batched, Diffrax, Pallas):
        if driver.name == route:
            return driver
    raise ValueError(f"gs.drivers.by_route: no driver is named {route!r}; the drivers are "
                     f"{[d.name for d in (Kernel, Lanes, Batched, Diffrax, Pallas)]}")
