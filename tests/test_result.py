"""`inference.FitResult`: the waterfall plot's axis shows a reference objective that the
starts missed (a missed optimum must not fall off a log axis)."""

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from inference import FitResult  # noqa: E402


def _result(losses):
    n = len(losses)
    return FitResult.of_starts(
        {"k": np.arange(n, dtype=float)}, losses, sort=True, loss_history=np.zeros((1, n)),
        n_records=1, n_records_per_start=np.ones(n, int), n_grad_evals=1, wall_time=0.0,
        status=np.zeros(n, int), objective="mle", n_steps=1, max_error_ratio=np.zeros(n))


def _reference_line_y(ax):
    (line,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    return line.get_ydata()[0]


def test_waterfall_reference_below_every_start_stays_on_the_axis():
    # the starts stopped at 147.544 and 150; the known optimum is 138.222: the axis starts at
    # the reference (y = 1) and the best start sits 9.322 above it, both positive on a log axis
    ax = _result([150.0, 147.544, np.inf]).plot_waterfall(reference=138.222,
                                                         reference_label="nominal")
    assert ax.get_yscale() == "log"
    assert _reference_line_y(ax) == pytest.approx(1.0)
    best_y = min(np.min(c.get_offsets()[:, 1]) for c in ax.collections if len(c.get_offsets()))
    assert best_y == pytest.approx(147.544 - 138.222 + 1.0)
    assert "nominal" in ax.get_ylabel() and "1 failed" in ax.get_xlabel()


def test_waterfall_reference_above_the_best_start_is_drawn_where_it_lies():
    ax = _result([10.0, 12.0]).plot_waterfall(reference=11.0)
    assert _reference_line_y(ax) == pytest.approx(2.0)
    assert ax.get_ylabel() == "objective - best + 1"
    with pytest.raises(ValueError, match="reference"):
        _result([10.0]).plot_waterfall(reference=np.nan)
