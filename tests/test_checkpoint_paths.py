"""Checkpoint paths: a path that cannot be written is refused before any work, and a save
that fails mid-run is a warning, never the loss of the run's result.

Independent references: the file system itself (a file where a directory is needed, a
directory as the path, a read-only directory) and a save made to fail as a full disk does.
"""

import errno
import os
import pickle

import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
import pytest

import inference
import inference._checkpoint as ckpt
import models
from inference.optimize import _fit
from inference.sampling import _sample

TS = np.linspace(0.25, 3.0, 8)


@pytest.fixture(scope="module")
def decay():
    """dy/dt = -k y, y(0) = 2, Normal noise: the cheapest model to fit and sample."""
    m = models.ODEModel(name="decay", vector_field=lambda t, y, p: -p["k"] * y,
                        priors={"k": dist.LogNormal(0.0, 0.5), "sigma": dist.HalfNormal(1.0)},
                        y0=jnp.array([2.0]))
    ys = (2.0 * np.exp(-0.8 * TS) + 0.03 * np.cos(7 * TS))[:, None]
    return m, models.Dataset(ts=TS, ys=ys)


def run_fit(m, data, path, steps=3):
    return inference.fit(m, data, steps=steps, n_starts=2, checkpoint=path, checkpoint_every=1,
                         optimizer=optax.adam(5e-2), progress=False)


def run_sample(m, data, path):
    return inference.sample(m, data, num_warmup=10, num_samples=10, num_chains=1,
                            checkpoint=path, checkpoint_every=5, progress=False,
                            init={"k": jnp.asarray(0.8), "sigma": jnp.asarray(0.1)})


RUNS = {"fit": run_fit, "sample": run_sample}


@pytest.fixture
def no_work(monkeypatch):
    """Building the problem (the first work of `fit` and `sample`) fails the test: a bad
    path must be refused before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("the run started before its checkpoint path was checked")

    for module in (_fit, _sample):
        monkeypatch.setattr(module, "problem_of", refuse)


def _read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    if os.access(d, os.W_OK):  # root writes anyway
        d.chmod(0o755)
        pytest.skip("chmod does not stop this user from writing")
    return d


@pytest.mark.parametrize("run", RUNS)
def test_a_path_under_a_file_is_refused_before_any_work(run, decay, tmp_path, no_work):
    (tmp_path / "afile").write_text("not a directory")
    path = tmp_path / "afile" / "sub" / "fit.pkl"
    with pytest.raises(ValueError, match=r"`checkpoint`: cannot write .*fit\.pkl.*afile' is a "
                                         r"file, not a directory"):
        RUNS[run](*decay, path)
    assert (tmp_path / "afile").read_text() == "not a directory"


@pytest.mark.parametrize("run", RUNS)
def test_a_directory_as_the_path_is_refused_before_any_work(run, decay, tmp_path, no_work):
    with pytest.raises(ValueError, match=r"`checkpoint`: .* is a directory; pass a file path"):
        RUNS[run](*decay, tmp_path)
    with pytest.raises(ValueError, match=r"`checkpoint`: .* is a directory"):
        RUNS[run](*decay, f"{tmp_path / 'new'}{os.sep}")
    with pytest.raises(ValueError, match=r"`checkpoint` must be a file path"):
        RUNS[run](*decay, "")


@pytest.mark.parametrize("run", RUNS)
def test_a_read_only_directory_is_refused_before_any_work(run, decay, tmp_path, no_work):
    d = _read_only_dir(tmp_path)
    try:
        for path in (d / "fit.pkl", d / "sub" / "fit.pkl"):
            with pytest.raises(ValueError, match=r"`checkpoint`: cannot write .*fit\.pkl.*"
                                                 r"Permission denied"):
                RUNS[run](*decay, path)
        assert list(d.iterdir()) == []
    finally:
        d.chmod(0o755)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("run", RUNS)
def test_an_uncreatable_directory_is_refused_before_any_work(run, decay, no_work):
    """/proc takes no new directories, whoever asks (root included)."""
    with pytest.raises(ValueError, match=r"`checkpoint`: cannot write '/proc/gradsolve-none/"
                                         r"run\.pkl': No such file or directory"):
        RUNS[run](*decay, "/proc/gradsolve-none/run.pkl")


def test_the_check_writes_what_a_save_needs_and_leaves_nothing(tmp_path):
    """A writable new path: its directories are made, no file is left in them; a bad one
    names the reason, with no confusing reference to another file."""
    path = tmp_path / "a" / "b" / "run.pkl"
    ckpt.check_path(path)
    ckpt.check_path(None)
    assert (tmp_path / "a" / "b").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []
    (tmp_path / "a" / "b" / "f").write_text("")
    with pytest.raises(ValueError, match=r"'.*f' is a file, not a directory"):
        ckpt.check_path(tmp_path / "a" / "b" / "f" / "g" / "run.pkl")
    with pytest.raises(ValueError, match=r"`checkpoint` must be a file path, got 3"):
        ckpt.check_path(3)


def _disk_full(monkeypatch):
    """Every save fails as it would on a full disk."""
    def full(path, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))

    monkeypatch.setattr(ckpt, "save", full)


def test_a_failing_save_warns_and_the_fit_returns_its_result(decay, tmp_path, monkeypatch):
    _disk_full(monkeypatch)
    path = tmp_path / "fit.pkl"
    with pytest.warns(RuntimeWarning, match=r"could not save the checkpoint .*fit\.pkl.*"
                                            r"No space left on device"):
        res = run_fit(*decay, path)
    assert res.n_steps == 3 and np.isfinite(res.loss)
    assert not path.exists()


def test_a_failing_save_warns_and_the_sample_returns_its_draws(decay, tmp_path, monkeypatch):
    _disk_full(monkeypatch)
    path = tmp_path / "run.pkl"
    with pytest.warns(RuntimeWarning, match=r"could not save the checkpoint .*run\.pkl.*"
                                            r"No space left on device"):
        idata = run_sample(*decay, path)
    assert idata.posterior["k"].shape == (1, 10)
    assert not path.exists()


def test_a_save_that_fails_once_leaves_the_last_checkpoint_to_resume(decay, tmp_path,
                                                                     monkeypatch):
    """Saves after the second step fail (the disk filled up): the fit ends with its result,
    the file keeps step 2, and a later call resumes from there."""
    real_save = ckpt.save

    def fills_up(path, fingerprint, state, *info):
        if state.step > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        real_save(path, fingerprint, state, *info)

    path = tmp_path / "fit.pkl"
    monkeypatch.setattr(ckpt, "save", fills_up)
    with pytest.warns(RuntimeWarning, match="No space left"):
        assert run_fit(*decay, path, steps=4).n_steps == 4
    monkeypatch.setattr(ckpt, "save", real_save)
    with open(path, "rb") as fh:
        assert pickle.load(fh).state.step == 2
    assert run_fit(*decay, path, steps=4).n_steps == 4
    assert [p.name for p in tmp_path.iterdir()] == ["fit.pkl"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "run.pkl"
    with pytest.raises(Exception):
        ckpt.save(path, {}, {"unpicklable": lambda: None})
    assert list(tmp_path.iterdir()) == []
