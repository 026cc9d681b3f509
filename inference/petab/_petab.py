"""What a PEtab problem's table means to a fit (`models.PetabProblem`): the starts (Latin
hypercube draws inside the bounds on the parameter scale, after the ``init`` rows the
user gives, checked against the table), the parameters of a result (hierarchical
optimisation's inner parameters at their closed-form optimum at each point), and the
objective's residual form. The fit itself is `inference.fit`'s, as for every problem: the
problem it moves in is `inference.petab._problem.PetabFitProblem`, whose ``fit_starts`` and
``fit_params`` call the functions here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["latin_hypercube", "table_starts", "table_params", "default_method"]


def latin_hypercube(lower, upper, n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, D)`` points inside ``[lower, upper]``: each coordinate's range cut into ``n``
    equal strata, one point in each, strata paired at random across coordinates (McKay,
    Beckman & Conover 1979)."""
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    d = lower.shape[0]
    strata = np.stack([rng.permutation(n) for _ in range(d)], axis=1)
    u = (strata + rng.uniform(size=(n, d))) / n
    return lower + (upper - lower) * u


def table_starts(problem, init, n_starts: int, seed: int, lo, hi) -> np.ndarray:
    """The starts ``(n, D)`` of a fit of ``problem`` (a `models.PetabProblem`) inside
    ``[lo, hi]`` (its finite bounds): Latin hypercube draws seeded by ``seed``, after the
    given ``init`` rows (checked by `_given_starts`)."""
    for name, v in (("n_starts", n_starts),):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {v!r}")
    rng = np.random.default_rng(seed)
    x = latin_hypercube(lo, hi, n_starts, rng)
    if init is None:
        return x
    given = _given_starts(problem, init, lo, hi)
    if len(given) > n_starts:
        raise ValueError(f"`init` holds {len(given)} starts, more than n_starts={n_starts}")
    x[: len(given)] = given
    return x


def _given_starts(problem, init, lo, hi) -> np.ndarray:
    """``init`` (a dict by parameter id, a ``(D,)`` vector or ``(k, D)`` rows, on the
    parameter scale) as ``(k, D)`` rows, refused with a ``ValueError`` naming the key,
    parameter or row where it is not a start of ``problem``: an unknown key, a missing
    parameter, a value that is not finite or lies outside the bounds (the optimiser would
    clip it to the bound without a word: typically a value given on the linear scale)."""
    ids = list(problem.parameter_ids)
    if isinstance(init, dict):
        # a previous fit's params hold the inner parameters too: known, set in closed form
        unknown = set(init) - set(ids) - set(problem.inner_parameter_ids)
        if unknown:
            raise ValueError(f"`init` has keys {sorted(unknown)} that are not parameters "
                             f"of the problem (estimated: {ids})")
        missing = set(ids) - set(init)
        if missing:
            raise ValueError(f"`init` is missing parameters {sorted(missing)}")
        given = np.stack([np.asarray(init[p], float).reshape(-1) for p in ids], axis=1)
    else:
        given = np.atleast_2d(np.asarray(init, float))
    if given.ndim != 2 or given.shape[1] != len(ids):
        inner = ""
        if given.shape[-1] == len(problem.full_parameter_ids) != len(ids):
            inner = (f"; the inner parameters {list(problem.inner_parameter_ids)} are set "
                     "in closed form: give the outer ones, or a dict by id")
        raise ValueError(f"`init` has {given.shape[-1]} parameters, the problem "
                         f"{len(ids)} ({ids}){inner}")
    bad = np.argwhere(~np.isfinite(given))
    if len(bad):
        row, j = bad[0]
        raise ValueError(f"`init`'s parameter '{ids[j]}' (start {row}) is {given[row, j]}; "
                         "starts must be finite")
    # a hair of slack: a start read back from a fit's result sits on its bound
    slack = 1e-9 * (hi - lo)
    bad = np.argwhere((given < lo - slack) | (given > hi + slack))
    if len(bad):
        row, j = bad[0]
        v, scale = given[row, j], problem.scales[j]
        hint = ""
        if scale != "lin" and v > 0:
            on_scale = np.log10(v) if scale == "log10" else np.log(v)
            if lo[j] <= on_scale <= hi[j]:
                hint = (f"; starts are on the parameter scale: was {v:g} given linear? "
                        f"its {scale} is {on_scale:.6g}")
        raise ValueError(f"`init`'s parameter '{ids[j]}' (start {row}) is {v:g}, outside "
                         f"its bounds [{lo[j]:g}, {hi[j]:g}] on its {scale} scale{hint}")
    return np.clip(given, lo, hi)


def table_params(problem, x, full=None) -> dict:
    """Each start's parameters by id from its outer point ``x (n, D)``: with inner
    parameters, every estimated parameter (``full (n, n_full)``, else computed here by
    ``problem.full_parameters``), else those of ``x``."""
    if not problem.inner_parameter_ids:
        return {p: x[:, i] for i, p in enumerate(problem.parameter_ids)}
    if full is None:
        full = np.asarray(jax.jit(jax.vmap(problem.full_parameters))(jnp.asarray(x)))
    return {p: full[:, i] for i, p in enumerate(problem.full_parameter_ids)}


def default_method(problem) -> str:
    """The local optimiser of a `models.PetabProblem`'s fit: ``"lm"`` (the batched
    Levenberg–Marquardt on its noise-weighted residuals) where every noise model is
    normal, else ``"lbfgs"`` (L-BFGS-B: Laplace noise is no sum of squares)."""
    return "lbfgs" if np.asarray(problem.residual_layout().laplace).any() else "lm"
