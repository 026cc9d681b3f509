"""The sampler's result as ``arviz.InferenceData``: posterior draws under the model's
parameter names and shapes, NUTS statistics, observations, and how the run was made."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ._chains import ChainKernel, Draws, SampleInfo, SampleState

__all__ = ["inference_data", "describe_response"]


def describe_response(adaptations: tuple, dense: bool = False) -> str:
    """Words for the warmup's response to divergences, from `SampleInfo.adaptations`
    (``(target_accept, divergences late in it or in the draws after it that it dropped)`` per
    adaptation); ``dense``: the first adaptation's metric was dense (a re-adaptation
    replaces it by its diagonal)."""
    if not adaptations:
        return "no warmup"
    (t0, n0), rest = adaptations[0], adaptations[1:]
    if not n0:
        return f"no divergences late in warmup at target_accept {t0:g}"
    plural = lambda n: f"{n} divergence{'s' if n != 1 else ''}"
    out = (f"{plural(n0)} late in warmup (at step sizes near the final one) or in the "
           f"draws after it at target_accept {t0:g}")
    for i, (t, n) in enumerate(rest):
        metric = " on the dense metric's diagonal" if dense and i == 0 else ""
        out += f"; step size re-adapted at {t:g}{metric} ({plural(n)} then)"
    if not rest:
        out += "; not re-adapted (max_retunes=0)"
    return out


def inference_data(kernel: ChainKernel, s: SampleState, info: SampleInfo, attrs: dict):
    """``arviz.InferenceData`` of the sampling phase (``info.draws``) that ended at ``s``;
    ``attrs`` (the run's settings and timings) are added to every group's attributes with
    the mesh policy's, the error ratios', the counters' and the words of ``info``."""
    import arviz as az

    problem, policy, model = kernel.problem, kernel.policy, kernel.problem.model
    d = Draws(*(np.concatenate(parts, axis=1) for parts in zip(*info.draws)))
    shared = s.mesh.row(0)
    if policy.solves_each_evaluation:
        # every evaluation solved adaptively: the error ratio of each checked draw's own
        # mesh, the accuracy of the solutions the sampler used (NaN at unchecked draws)
        err = kernel.own_error_ratios(d.z)
    elif len(info.error_ratios) == len(info.draws):
        err = np.concatenate(info.error_ratios, axis=1)    # measured as they were drawn
    else:
        err = kernel.error_ratios(shared, d.z, tol_factor=s.sampling_tol_factor)
    max_err = float(np.nanmax(err)) if np.isfinite(err).any() else float("nan")
    if np.isfinite(max_err) and max_err > policy.error_ratio_max:
        warnings.warn(
            f"inference.sample: the frozen mesh's error ratio reached {max_err:.3g} > "
            f"{policy.error_ratio_max:g} at some draws (the fixed-mesh posterior there is "
            "less accurate than rtol/atol); use a smaller frozen_tol_factor or "
            "rerecord='always'.", RuntimeWarning, stacklevel=3)
    space = problem.space
    stats = {
        "diverging": np.asarray(d.diverging, bool),
        "n_steps": d.num_steps.astype(np.int64),
        "tree_depth": np.ceil(np.log2(d.num_steps.astype(float) + 1)).astype(np.int64),
        "step_size": d.step_size, "energy": d.energy, "lp": -d.potential_energy,
        "acceptance_rate": d.accept_prob, "error_ratio": err,
    }
    dims = {k: [f"{k}_dim_{i}" for i in range(len(shape))] for k, shape in space.shapes.items()}
    observed, obs_dims, coords = problem.observed_data()
    dims.update(obs_dims)
    idata = az.from_dict(
        posterior={k: np.asarray(v) for k, v in
                   jax.jit(space.from_unconstrained)(jnp.asarray(d.z)).items()},
        sample_stats=stats, observed_data=observed, dims=dims, coords=coords)
    counted = attrs["count_failures"]
    attrs = dict(
        inference_library="gradsolve.inference", model=model.name, **attrs,
        mesh_policy=policy.rerecord, mesh_policy_description=policy.describe_sampling(),
        sampling_mesh_steps=-1 if policy.solves_each_evaluation else int(np.max(shared.n_steps)),
        sampling_mesh=info.sampling_mesh, n_records=info.n_records,
        solve_max_steps=s.solve_max_steps if policy.solves_each_evaluation else -1,
        init=info.init, frozen_tol_factor=policy.record_tol_factor,
        solver=type(problem.solver).__name__, warmup_time_s=info.warmup_time,
        sampling_time_s=info.sampling_time, max_error_ratio=max_err,
        solver_failures_warmup=info.failures_warmup if counted else -1,
        solver_failures_sampling=info.failures_sampling if counted else -1,
        record_failures=info.record_failures, divergences=int(np.sum(d.diverging)),
        target_accept=float(s.target_accept), retunes=max(0, len(info.adaptations) - 1),
        warmup_late_divergences=int(info.adaptations[0][1]) if info.adaptations else 0,
        divergence_response=describe_response(info.adaptations,
                                              attrs.get("mass_matrix_requested") == "dense"),
        **{f"init_fit_{k}": v for k, v in info.init_fit.items()})
    del attrs["count_failures"]
    if attrs["divergences"]:
        warnings.warn(
            f"inference.sample: {attrs['divergences']} of {d.diverging.size} draws diverged "
            f"after warmup (target_accept {s.target_accept:g}; {attrs['divergence_response']}"
            "). Draws near the divergences may be biased: try a non-centred "
            "parameterisation of random effects, "
            f"{'' if attrs.get('mass_matrix_requested') == 'dense' else 'dense_mass=True, '}a higher target_accept "
            "or max_retunes.", RuntimeWarning, stacklevel=3)
    # NetCDF (``idata.to_netcdf``) has no boolean attributes
    attrs = {k: int(v) if isinstance(v, (bool, np.bool_)) else v for k, v in attrs.items()}
    # (a program whose likelihood is a numpyro.factor has no observed_data group)
    for group in ("posterior", "sample_stats", "observed_data"):
        if group in idata.groups():
            getattr(idata, group).attrs.update(attrs)
    return idata
