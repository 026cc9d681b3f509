"""Diagnostics of a population fit, as a pharmacometrician reads them: the visual predictive
check (`vpc`, `plot_vpc`), observations against population and individual predictions
(`plot_dv_pred`), conditional weighted residuals against time and prediction
(`plot_cwres`), and the fitted table in the long form (`population_table`).

The VPC simulates the design of the data ``n_replicates`` times at the fitted population
parameters: each replicate draws every subject's random effects from their fitted
distribution and the residual error from the noise model, through the model's own program
(`inference.predictive`: all replicates and subjects one vectorised solve). Observations
are binned by time; in each bin the observed percentiles (5th, 50th, 95th by default) are
set against the spread of the same percentiles over the replicates (Holford 2005, "The
visual predictive check", PAGE 14; Bergstrand et al. 2011, AAPS J 13:143 for the
prediction correction). matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = ["vpc", "VPC", "plot_vpc", "plot_dv_pred", "plot_cwres", "population_table"]


class VPC(NamedTuple):
    """The numbers of a visual predictive check (`vpc`), ``B`` time bins and ``P``
    percentiles.

    Attributes:
        bin_edges: ``(B + 1,)`` the bins' time edges (the last bin closed on the right).
        bin_times: ``(B,)`` the median observation time in each bin (where it is drawn).
        n_obs: ``(B,)`` observations in each bin.
        percentiles: ``(P,)`` the percentiles computed in each bin, e.g. ``(5, 50, 95)``.
        interval: the probability of the simulated intervals, e.g. ``0.9``.
        observed: ``(B, P)`` the observed percentiles of each bin.
        simulated: ``(B, P, 3)`` each percentile's distribution over the replicates: its
            lower bound, median and upper bound (the ``(1 - interval)/2``, ``0.5`` and
            ``(1 + interval)/2`` quantiles over replicates).
        times, dv: ``(n,)`` the observations drawn (prediction-corrected if asked for).
        n_replicates: simulated replicates of the design.
        pred_corrected: whether observations and simulations were prediction-corrected.

    Example:
        >>> v = inference.vpc(model, data, fit)
        >>> outside = (v.observed < v.simulated[..., 0]) | (v.observed > v.simulated[..., 2])
    """

    bin_edges: np.ndarray
    bin_times: np.ndarray
    n_obs: np.ndarray
    percentiles: np.ndarray
    interval: float
    observed: np.ndarray
    simulated: np.ndarray
    times: np.ndarray
    dv: np.ndarray
    n_replicates: int
    pred_corrected: bool


def _population_params(params, where: str) -> dict:
    values = getattr(params, "params", params)   # a PopulationFit or a mapping
    if not isinstance(values, Mapping) or not values:
        raise TypeError(f"{where}: `params` must be an inference.PopulationFit or a dict of "
                        f"the population parameters by site name; got {type(params).__name__}.")
    return {k: np.asarray(v, float) for k, v in values.items()}


def _bin_edges(times: np.ndarray, bins, where: str) -> np.ndarray:
    if isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        if bins < 1:
            raise ValueError(f"{where}: `bins` must be >= 1 (a number of quantile bins) or "
                             f"a sequence of edges; got {bins}.")
        edges = np.unique(np.quantile(times, np.linspace(0.0, 1.0, int(bins) + 1)))
        return edges if edges.size > 1 else np.array([edges[0], edges[0]])
    edges = np.asarray(bins, float)
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0) or not np.all(
            np.isfinite(edges)):
        raise ValueError(f"{where}: `bins` as edges must be at least two finite, increasing "
                         f"times; got {bins!r}.")
    return edges


def _assign(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin of each time (``-1`` outside the edges); bins are ``[e_j, e_j+1)``, the last
    one closed."""
    b = np.searchsorted(edges, times, side="right") - 1
    b = np.where(times == edges[-1], edges.size - 2, b)
    return np.where((times < edges[0]) | (times > edges[-1]), -1, b)


def _simulate(model, data, params, n, seed, batch_size) -> np.ndarray:
    """``(n, S, K)`` replicates of the design's observations at the population values."""
    from ..sampling._predictive import predictive

    samples = {k: np.broadcast_to(v, (n,) + v.shape) for k, v in params.items()}
    return np.asarray(predictive(model, data, samples, seed=seed, return_sites=["obs"],
                                 batch_size=batch_size)["obs"])


def _pred(model, data, params) -> np.ndarray:
    """``(S, K)`` population predictions (random effects at zero)."""
    from ._sites import _sites

    sites, draw = _sites(model, data, jax.random.PRNGKey(0))
    theta = dict(params, **{sites.effects: np.zeros(np.shape(draw[sites.effects]))})
    return np.asarray(model.predict(theta, data))


def vpc(
    model,
    data,
    params,
    *,
    n_replicates: int = 500,
    bins: int | Sequence[float] = 10,
    percentiles: Sequence[float] = (5.0, 50.0, 95.0),
    interval: float = 0.9,
    pred_corrected: bool = False,
    seed: int = 0,
    batch_size: int = 1000,
) -> VPC:
    """A visual predictive check's numbers: observed percentiles in time bins against the
    distribution of the same percentiles over replicates simulated at the fitted
    population parameters.

    Each replicate keeps the data's design (subjects, doses, covariates, observation
    times), draws every subject's random effects from their distribution at ``params``
    and the observations from the noise model; all replicates run as one vectorised
    program (`inference.predictive`). A prediction-corrected VPC (Bergstrand et al. 2011)
    multiplies every observed and simulated value by ``median(PRED in its bin) / PRED``,
    removing the spread that differing doses and covariates put into a bin (values whose
    PRED is zero, such as pre-dose samples, are left as they are).

    Args:
        model: the `models.PopulationModel` that was fitted.
        data: its `models.PopulationDataset` (the observed values and the design).
        params: an `inference.PopulationFit` or a dict of population parameters by site.
        n_replicates: simulated replicates of the whole data set.
        bins: a number of bins with equal counts of observations (quantiles of the
            observation times; tied quantiles merge), or the bins' edges.
        percentiles: percentiles (0-100) computed in each bin.
        interval: probability of each simulated percentile's interval.
        pred_corrected: prediction-correct the observations and simulations.
        seed: of the simulations.
        batch_size: replicates vectorised at once (the memory of ``batch_size`` solves of
            the whole data set).

    Returns:
        A `VPC`; draw it with `plot_vpc`.

    Example:
        >>> fit = inference.fit_population(model, data)
        >>> v = inference.vpc(model, data, fit, n_replicates=1000, bins=8)
        >>> v.observed.shape, v.simulated.shape          # (8, 3), (8, 3, 3)
    """
    where = "inference.vpc"
    params = _population_params(params, where)
    if int(n_replicates) < 2:
        raise ValueError(f"{where}: `n_replicates` must be >= 2, got {n_replicates}.")
    if not 0.0 < float(interval) < 1.0:
        raise ValueError(f"{where}: `interval` must be in (0, 1), got {interval}.")
    pcts = np.asarray(percentiles, float)
    if pcts.ndim != 1 or pcts.size == 0 or np.any((pcts < 0) | (pcts > 100)):
        raise ValueError(f"{where}: `percentiles` must be numbers in [0, 100], got "
                         f"{percentiles!r}.")
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    edges = _bin_edges(ts[seen], bins, where)
    which = _assign(ts[seen], edges)
    sims = _simulate(model, data, params, int(n_replicates), seed, batch_size)[:, seen]
    dv = ys[seen]
    if pred_corrected:
        pred = _pred(model, data, params)[seen]
        factor = np.ones_like(pred)
        for b in range(edges.size - 1):
            m = (which == b) & (pred != 0)       # a pre-dose PRED of 0 stays uncorrected
            if m.any():
                factor[m] = np.median(pred[m]) / pred[m]
        dv, sims = dv * factor, sims * factor
    B, P = edges.size - 1, pcts.size
    q = np.array([(1.0 - interval) / 2, 0.5, (1.0 + interval) / 2])
    observed = np.full((B, P), np.nan)
    simulated = np.full((B, P, 3), np.nan)
    bin_times = np.full(B, np.nan)
    n_obs = np.zeros(B, int)
    for b in range(B):
        m = which == b
        n_obs[b] = int(m.sum())
        if not n_obs[b]:
            continue
        bin_times[b] = np.median(ts[seen][m])
        observed[b] = np.percentile(dv[m], pcts)
        per_rep = np.percentile(sims[:, m], pcts, axis=1)        # (P, n)
        simulated[b] = np.quantile(per_rep, q, axis=1).T         # (P, 3)
    keep = which >= 0
    return VPC(bin_edges=edges, bin_times=bin_times, n_obs=n_obs, percentiles=pcts,
               interval=float(interval), observed=observed, simulated=simulated,
               times=ts[seen][keep], dv=dv[keep], n_replicates=int(n_replicates),
               pred_corrected=bool(pred_corrected))


def plot_vpc(result: VPC, *, ax=None, log: bool = False, xlabel: str = "time",
             ylabel: str | None = None):
    """Draw a `VPC`: the observations, the observed percentiles (lines) and the simulated
    intervals of the same percentiles (bands), by bin.

    Args:
        result: what `vpc` returned.
        ax: a matplotlib ``Axes`` to draw into (default: a new figure).
        log: a logarithmic concentration axis.
        xlabel, ylabel: axis labels (``ylabel`` default ``"DV"``, or ``"pcDV"``).

    Returns:
        The matplotlib ``Figure``.

    Example:
        >>> fig = inference.plot_vpc(inference.vpc(model, data, fit))
        >>> fig.savefig("vpc.png")
    """
    import matplotlib.pyplot as plt

    if not isinstance(result, VPC):
        raise TypeError(f"inference.plot_vpc: `result` must be the VPC that inference.vpc "
                        f"returns, got {type(result).__name__}.")
    fig, ax = (plt.subplots(figsize=(7, 4.5)) if ax is None else (ax.figure, ax))
    ax.plot(result.times, result.dv, "o", ms=3, color="0.55", alpha=0.6, label="observed")
    x = result.bin_times
    ok = np.isfinite(x)
    mid = int(np.argmin(np.abs(result.percentiles - 50.0)))
    outer = ", ".join(f"{p:g}th" for j, p in enumerate(result.percentiles) if j != mid)
    for j, p in enumerate(result.percentiles):
        first_outer = j == (1 if mid == 0 else 0)
        what = f"{p:g}th" if j == mid else outer
        show = j == mid or first_outer            # one legend entry for the outer ones
        ax.fill_between(x[ok], result.simulated[ok, j, 0], result.simulated[ok, j, 2],
                        color="tab:red" if j == mid else "tab:blue", alpha=0.25, lw=0,
                        label=f"simulated {what}: {100 * result.interval:g} % interval"
                        if show else None)
        ax.plot(x[ok], result.observed[ok, j], "-" if j == mid else "--", color="k", lw=1.5,
                label=f"observed {what}" if show else None)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel or ("pcDV" if result.pred_corrected else "DV"))
    ax.set_title(f"{'prediction-corrected ' if result.pred_corrected else ''}visual "
                 f"predictive check ({result.n_replicates} replicates)")
    ax.legend(fontsize=7, loc="best")
    return fig


def _observed_table(fit, data, where: str):
    """``(ts, ys, seen)`` of the data, checked against the fit's ``(S, K)`` tables."""
    ts, ys = data.observations()
    if np.shape(fit.pred) != ts.shape:
        raise ValueError(f"{where}: `fit` has predictions of shape {np.shape(fit.pred)} "
                         f"(subjects, observations) but `data` has {ts.shape}: pass the "
                         "data set the fit was made on.")
    return ts, ys, ~np.isnan(ys) & np.isfinite(fit.pred)


def plot_dv_pred(fit, data, *, log: bool = False):
    """Observations against population predictions (PRED, random effects at zero) and
    individual predictions (IPRED, at the conditional modes), with the line of identity.

    Args:
        fit: an `inference.PopulationFit`.
        data: the `models.PopulationDataset` it was fitted to.
        log: logarithmic axes.

    Returns:
        The matplotlib ``Figure`` (two axes: DV vs PRED, DV vs IPRED).

    Example:
        >>> inference.plot_dv_pred(fit, data).savefig("dv_pred.png")
    """
    import matplotlib.pyplot as plt

    _, ys, seen = _observed_table(fit, data, "inference.plot_dv_pred")
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    dv = ys[seen]
    for ax, name, pred in zip(axes, ("PRED", "IPRED"), (fit.pred, fit.ipred)):
        x = np.asarray(pred)[seen]
        ax.plot(x, dv, "o", ms=3.5, alpha=0.7, color="tab:blue")
        both = np.concatenate([x, dv])
        both = both[both > 0] if log else both
        lo, hi = both.min(), both.max()
        ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="identity")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("DV")
        ax.set_title(f"DV vs {name}")
    fig.tight_layout()
    return fig


def plot_cwres(fit, data):
    """Conditional weighted residuals (CWRES, Hooker et al. 2007) against time and against
    the population prediction, with zero and +-2 lines: without misfit they scatter as
    standard normal around zero, with no trend in either.

    Args:
        fit: an `inference.PopulationFit`.
        data: the `models.PopulationDataset` it was fitted to.

    Returns:
        The matplotlib ``Figure`` (two axes: CWRES vs TIME, CWRES vs PRED).

    Example:
        >>> inference.plot_cwres(fit, data).savefig("cwres.png")
    """
    import matplotlib.pyplot as plt

    ts, _, seen = _observed_table(fit, data, "inference.plot_cwres")
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), sharey=True)
    cw = np.asarray(fit.cwres)[seen]
    for ax, name, x in zip(axes, ("TIME", "PRED"), (ts[seen], np.asarray(fit.pred)[seen])):
        ax.plot(x, cw, "o", ms=3.5, alpha=0.7, color="tab:blue")
        ax.axhline(0.0, color="k", lw=1)
        for level in (-2.0, 2.0):
            ax.axhline(level, color="k", lw=0.8, ls="--")
        ax.set_xlabel(name)
        ax.set_title(f"CWRES vs {name}")
    axes[0].set_ylabel("CWRES")
    fig.tight_layout()
    return fig


def _subject_rows(s, i, fit, q, covariate_names) -> list[dict]:
    """The rows of subject ``s`` (index ``i``) in time order; at one time the observations
    that read the state before the doses there, the doses, then those that read it after
    (`Subject.obs_after`), so the table reads back to the same data."""
    etas = np.asarray(fit.etas).reshape(len(fit.etas), q)[i]
    common = {c: s.covariates[c] for c in covariate_names}
    common.update({f"ETA{j + 1}": float(etas[j]) for j in range(q)})
    rows = []
    after = np.zeros(s.ts.size, bool) if s.obs_after is None else s.obs_after
    for k, t in enumerate(s.ts):
        rows.append(dict(ID=s.id, TIME=float(t), DV=float(s.ys[k]), AMT=np.nan, EVID=0,
                         MDV=int(np.isnan(s.ys[k])), CMT=int(s.obs_cmt[k]) + 1, RATE=0.0,
                         PRED=float(fit.pred[i, k]), IPRED=float(fit.ipred[i, k]),
                         IWRES=float(fit.iwres[i, k]), CWRES=float(fit.cwres[i, k]),
                         _order=(float(t), 2 if after[k] else 0, k), **common))
    rates = np.zeros(s.dose_times.size) if s.dose_rates is None else s.dose_rates
    for j, t in enumerate(s.dose_times):
        rows.append(dict(ID=s.id, TIME=float(t), DV=np.nan, AMT=float(s.dose_amounts[j]),
                         EVID=1, MDV=1, CMT=int(s.dose_cmt[j]) + 1, RATE=float(rates[j]),
                         PRED=np.nan, IPRED=np.nan, IWRES=np.nan, CWRES=np.nan,
                         _order=(float(t), 1, j), **common))
    return sorted(rows, key=lambda r: r["_order"])


def population_table(fit, data, path: str | Path | None = None) -> dict[str, np.ndarray]:
    """The fitted data in the long form NONMEM writes its tables in: one row per
    observation or dose, the data's columns and the fit's per-observation results.

    Columns: ``ID, TIME, DV, AMT, EVID, MDV, CMT``, ``RATE`` (if any dose is a zero-order
    input), the covariates, ``PRED, IPRED, IWRES, CWRES`` (NaN on dose rows) and ``ETA1 ..
    ETAq``, each subject's conditional mode of the model's random-effects site, on every
    row of the subject (on that site's own scale: for a non-centred model such as
    `models.theophylline`, standard-normal effects that the model multiplies by ``omega``).
    Additional doses (``ADDL``) are written out one row each. Rows are in subject order,
    then time, an observation before a dose at the same time (it reads the state before
    the dose), so `models.PopulationDataset.from_table` reads the file back to the same
    subjects, doses and observations (name the covariates: ``covariates=[...]``).

    Args:
        fit: an `inference.PopulationFit`.
        data: the `models.PopulationDataset` it was fitted to.
        path: if given, a CSV file to write (missing values as ``.``).

    Returns:
        A dict of column name to ``(rows,)`` array (``ID`` an object array).

    Example:
        >>> tab = inference.population_table(fit, data, "fit_table.csv")
        >>> cwres, observed = tab["CWRES"], tab["EVID"] == 0
        >>> cwres[observed]
    """
    where = "inference.population_table"
    _observed_table(fit, data, where)
    S = data.n_subjects
    q = int(np.prod(np.shape(fit.etas)[1:])) if np.ndim(fit.etas) > 1 else 1
    if np.shape(fit.etas)[0] != S:
        raise ValueError(f"{where}: `fit` has conditional modes for {np.shape(fit.etas)[0]} "
                         f"subjects but `data` has {S}.")
    rows = [r for i, s in enumerate(data.subjects)
            for r in _subject_rows(s, i, fit, q, data.covariate_names)]
    names = ["ID", "TIME", "DV", "AMT", "EVID", "MDV", "CMT"]
    if data.has_infusions:
        names.append("RATE")
    names += list(data.covariate_names) + ["PRED", "IPRED", "IWRES", "CWRES"]
    names += [f"ETA{j + 1}" for j in range(q)]
    table = {n: np.array([r[n] for r in rows], dtype=object if n == "ID" else None)
             for n in names}
    if path is not None:
        _write_csv(table, names, Path(path))
    return table


def _write_csv(table: dict, names: list[str], path: Path) -> None:
    def cell(v: Any) -> str:
        if isinstance(v, (float, np.floating)):
            return "." if np.isnan(v) else repr(float(v))
        return str(v)

    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(names)
        for i in range(len(table["ID"])):
            w.writerow([cell(table[n][i]) for n in names])
