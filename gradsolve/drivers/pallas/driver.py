"""`Pallas`: the record, the replay and its adjoint as fused Pallas kernels on a TPU."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._sharding import platform
from ..base import AbstractDriver
from ._field import pallas_field
from ._replay import pallas_replay


class Pallas(AbstractDriver):
    """The record, the replay and its exact discrete adjoint as Pallas kernels on a TPU
    (``gradsolve/drivers/pallas/``): each is one fused kernel whose step loop runs with the
    ensemble on vector sublanes and lanes, instead of an XLA program of a few fusions per
    step. On one mesh its values and gradients are those of `gradsolve.drivers.Lanes` (in
    float64, interpreted: equal to the last bit in the tests; a Rosenbrock method's, those
    of `gradsolve.drivers.Batched` to rounding, the LU's: 1e-12 in the tests); its record
    accepts the steps the XLA record accepts (`gradsolve.drivers.pallas._record` says how
    closely).

    Applies to explicit Runge–Kutta solvers with an error estimate (`gradsolve.Tsit5`,
    `gradsolve.Dopri5`, `gradsolve.Vern7`, your own `gradsolve.AbstractExplicitRK`) and to
    Rosenbrock methods (`gradsolve.Rodas5P`, `gradsolve.Rosenbrock23`, a
    `gradsolve.AbstractRosenbrock` that sets coefficients) on at most 8 states (the
    Jacobian by forward mode and an LU with partial pivoting unrolled over the states on
    the vector unit: `gradsolve.drivers.pallas._rosenbrock`), in float32 on a TPU, where
    the vector field translates entry by entry and one step and its adjoint use only
    primitives Mosaic lowers (``replay_reason`` names those it does not, e.g. ``expm1``,
    ``sinh``, ``lgamma``, and says where a stiff system has too many states: the batched
    XLA driver runs it). Known-time events (``jumps=``, ``tstops=``, and
    so ``doses=``) run in the record, the replay and the adjoint, as in the lanes replay
    (`gradsolve.drivers.pallas._events`). The record runs at any capacity: a mesh too long
    for VMEM is written in chunks of rows. Under ``jax.vmap`` (e.g. a sampler's chains) the
    record, the replay and the adjoint each run once on the ``C * n`` trajectories of the
    mapped calls, padded to the ``(8, 128)`` tile once rather than per call
    (`gradsolve.drivers.pallas._fold`).
    `gradsolve.drivers.Auto` takes it first on a TPU where it applies.

    Measured on a TPU v5e (Lotka–Volterra, Tsit5, float32, rtol 1e-5, 32,768 trajectories,
    ``benchmarks/bench_accelerator.py``): replay gradient 1.6 ms, ``gs.solve`` gradient
    under ``jit`` 4.5 ms, against 1,326 ms for Diffrax's default adjoint (850x, 290x) and
    38.5 ms / 268 ms for the lanes driver.

    Args:
        interpret: run the same kernels through Pallas' interpreter (any backend, float64
            allowed): how the kernels are tested off the chip. Slow to compile; for tests.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, p, driver=gs.drivers.Pallas())   # on a TPU
        >>> sol.route
        'gradsolve-pallas'
        >>> gs.drivers.Pallas(interpret=True).replay_reason(f, gs.Rodas5P(), y0_9, p)
        "the Pallas kernels factorise a Rosenbrock step's matrix ... this system has 9."
    """

    interpret: bool = eqx.field(static=True, default=False)
    name: ClassVar[str] = "gradsolve-pallas"

    def _reason(self, f, solver, y0, params) -> str | None:
        """Why the kernels cannot run this work (record and replay share the rules)."""
        if not self.interpret:
            backend = platform()
            if backend != "tpu":
                return (f"it runs Pallas kernels on a TPU, and the default backend is "
                        f"{backend}; gs.drivers.Pallas(interpret=True) runs the same kernels "
                        "through the Pallas interpreter (slowly: for tests).")
            if y0 is not None and jnp.result_type(y0) == jnp.float64:
                return ("float64 is not implemented in Mosaic (Pallas on TPU); solve in "
                        "float32, or use gs.drivers.Lanes() for float64 on a TPU.")
        if f is None:
            return None
        return pallas_field(f, solver, y0, params).reason

    def record_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return self._reason(f, solver, y0, params)

    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return self._reason(f, solver, y0, params)

    def record(self, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
               max_steps: int, fill: bool, events=None):
        from ._record import pallas_record

        field = pallas_field(f, solver, y0, params).field
        return pallas_record(field, f, solver, controller, t0, t1, y0, params, ts, rtol, atol,
                             dt0, max_steps, fill, self.interpret, events)

    def replay(self, f, solver, nodes, y0, params, rtol, atol, *, moved, layout):
        field = pallas_field(f, solver, y0, params).field
        return pallas_replay(field, f, solver, nodes, y0, params, rtol, atol, moved, layout,
                             self.interpret)
