"""Many-subject data sets (`models.PopulationDataset`) against the published table and
hand-built long-format tables."""

import numpy as np
import pytest

import models

# R's datasets::Theoph (Boeckmann, Sheiner and Beal 1994), subject 1, as printed by R.
THEOPH_1_TIME = [0.0, 0.25, 0.57, 1.12, 2.02, 3.82, 5.10, 7.03, 9.05, 12.12, 24.37]
THEOPH_1_CONC = [0.74, 2.84, 6.57, 10.50, 9.66, 8.58, 8.36, 7.47, 6.89, 5.94, 3.28]
THEOPH_WT = [79.6, 72.4, 70.5, 72.7, 54.6, 80.0, 64.6, 70.5, 86.4, 58.2, 65.0, 60.5]
THEOPH_DOSE = [4.02, 4.40, 4.53, 4.40, 5.86, 4.00, 4.95, 4.53, 3.10, 5.50, 4.92, 5.30]


def test_theophylline_is_the_published_table():
    data = models.load_dataset("theophylline")
    assert "theophylline" in models.list_datasets()
    assert isinstance(data, models.PopulationDataset)
    assert data.n_subjects == 12 and data.ids == tuple(range(1, 13))
    assert all(s.ts.size == 11 for s in data.subjects)
    s1 = data.subjects[0]
    np.testing.assert_array_equal(s1.ts, THEOPH_1_TIME)
    np.testing.assert_array_equal(s1.ys, THEOPH_1_CONC)
    np.testing.assert_array_equal(data.covariate("WT"), THEOPH_WT)
    times, sizes = data.jumps(n_states=2)
    assert times.shape == (12, 1) and sizes.shape == (12, 1, 2)
    np.testing.assert_array_equal(times[:, 0], 0.0)
    np.testing.assert_array_equal(sizes[:, 0, 0], THEOPH_DOSE)  # oral: into the gut
    np.testing.assert_array_equal(sizes[:, 0, 1], 0.0)
    assert np.all(np.concatenate([s.obs_cmt for s in data.subjects]) == 1)  # central
    assert "Boeckmann" in data.source and "mg/L" in data.units


def _table():
    # Subject 7: two doses into the gut, a missing value; subject "b": one dose into the
    # central compartment, fewer observations; each subject's rows one block in time order
    # (as NONMEM requires).
    rows = [
        # ID, TIME, DV, AMT, EVID, CMT, WT, AGE
        (7, 0.0, None, 100.0, 1, 1, 70.0, 40),
        (7, 1.0, 2.0, None, 0, 2, 70.0, 40),
        (7, 2.0, None, None, 0, 2, 70.0, 40),
        (7, 12.0, 1.0, None, 0, 2, 70.0, 40),
        (7, 12.0, None, 100.0, 1, 1, 70.0, 40),
        (7, 13.0, 3.0, None, 0, 2, 70.0, 40),
        ("b", 0.0, None, 50.0, 1, 2, 55.0, 30),
        ("b", 0.5, 9.0, None, 0, 2, 55.0, 30),
        ("b", 4.0, 3.0, None, 0, 2, 55.0, 30),
    ]
    cols = ("ID", "TIME", "DV", "AMT", "EVID", "CMT", "WT", "AGE")
    return {c: [r[i] for r in rows] for i, c in enumerate(cols)}


def test_long_table_gives_ragged_padded_arrays():
    data = models.PopulationDataset.from_table(_table())
    assert data.ids == (7, "b") and data.covariate_names == ("WT", "AGE")
    ts, ys = data.observations()
    np.testing.assert_array_equal(ts, [[1.0, 2.0, 12.0, 13.0], [0.5, 4.0, 4.0, 4.0]])
    np.testing.assert_array_equal(np.isnan(ys), [[False, True, False, False],
                                                 [False, False, True, True]])
    np.testing.assert_array_equal(ys[0, [0, 2, 3]], [2.0, 1.0, 3.0])
    times, sizes = data.jumps(n_states=2, scale=[0.5, 1.0])
    np.testing.assert_array_equal(times, [[0.0, 12.0], [0.0, np.inf]])
    np.testing.assert_array_equal(sizes[0], [[50.0, 0.0], [50.0, 0.0]])
    np.testing.assert_array_equal(sizes[1], [[0.0, 50.0], [0.0, 0.0]])
    np.testing.assert_array_equal(data.covariate("AGE"), [40.0, 30.0])
    one = data.subject_dataset(1)
    np.testing.assert_array_equal(one.ts, [0.5, 4.0])


def test_long_table_from_a_dataframe_and_a_csv(tmp_path):
    pd = pytest.importorskip("pandas")
    table = _table()
    from_df = models.PopulationDataset.from_table(pd.DataFrame(table), covariates=["WT"])
    lines = ["# source: hand-made", ",".join(table)]
    for r in zip(*table.values()):
        lines.append(",".join("." if v is None else str(v) for v in r))
    path = tmp_path / "long.csv"
    path.write_text("\n".join(lines) + "\n")
    from_csv = models.PopulationDataset.from_table(path, covariates=["WT"])
    for d in (from_df, from_csv):
        ts, ys = d.observations()
        np.testing.assert_array_equal(ts[1], [0.5, 4.0, 4.0, 4.0])
        np.testing.assert_array_equal(d.covariate("WT"), [70.0, 55.0])
    assert from_csv.source == "hand-made"


def _with(changes):
    """`_table` with ``{(column, row): value}`` changed."""
    table = _table()
    for (col, row), value in changes.items():
        table[col][row] = value
    return table


@pytest.mark.parametrize("table, match", [
    (_with({("DV", 7): None, ("DV", 8): None}), "subject 'b' has no observations"),
    (_with({("WT", 7): float("nan")}), "subject 'b': covariate 'WT' is missing"),
    (_with({("WT", 7): 56.0}), "subject 'b': covariate 'WT' changes"),
    (_with({("TIME", 3): 20.0}), "subject 7: rows are not in time order"),
    (_with({("EVID", 1): 5}), "subject 7: EVID 5"),  # EVID 2 (other event) is read now
    (_with({("AMT", 6): None}), "subject 'b': the dose at TIME 0 .* has no AMT"),
])
def test_bad_tables_name_the_subject(table, match):
    with pytest.raises(ValueError, match=match):
        models.PopulationDataset.from_table(table)


def test_bad_columns_and_compartments_are_named():
    with pytest.raises(ValueError, match=r"no column 'SUBJ' \(the `id` column\)"):
        models.PopulationDataset.from_table(_table(), id="SUBJ")
    data = models.PopulationDataset.from_table(_with({("CMT", 6): 3}))
    with pytest.raises(ValueError, match=r"subject 'b' has a dose into compartment CMT=3"):
        data.jumps(n_states=2)
    with pytest.raises(ValueError, match="no covariate 'HT'"):
        data.covariate("HT")
