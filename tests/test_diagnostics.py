"""Population-fit diagnostics (`inference.vpc`, the plots, `inference.population_table`)
against independent references: the VPC of a random-intercept model whose binned
observations are iid normal, so that each simulated percentile is an order statistic with
a closed-form distribution (Beta quantiles through the normal's); the VPC of theophylline
against a NumPy simulation of its closed-form (Bateman) concentrations; plots read back
from their artists; the table written and read back through the data reader."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import stats

import inference
import models

A, B, OMEGA, SIGMA = 2.0, 0.7, 0.8, 0.3
T = np.array([1.0, 2.0, 4.0, 8.0])


def intercept_model(S):
    """y_ij = a + omega eta_i + b t_ij + sigma eps_ij: the ODE y' = b from y(0) = a +
    omega eta_i (random intercept, no doses)."""

    def latent(data):
        theta = {"a": numpyro.sample("a", dist.Normal(0.0, 10.0)),
                 "b": numpyro.sample("b", dist.Normal(0.0, 10.0)),
                 "omega": numpyro.sample("omega", dist.HalfNormal(2.0)),
                 "sigma": numpyro.sample("sigma", dist.HalfNormal(2.0))}
        with numpyro.plate("subjects", data.n_subjects):
            theta["eta"] = numpyro.sample("eta", dist.Normal(0.0, 1.0))
        return theta

    def individual(theta, data):
        return {"a": theta["a"] + theta["omega"] * theta["eta"],
                "b": jnp.broadcast_to(theta["b"], (S,))}

    class Start(models.PopulationModel):
        def dosing(self, theta, p, data):
            return p["a"][:, None], None

    return Start(name="intercept", vector_field=lambda t, y, p: jnp.broadcast_to(p["b"], (1,)),
                 state_names=("y",), latent=latent, individual=individual,
                 observation=lambda th, p, ts, ys: ys[..., 0],
                 noise=lambda th, pred: dist.Normal(pred, th["sigma"]))


def subjects_at(times_per_subject, rng):
    out = []
    for i, t in enumerate(times_per_subject):
        y = A + OMEGA * rng.normal() + B * t + SIGMA * rng.normal(size=t.size)
        out.append(models.Subject(id=i + 1, ts=t, ys=y, obs_cmt=np.zeros(t.size, int),
                                  dose_times=np.zeros(0), dose_amounts=np.zeros(0),
                                  dose_cmt=np.zeros(0, int), covariates={}))
    return models.PopulationDataset(out)


TRUTH = {"a": A, "b": B, "omega": OMEGA, "sigma": SIGMA}


def test_vpc_percentile_intervals_equal_order_statistics():
    """21 subjects at the same 4 times, one time a bin: in each bin a replicate's values
    are 21 iid N(a + b t, omega^2 + sigma^2), and numpy's 5th/50th/95th percentiles of 21
    values are the 2nd/11th/20th order statistics, whose u-quantile is mu + s
    Phi^-1(Beta^-1(u; k, n - k + 1)). Tolerance: 4.5 Monte Carlo standard errors of a
    u-quantile of N draws, sqrt(u (1 - u) / N) / density."""
    n, N = 21, 2000
    data = subjects_at([T] * n, np.random.default_rng(1))
    v = inference.vpc(intercept_model(n), data, TRUTH, n_replicates=N,
                      bins=[0.5, 1.5, 3.0, 6.0, 9.0], seed=3)
    assert v.simulated.shape == (4, 3, 3) and v.observed.shape == (4, 3)
    np.testing.assert_array_equal(v.n_obs, [n] * 4)
    np.testing.assert_allclose(v.bin_times, T)
    s = np.hypot(OMEGA, SIGMA)
    u = np.array([0.05, 0.5, 0.95])
    for b, t in enumerate(T):
        mu = A + B * t
        for j, k in enumerate((2, 11, 20)):
            order = stats.beta(k, n - k + 1)
            x = mu + s * stats.norm.ppf(order.ppf(u))
            dens = order.pdf(stats.norm.cdf((x - mu) / s)) * stats.norm.pdf((x - mu) / s) / s
            se = np.sqrt(u * (1 - u) / N) / dens
            np.testing.assert_array_less(np.abs(v.simulated[b, j] - x), 4.5 * se)
        ys = np.array([sub.ys[b] for sub in data.subjects])
        np.testing.assert_allclose(v.observed[b], np.percentile(ys, [5, 50, 95]))


def test_vpc_quantile_bins_and_prediction_correction():
    """Ragged, subject-specific times: quantile bins hold equal counts; the
    prediction-corrected observations are DV * median(PRED in bin) / PRED with PRED = a +
    b t (random effect zero); the interval of the simulated median against the same
    quantity from a NumPy simulation of the model (no ODE), at the sampling spread of that
    simulation repeated at the same replicate count."""
    rng = np.random.default_rng(2)
    S, N = 12, 400
    times = [np.sort(rng.uniform(0.5, 10.0, size=5)) for _ in range(S)]
    data = subjects_at(times, rng)
    model = intercept_model(S)
    v = inference.vpc(model, data, TRUTH, n_replicates=N, bins=4, pred_corrected=True, seed=0)
    all_t = np.concatenate(times)
    np.testing.assert_allclose(v.bin_edges, np.quantile(all_t, [0, 0.25, 0.5, 0.75, 1]))
    np.testing.assert_array_equal(v.n_obs, [15, 15, 15, 15])
    dv = np.concatenate([s.ys for s in data.subjects])
    pred = A + B * all_t
    which = np.clip(np.searchsorted(v.bin_edges, all_t, side="right") - 1, 0, 3)
    pc = np.array([dv[i] * np.median(pred[which == which[i]]) / pred[i]
                   for i in range(dv.size)])
    np.testing.assert_allclose(np.sort(v.dv), np.sort(pc), rtol=1e-6)
    for b in range(4):
        np.testing.assert_allclose(v.observed[b], np.percentile(pc[which == b], [5, 50, 95]),
                                   rtol=1e-6)

    def numpy_vpc(seed, n):
        r = np.random.default_rng(seed)
        ts, _ = data.observations()
        y = (A + OMEGA * r.normal(size=(n, S, 1)) + B * ts[None]
             + SIGMA * r.normal(size=(n,) + ts.shape))
        cols = np.concatenate([y[:, i, :t.size] for i, t in enumerate(times)], axis=1)
        cols = cols * np.array([np.median(pred[which == which[i]]) / pred[i]
                                for i in range(dv.size)])[None]
        med = np.stack([np.median(cols[:, which == b], axis=1) for b in range(4)])  # (4, n)
        return np.quantile(med, [0.05, 0.5, 0.95], axis=1).T                       # (4, 3)

    reps = np.stack([numpy_vpc(100 + k, N) for k in range(60)])
    ref = numpy_vpc(7, 40 * N)
    spread = reps.std(axis=0)
    np.testing.assert_array_less(np.abs(v.simulated[:, 1, :] - ref), 5 * spread)


def theoph_bateman(params, data, eta):
    """NumPy: theophylline concentrations (N, S, K) for random effects eta (N, S, 2)."""
    ts, _ = data.observations()
    dose = np.array([s.dose_amounts[0] for s in data.subjects])[None, :, None]
    ka = np.exp(params["lKa"] + params["omega"][0] * eta[..., 0])[..., None]
    cl = np.exp(params["lCl"] + params["omega"][1] * eta[..., 1])[..., None]
    ke = np.exp(params["lKe"])
    c = dose * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * ts) - np.exp(-ka * ts))
    return np.where(ts > 0, c, 0.0)


def test_vpc_theophylline_against_numpy_bateman():
    """Oral doses through the model's own dosing and ODE solve: the VPC numbers of
    theophylline at fixed population values, plain and prediction-corrected (PRED the
    Bateman function at zero random effects; the pre-dose samples, PRED 0, uncorrected),
    against a NumPy simulation of the Bateman function, within 5 sampling standard
    deviations of that simulation repeated at the same replicate count."""
    data = models.load_dataset("theophylline")
    params = {"lKa": 0.45, "lCl": -3.22, "lKe": -2.45, "omega": np.array([0.64, 0.26]),
              "sigma": 0.7}
    N, edges = 300, [0.0, 0.4, 1.5, 4.0, 8.0, 13.0, 25.0]
    model = models.theophylline()
    v = inference.vpc(model, data, params, n_replicates=N, bins=edges, seed=1)
    v_pc = inference.vpc(model, data, params, n_replicates=N, bins=edges, seed=2,
                         pred_corrected=True)
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    which = np.clip(np.searchsorted(edges, ts[seen], side="right") - 1, 0, len(edges) - 2)
    pred = theoph_bateman(params, data, np.zeros((1, data.n_subjects, 2)))[0][seen]
    factor = np.ones_like(pred)
    for b in range(len(edges) - 1):
        m = (which == b) & (pred != 0)
        factor[m] = np.median(pred[m]) / pred[m]
    assert np.any(pred == 0) and np.all(np.isfinite(v_pc.simulated))

    def numpy_vpc(seed, n, f):
        r = np.random.default_rng(seed)
        c = theoph_bateman(params, data, r.normal(size=(n, data.n_subjects, 2)))
        y = (c + params["sigma"] * r.normal(size=c.shape))[:, seen] * f
        per = np.stack([np.percentile(y[:, which == b], [5, 50, 95], axis=1)
                        for b in range(len(edges) - 1)])                # (B, P, n)
        return np.quantile(per, [0.05, 0.5, 0.95], axis=2).transpose(1, 2, 0)

    for result, f in ((v, 1.0), (v_pc, factor)):
        reps = np.stack([numpy_vpc(100 + k, N, f) for k in range(60)])
        ref = numpy_vpc(7, 20 * N, f)
        np.testing.assert_array_less(np.abs(result.simulated - ref),
                                     5 * reps.std(axis=0) + 1e-9)
        for b in range(len(edges) - 1):
            np.testing.assert_allclose(result.observed[b], np.percentile(
                (ys[seen] * f)[which == b], [5, 50, 95]), rtol=1e-7)


# ----------------------------------------------------------------------------- plots, table
def table_data():
    """Two subjects: an oral bolus with ADDL, an infusion (RATE), a missing DV (MDV), a
    sample at a dose time; ragged observation counts; a weight covariate."""
    tab = {
        "ID":   [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2],
        "TIME": [0, 0, 1, 3, 12, 13, 0, 0.5, 2, 5, 9],
        "DV":   [".", ".", 2.1, 1.5, 0.9, 2.4, ".", 3.3, 2.2, ".", 0.7],
        "AMT":  [100, ".", ".", ".", ".", ".", 50, ".", ".", ".", "."],
        "RATE": [0, ".", ".", ".", ".", ".", 100, ".", ".", ".", "."],
        "ADDL": [1, ".", ".", ".", ".", ".", 0, ".", ".", ".", "."],
        "II":   [12, ".", ".", ".", ".", ".", 0, ".", ".", ".", "."],
        "EVID": [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
        "MDV":  [1, 1, 0, 0, 0, 0, 1, 0, 0, 1, 0],
        "CMT":  [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
        "WT":   [70] * 6 + [82] * 5,
    }
    return models.PopulationDataset.from_table(tab, covariates=["WT"])


def fake_fit(data, q=2, seed=0):
    """A PopulationFit with known arrays (the diagnostics only read them)."""
    r = np.random.default_rng(seed)
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    arr = lambda: np.where(seen, r.normal(size=ts.shape), np.nan)
    return inference.PopulationFit(
        params={"a": np.array(1.0)}, se={"a": np.array(0.1)}, ofv=1.0, ofv_nonmem=0.0,
        aic=3.0, bic=3.0, etas=r.normal(size=(data.n_subjects, q)), shrinkage=np.zeros(q),
        condition_number=1.0, pred=np.where(seen, 1 + r.uniform(size=ts.shape), np.nan),
        ipred=np.where(seen, 1 + r.uniform(size=ts.shape), np.nan), iwres=arr(),
        cwres=arr(), method="foce-i", converged=True, n_iterations=1, wall_time=0.0)


def test_table_round_trips_through_the_reader(tmp_path):
    data = table_data()
    fit = fake_fit(data)
    path = tmp_path / "fit.csv"
    tab = inference.population_table(fit, data, path)
    same = fit.table(data)                                      # the method, the same table
    assert list(same) == list(tab)
    for k in tab:
        np.testing.assert_array_equal(same[k], tab[k])
    back = models.PopulationDataset.from_table(path, covariates=["WT"])
    assert back.ids == data.ids and back.covariate_names == ("WT",)
    for s, r in zip(data.subjects, back.subjects):
        for f in ("ts", "ys", "obs_cmt", "obs_after", "dose_times", "dose_amounts",
                  "dose_cmt"):
            np.testing.assert_array_equal(getattr(r, f), getattr(s, f), err_msg=f)
        np.testing.assert_array_equal(
            np.zeros(s.dose_times.size) if s.dose_rates is None else s.dose_rates,
            np.zeros(r.dose_times.size) if r.dose_rates is None else r.dose_rates)
        assert r.covariates == s.covariates
    assert back.subjects[0].dose_times.tolist() == [0.0, 12.0]       # ADDL written out
    obs = tab["EVID"] == 0
    _, ys = data.observations()
    seen_rows = ~np.isnan(ys)
    ragged = np.concatenate([np.ones(s.ts.size, bool) for s in data.subjects])
    for col, arr in (("PRED", fit.pred), ("IPRED", fit.ipred), ("IWRES", fit.iwres),
                     ("CWRES", fit.cwres)):
        want = np.concatenate([arr[i, :s.ts.size] for i, s in enumerate(data.subjects)])
        np.testing.assert_array_equal(tab[col][obs], want)
        assert np.all(np.isnan(tab[col][~obs]))
    np.testing.assert_array_equal(tab["MDV"][obs], np.isnan(tab["DV"][obs]).astype(int))
    assert ragged.sum() == obs.sum() and seen_rows.sum() == (tab["MDV"][obs] == 0).sum()
    ids = tab["ID"].astype(int)
    for i, s in enumerate(data.subjects):
        np.testing.assert_array_equal(tab["ETA1"][ids == s.id], fit.etas[i, 0])
        np.testing.assert_array_equal(tab["ETA2"][ids == s.id], fit.etas[i, 1])
    # an observation after the dose row at its time stays after it (it reads the
    # post-dose state), as the data's table gave it
    first = np.flatnonzero(ids == 1)[:2]
    assert tab["EVID"][first].tolist() == [1, 0]
    text = path.read_text().splitlines()
    assert text[0].split(",")[:8] == ["ID", "TIME", "DV", "AMT", "EVID", "MDV", "CMT", "RATE"]


def test_plots_draw_the_fit(tmp_path):
    data = table_data()
    fit = fake_fit(data)
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    fig = inference.plot_dv_pred(fit, data)
    assert len(fig.axes) == 2
    for ax, pred in zip(fig.axes, (fit.pred, fit.ipred)):
        points, identity = ax.lines[0], ax.lines[1]
        np.testing.assert_array_equal(points.get_xdata(), pred[seen])
        np.testing.assert_array_equal(points.get_ydata(), ys[seen])
        np.testing.assert_array_equal(identity.get_xdata(), identity.get_ydata())
    assert [ax.get_xlabel() for ax in fig.axes] == ["PRED", "IPRED"]
    fig.savefig(tmp_path / "a.png")
    plt.close(fig)

    fig = inference.plot_cwres(fit, data)
    for ax, x in zip(fig.axes, (ts[seen], fit.pred[seen])):
        np.testing.assert_array_equal(ax.lines[0].get_xdata(), x)
        np.testing.assert_array_equal(ax.lines[0].get_ydata(), fit.cwres[seen])
        levels = sorted(float(line.get_ydata()[0]) for line in ax.lines[1:])
        assert levels == [-2.0, 0.0, 2.0]
    plt.close(fig)

    v = inference.VPC(bin_edges=np.array([0.0, 1.0, 2.0]), bin_times=np.array([0.5, 1.5]),
                      n_obs=np.array([3, 3]), percentiles=np.array([5.0, 50.0, 95.0]),
                      interval=0.9, observed=np.arange(6.0).reshape(2, 3),
                      simulated=np.arange(18.0).reshape(2, 3, 3), times=np.arange(6.0),
                      dv=np.ones(6), n_replicates=10, pred_corrected=False)
    fig = inference.plot_vpc(v)
    ax = fig.axes[0]
    assert len(ax.collections) == 3                                 # one band a percentile
    for j in range(3):
        np.testing.assert_array_equal(ax.lines[1 + j].get_ydata(), v.observed[:, j])
        band = ax.collections[j].get_paths()[0].vertices[:, 1]
        assert band.min() == v.simulated[:, j, 0].min()
        assert band.max() == v.simulated[:, j, 2].max()
    fig.savefig(tmp_path / "vpc.png")
    plt.close(fig)


def test_bad_arguments():
    data = table_data()
    fit = fake_fit(data)
    other = subjects_at([T] * 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="pass the data set the fit was made on"):
        inference.plot_dv_pred(fit, other)
    with pytest.raises(ValueError, match="pass the data set"):
        inference.population_table(fit, other)
    with pytest.raises(TypeError, match="`params`"):
        inference.vpc(intercept_model(3), other, [1.0, 2.0])
    with pytest.raises(ValueError, match="`bins`"):
        inference.vpc(intercept_model(3), other, TRUTH, bins=[1.0, 1.0])
    with pytest.raises(ValueError, match="`interval`"):
        inference.vpc(intercept_model(3), other, TRUTH, interval=90)
    with pytest.raises(TypeError, match="`result`"):
        inference.plot_vpc({"observed": 1})
