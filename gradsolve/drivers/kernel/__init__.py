"""The compiled CPU kernel: the vector field translated to C++, run through ``jax.ffi``.

The record (lanes refilled as trajectories finish), the replay and its exact discrete
adjoint share one generated source per vector field, solver and dtype
(`gradsolve.drivers.kernel.source`), compiled once with the system compiler and cached on
disk (`gradsolve.drivers.kernel.build`). Layout: ``codegen`` (the C++ backend of the
shared jaxpr translator), ``source`` (the kernel's C++), ``build`` (compile, cache,
register), ``ffi_record`` and ``ffi_replay`` (the calls as JAX functions).
"""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp

from ..._config import kernel_enabled
from ..._events import empty_events
from ..._mesh import Mesh
from ..base import AbstractDriver
from .ffi_record import kernel_record
from .ffi_replay import kernel_replay, kernel_target


EVENTS_REASON = (
    "the compiled kernel does not apply known-time events yet (jumps= or tstops=: its C++ "
    "record and adjoint have no jump nodes or stage resets); gs.drivers.Batched() does, and "
    "gs.drivers.Auto() picks it."
)


class Kernel(AbstractDriver):
    """The compiled CPU kernel: record, replay and the replay's discrete adjoint in C++.

    Applies on CPU to explicit Runge–Kutta solvers (`gradsolve.Tsit5`, `gradsolve.Dopri5`,
    `gradsolve.Vern7`) with float32/float64 states and a vector field the translator handles
    (no loops or traced indexing), where a C++ compiler is found. Several times faster than
    the XLA drivers (``benchmarks/README.md``). ``grad`` runs the compiled adjoint; forward
    mode and second derivatives are the batched driver's. ``Solution.route ==
    "gradsolve-kernel"``.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, p, driver=gs.drivers.Kernel())
    """

    name: ClassVar[str] = "gradsolve-kernel"

    def record_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        if events:
            return EVENTS_REASON
        return kernel_target(f, solver, y0, params).reason

    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        if events:
            return EVENTS_REASON
        return kernel_target(f, solver, y0, params).reason

    def record(self, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
               max_steps: int, fill: bool, events=None) -> Mesh:
        if events is not None:
            raise ValueError(EVENTS_REASON)
        prefix = kernel_target(f, solver, y0, params).prefix
        out = kernel_record(prefix, f, solver, controller, t0, t1, y0, params, ts, rtol, atol,
                            dt0, max_steps, fill)
        none = empty_events(*y0.shape, y0.dtype)
        n = y0.shape[0]
        return Mesh(**out, ts=ts, t0=t0, t1=t1, y0=y0, jump_times=none.jump_times,
                    jump_sizes=none.jump_sizes, jump_index=jnp.zeros((n, 0), jnp.int32),
                    tstops=none.tstops, tstop_index=jnp.zeros((n, 0), jnp.int32),
                    params=params, solver=solver, rtol=rtol, atol=atol, controller=controller)

    def replay(self, f, solver, nodes, y0, params, rtol, atol, *, moved, layout):
        prefix = kernel_target(f, solver, y0, params).prefix
        return kernel_replay(prefix, f, solver, nodes, y0, params, rtol, atol, moved, layout)


def kernel_allowed() -> bool:
    """Whether `gradsolve.drivers.Auto` may pick the kernel (`gradsolve.use_compiled_kernel`)."""
    return kernel_enabled()


__all__ = ["Kernel", "kernel_allowed"]
