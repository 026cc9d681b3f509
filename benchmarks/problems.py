"""Benchmark problems shared by the scripts in this folder (one trajectory each; batched by
gradsolve, vmapped for Diffrax)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def lotka_volterra(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


def lorenz(t, y, p):
    return jnp.stack([p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]])


def van_der_pol(t, y, p):
    return jnp.stack([y[1], p[0] * (1 - y[0] ** 2) * y[1] - y[0]])


def pendulum(t, y, p):
    """Damped pendulum: a transcendental right-hand side (sin)."""
    return jnp.stack([y[1], -p[0] * jnp.sin(y[0]) - p[1] * y[1]])


def robertson(t, y, p):
    r1, r2, r3 = p[0] * y[0], p[1] * y[1] ** 2, p[2] * y[1] * y[2]
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2])


PROBLEM_NAMES = ("lotka_volterra", "lorenz", "van_der_pol", "pendulum", "robertson")


def make(name: str, n: int, seed: int = 0):
    """(f, t1, y0 (n, d), params (n, q), ts (k,), stiff) with parameters spread +-10 %."""
    rng = np.random.default_rng(seed)
    jitter = lambda shape: 1 + 0.2 * (rng.random(shape) - 0.5)
    if name == "lotka_volterra":
        p = np.array([1.5, 1.0, 3.0, 1.0]) * jitter((n, 4))
        return lotka_volterra, 10.0, jnp.ones((n, 2)), jnp.asarray(p), jnp.linspace(0, 10, 20), False
    if name == "lorenz":
        p = np.array([10.0, 28.0, 8 / 3]) * jitter((n, 3))
        y0 = np.array([1.0, 1.0, 1.0]) * jitter((n, 3))
        return lorenz, 1.0, jnp.asarray(y0), jnp.asarray(p), jnp.linspace(0, 1, 20), False
    if name == "van_der_pol":
        p = np.array([1.0]) * jitter((n, 1))
        y0 = np.array([2.0, 0.0]) + np.array([0.1, 0.0]) * (rng.random((n, 2)) - 0.5)
        return van_der_pol, 10.0, jnp.asarray(y0), jnp.asarray(p), jnp.linspace(0, 10, 20), False
    if name == "pendulum":
        p = np.array([9.81, 0.1]) * jitter((n, 2))
        y0 = np.array([2.5, 0.0]) * jitter((n, 2))
        return pendulum, 10.0, jnp.asarray(y0), jnp.asarray(p), jnp.linspace(0, 10, 20), False
    if name == "robertson":
        p = np.array([0.04, 3e7, 1e4]) * jitter((n, 3))
        y0 = np.tile([1.0, 0.0, 0.0], (n, 1))
        return robertson, 100.0, jnp.asarray(y0), jnp.asarray(p), jnp.geomspace(1e-2, 100, 20), True
    raise ValueError(f"unknown problem {name!r}")
