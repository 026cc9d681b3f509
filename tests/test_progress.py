"""Progress of long runs (inference/_progress.py): with stderr not a terminal (a log file,
CI, captured output) a sampler or fit prints a few plain lines, never one per iteration;
``progress=False`` prints none."""

import time
from types import SimpleNamespace

import numpy as np
import optax
import pytest

import inference
from inference import _progress


def _lines(err: str, start: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(start)]


def test_plain_lines_are_sparse_and_say_the_phase(capfd):
    bar = _progress.progress_bar(None, total=1000, done=0, desc="job",
                                 phases=(("warmup", 400), ("sampling", 600)))
    assert isinstance(bar, _progress._Lines)  # pytest's captured stderr is no terminal
    bar.interval = 0.0
    for i in range(1000):
        bar.set_postfix(step_size=f"{0.1 + i:.3g}")
        bar.update(1)
    bar.close()
    lines = _lines(capfd.readouterr().err, "job: ")
    # one line per tenth of the total, whatever the number of updates
    assert len(lines) == 10, lines
    assert lines[0].startswith("job: warmup 100/400, ") and lines[0].endswith(" step size 99.1")
    assert lines[4].startswith("job: sampling 100/600, ")
    assert lines[-1].startswith("job: sampling 600/600, ")
    # the interval holds lines back however far the count advances
    slow = _progress._Lines(total=1000, done=0, desc="slow", interval=3600.0)
    for _ in range(1000):
        slow.update(1)
    slow.close()
    assert _lines(capfd.readouterr().err, "slow: ") == []


def test_heartbeat_while_nothing_advances(capfd):
    bar = _progress._Lines(total=10, done=0, desc="long", heartbeat=0.2)
    time.sleep(1.0)
    bar.close()
    lines = _lines(capfd.readouterr().err, "long: ")
    assert 1 <= len(lines) <= 10 and lines[0].startswith("long: 0/10, "), lines


def test_a_heartbeat_after_a_phase_ends_names_the_next_phase(capfd):
    # warmup done, the first sampling chunk still running: "sampling 0/20", not a warmup
    # that looks stuck at its end
    bar = _progress._Lines(total=30, done=0, desc="ph", phases=(("warmup", 10), ("sampling", 20)),
                           interval=0.0, every=10, heartbeat=0.2)
    bar.update(10)
    time.sleep(1.0)
    bar.close()
    lines = [ln.split(", ")[0] for ln in _lines(capfd.readouterr().err, "ph: ")]
    assert lines[0] == "ph: warmup 10/10" and "ph: sampling 0/20" in lines[1:], lines


def test_progress_true_is_a_bar_and_false_nothing():
    from tqdm.auto import tqdm

    bar = _progress.progress_bar(True, total=5, done=0, desc="x")
    assert isinstance(bar, tqdm)
    bar.close()
    assert isinstance(_progress.progress_bar(False, total=5, done=0, desc="x"), _progress._Silent)
    assert isinstance(_progress.progress_bar(None, total=5, done=5, desc="x"), _progress._Silent)


def test_sampler_reports_iterations_and_the_chains_step_size(capfd):
    from inference.sampling._sample import _advancer

    bar = _progress._Lines(total=30, done=0, desc="s", every=10, interval=0.0,
                           phases=(("warmup", 10), ("sampling", 20)))
    advance = _advancer(bar)
    state = SimpleNamespace(chains=SimpleNamespace(adapt_state=SimpleNamespace(
        step_size=np.array([0.01, 0.02, 0.04]))))
    advance(10, state)
    advance(20, state)
    bar.close()
    lines = _lines(capfd.readouterr().err, "s: ")
    assert [ln.split(", ")[0] for ln in lines] == ["s: warmup 10/10", "s: sampling 20/20"]
    assert all(ln.endswith(", step size 0.02") for ln in lines), lines


@pytest.mark.slow  # ~20 s on a loaded 2-core machine; the test above is its cheap sibling
def test_sample_prints_lines_to_a_non_terminal(lynx, capfd, monkeypatch):
    m, data = lynx
    monkeypatch.setattr(_progress, "INTERVAL", 0.0)
    inference.sample(m, data, num_warmup=20, num_samples=20, num_chains=2, seed=0)
    err = capfd.readouterr().err
    assert _lines(err, "fit lynx_hare: ")  # the MAP fit that places the chains
    lines = _lines(err, "sample lynx_hare (2 chains): ")
    assert any(ln.startswith("sample lynx_hare (2 chains): warmup ") for ln in lines), lines
    assert lines[-1].startswith("sample lynx_hare (2 chains): sampling 20/20, ")
    assert all(" s, step size " in ln for ln in lines), lines
    assert len(lines) <= 12, lines


def test_fit_prints_lines_unless_progress_is_false(lynx, capfd, monkeypatch):
    m, data = lynx
    monkeypatch.setattr(_progress, "INTERVAL", 0.0)
    kw = dict(steps=30, n_starts=2, seed=0, optimizer=optax.adam(1e-2))
    inference.fit(m, data, **kw)
    lines = _lines(capfd.readouterr().err, "fit lynx_hare: ")
    assert lines and lines[-1].startswith("fit lynx_hare: 30/30, ") and "best" in lines[-1]
    assert len(lines) <= 10, lines
    inference.fit(m, data, progress=False, **kw)
    assert _lines(capfd.readouterr().err, "fit lynx_hare: ") == []
