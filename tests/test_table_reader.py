"""`models.PopulationDataset.from_table` reads a NONMEM-style table as NONMEM (PREDPP) does,
or refuses it naming the subject, the 1-based row, the column and the rule: one test per
rule (R1-R10 of the reader, see docs/nonmem_tables.md), on the theophylline-like setup (an
oral dose into CMT 1, the central compartment CMT 2)."""

import numpy as np
import pytest

import models

read = models.PopulationDataset.from_table


def table(*records):
    """A dict of columns from row dicts; a cell a row does not give is '.' (missing)."""
    cols = list(dict.fromkeys(k for rec in records for k in rec))
    return {c: [rec.get(c, ".") for rec in records] for c in cols}


def obs(t, dv, id=1, **kw):
    return {"ID": id, "TIME": t, "DV": dv, "AMT": ".", "EVID": 0, "CMT": 2, **kw}


def dose(t, amt, id=1, **kw):
    return {"ID": id, "TIME": t, "DV": ".", "AMT": amt, "EVID": 1, "CMT": 1, **kw}


def refused(tab, *fragments, **kwargs):
    """The message of the ValueError reading ``tab`` raises; it holds every fragment."""
    with pytest.raises(ValueError) as info:
        read(tab, **kwargs)
    message = str(info.value)
    for f in fragments:
        assert f in message, (f, message)
    return message


def test_r1_record_order_flags_observations_after_events_at_their_time():
    s = read(table(obs(0.0, 0.1), dose(0.0, 400.0, CMT=2), obs(0.0, 40.0), obs(1.0, 30.0),
                   dose(12.0, 100.0, SS=1, II=12.0), obs(12.0, 9.0),
                   dict(ID=1, TIME=24.0, EVID=3), obs(24.0, 0.0), obs(25.0, 0.5))).subjects[0]
    np.testing.assert_array_equal(s.ts, [0.0, 0.0, 1.0, 12.0, 24.0, 25.0])
    # before the dose row: the trough; after the dose, SS dose and reset rows: after them
    np.testing.assert_array_equal(s.obs_after, [False, True, False, True, True, False])
    np.testing.assert_array_equal(s.obs_rows, [1, 3, 4, 6, 8, 9])
    np.testing.assert_array_equal(read(table(obs(0.0, 1.0), dose(0.0, 4.0))).observations_after(),
                                  [[False]])
    # an observation between two event rows at its time: the core reads before or after all
    refused(table(dose(0.0, 4.0), obs(0.0, 1.0), dose(0.0, 4.0, CMT=2), obs(1.0, 2.0)),
            "subject 1, row 2, column TIME", "between dose or reset rows", "(rows 1 and 3)")
    # an ADDL dose at an observation's time comes after it (fine), unless the observation
    # also comes after an explicit dose row at that time
    s = read(table(dose(0.0, 4.0, ADDL=2, II=12.0), obs(12.0, 1.0), obs(13.0, 2.0))).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [0.0, 12.0, 24.0])
    assert s.obs_after is None
    refused(table(dose(0.0, 4.0, ADDL=2, II=12.0), dose(12.0, 1.0, CMT=2), obs(12.0, 1.0)),
            "subject 1, row 3, column TIME", "additional (ADDL) dose of row 1")
    # rows out of time order
    refused(table(obs(1.0, 2.0), dose(0.0, 4.0)), "subject 1: rows are not in time order",
            "row 2, column TIME: 0 after 1 on row 1")


def test_r2_row_kinds_with_and_without_evid():
    s = read(table(dose(0.0, 4.0), dict(ID=1, TIME=0.5, EVID=2, MDV=1, WT=70.0),
                   obs(1.0, 2.0, MDV=1), obs(2.0, 3.0, MDV=0)), covariates=[]).subjects[0]
    np.testing.assert_array_equal(s.ts, [1.0, 2.0])                # EVID 2 skipped
    assert np.isnan(s.ys[0]) and s.ys[1] == 3.0                     # EVID 0, MDV 1: missing
    # no EVID column: AMT 0 or missing rows are observations (NM-TRAN's rule), never doses
    no_evid = {"ID": [1] * 5, "TIME": [0.0, 0.5, 1.0, 2.0, 3.0],
               "DV": [".", 5.0, 4.0, 3.0, 9.0], "AMT": [320.0, 0.0, 0.0, ".", 0.0],
               "MDV": [1, 0, ".", 0, 1], "CMT": [1, 2, 2, 2, 2]}
    s = read(no_evid).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [0.0])
    np.testing.assert_array_equal(s.dose_amounts, [320.0])
    np.testing.assert_array_equal(s.ts, [0.5, 1.0, 2.0])            # MDV 1: other event
    np.testing.assert_array_equal(s.ys, [5.0, 4.0, 3.0])
    del no_evid["MDV"]
    np.testing.assert_array_equal(read(no_evid).subjects[0].ys, [5.0, 4.0, 3.0, 9.0])
    bad = dict(no_evid, MDV=[0, 0, 0, 0, 0])                        # a dose with MDV 0
    refused(bad, "subject 1, row 1, column MDV", "unclear")
    refused(table(dose(0.0, 4.0), obs(1.0, 2.0, AMT=5.0)), "subject 1, row 2, column AMT",
            "an EVID 0 (observation) row has AMT = 5")
    refused(table(dose(0.0, 4.0), dict(ID=1, TIME=1.0, EVID=3, II=12.0), obs(2.0, 1.0)),
            "subject 1, row 2, column II", "EVID 3 (reset)")
    refused(table(dose(0.0, 4.0, MDV=0), obs(1.0, 2.0)), "subject 1, row 1, column MDV",
            "requires MDV = 1")
    refused(table(dose(0.0, 4.0), obs(1.0, 2.0, MDV=100)), "subject 1, row 2, column MDV",
            "MDV must be 0 or 1")
    refused(table(dose(0.0, 4.0), obs(1.0, ".", MDV=0)), "subject 1, row 2, column DV",
            "reads as an observed 0")
    assert np.isnan(read(table(dose(0.0, 4.0), obs(1.0, "."), obs(2.0, 1.0))).subjects[0].ys[0])
    refused(table(dose(0.0, 4.0, EVID=7), obs(1.0, 2.0)), "subject 1: EVID 7 (row 1, "
            "column EVID) is not one of")


def test_r3_amt_negative_missing_zero_and_steady_state_infusion():
    refused(table(dose(0.0, -4.0), obs(1.0, 2.0)), "subject 1, row 1, column AMT",
            "AMT must be >= 0")
    refused({"ID": [1, 1], "TIME": [0.0, 1.0], "DV": [".", 2.0], "AMT": [-4.0, "."]},
            "subject 1, row 1, column AMT", "AMT must be >= 0")       # no EVID column
    refused(table(dose(0.0, "."), obs(1.0, 2.0)), "subject 1: the dose at TIME 0 (row 1, "
            "column AMT) has no AMT")
    s = read(table(dose(0.0, 0.0, ADDL=2, II=12.0), dose(1.0, 4.0), obs(2.0, 1.0))).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [1.0])              # AMT 0: a no-op dose
    refused(table(dose(0.0, 0.0, SS=1, II=12.0, RATE=10.0), obs(1.0, 2.0)),
            "subject 1, row 1, column AMT", "steady-state constant infusion")


def test_r4_ss1_cancels_pending_addl_doses_and_ss2_keeps_them():
    # ADDL = 5, II = 12 at 0 (doses 0 .. 60), then SS = 1, II = 8 at 30
    tab = table(dose(0.0, 4.0, ADDL=5, II=12.0), obs(29.0, 1.0),
                dose(30.0, 2.0, SS=1, II=8.0), obs(31.0, 2.0), obs(70.0, 0.1))
    s = read(tab).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [0.0, 12.0, 24.0, 30.0])  # 36, 48, 60 gone
    np.testing.assert_array_equal(s.dose_amounts, [4.0, 4.0, 4.0, 2.0])
    np.testing.assert_array_equal(s.dose_ss, [0, 0, 0, 1])
    np.testing.assert_array_equal(s.dose_rows, [1, 1, 1, 3])
    tab["SS"][2] = 2  # SS = 2: added to the state, the ADDL doses continue
    s = read(tab).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [0.0, 12.0, 24.0, 30.0, 36.0, 48.0, 60.0])
    # an SS = 1 row at an ADDL dose's time cancels it, and a dose row before it at that time
    s = read(table(dose(0.0, 4.0, ADDL=5, II=12.0), dose(24.0, 9.0, CMT=2),
                   dose(24.0, 2.0, SS=1, II=8.0, ADDL=2), obs(40.0, 1.0))).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [0.0, 12.0, 24.0, 32.0, 40.0])
    np.testing.assert_array_equal(s.dose_amounts, [4.0, 4.0, 2.0, 2.0, 2.0])
    np.testing.assert_array_equal(s.dose_ss, [0, 0, 1, 0, 0])      # ADDL after SS: not SS
    refused(table(dose(0.0, 100.0, SS=1, II=8.0, RATE=10.0), obs(1.0, 2.0)),
            "subject 1, row 1, column RATE", "AMT / RATE = 10 > II 8")
    refused(table(dose(0.0, 100.0, SS=1, II=8.0, DUR=10.0), obs(1.0, 2.0)),
            "subject 1, row 1, column DUR", "DUR 10 > II 8")
    refused(table(dose(0.0, 100.0, SS=1), obs(1.0, 2.0)), "subject 1, row 1, column II",
            "needs an interval II > 0")


def test_r5_resets_cancel_pending_addl_doses():
    tab = table(dose(0.0, 4.0, ADDL=5, II=12.0), obs(29.0, 1.0),
                dict(ID=1, TIME=30.0, EVID=3), obs(31.0, 0.0), dose(40.0, 2.0), obs(41.0, 1.0))
    s = read(tab).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [0.0, 12.0, 24.0, 40.0])
    np.testing.assert_array_equal(s.resets, [30.0])
    tab["EVID"][2], tab["AMT"][2], tab["CMT"][2] = 4, 50.0, 1   # reset, then a dose
    s = read(tab).subjects[0]
    np.testing.assert_array_equal(s.dose_times, [0.0, 12.0, 24.0, 30.0, 40.0])
    np.testing.assert_array_equal(s.dose_amounts, [4.0, 4.0, 4.0, 50.0, 2.0])
    np.testing.assert_array_equal(s.resets, [30.0])
    # observations at a reset's time: before the reset row the state before, after it after
    s = read(table(dose(0.0, 4.0), obs(5.0, 1.0), dict(ID=1, TIME=5.0, EVID=3),
                   obs(5.0, 0.0), obs(6.0, 0.0))).subjects[0]
    np.testing.assert_array_equal(s.obs_after, [False, True, False])


def test_r6_ids_are_numbers_or_text_spelled_one_way_in_one_block():
    data = read(table(dose(0.0, 4.0, id="007"), obs(1.0, 2.0, id="007"),
                      dose(0.0, 4.0, id="b"), obs(1.0, 2.0, id="b"),
                      dose(0.0, 4.0, id=3.0), obs(1.0, 2.0, id=3.0)))
    assert data.ids == (7, "b", 3) and type(data.ids[2]) is int
    refused(table(dose(0.0, 4.0, id="01"), obs(1.0, 2.0, id="01"), dose(0.0, 4.0, id="1"),
                  obs(1.0, 2.0, id="1")),
            "subject 1, rows 1 and 3, column ID", "one ID written two ways ('01' and '1')")
    assert read(table(dose(0.0, 4.0, id=1.0), obs(1.0, 2.0, id=1))).ids == (1,)  # numbers
    refused(table(dose(0.0, 4.0, id="1.0"), obs(1.0, 2.0, id="1")),
            "subject 1, rows 1 and 2, column ID", "('1.0' and '1')")
    refused(table(dose(0.0, 4.0, id="01"), obs(1.0, 2.0, id=1)), "('01' and '1')")
    refused(table(dose(0.0, 4.0, id=1), obs(1.0, 2.0, id=1), dose(0.0, 4.0, id=2),
                  obs(1.0, 2.0, id=2), obs(2.0, 1.0, id=1)),
            "subject 1, row 5, column ID", "not one block (rows 1-2, then other subjects "
            "from row 3)")
    refused(table(dose(0.0, 4.0), obs(1.0, 2.0, id=float("nan"))),
            "row 2, column ID: the ID is missing")


def test_r7_comment_rows_are_skipped_and_c_is_never_a_covariate():
    tab = table(dose(0.0, 4.0, C="."), obs(1.0, 2.0, C="C"), obs(2.0, 3.0, id=2, C="#"),
                obs(3.0, 4.0, C=0), obs(4.0, 5.0, C="@ below LLOQ"), obs(5.0, 6.0, C=""))
    data = read(tab)
    s = data.subjects[0]
    assert data.ids == (1,) and data.covariate_names == ()
    np.testing.assert_array_equal(s.ts, [3.0, 5.0])
    np.testing.assert_array_equal(s.obs_rows, [4, 6])   # rows counted with the comments
    tab["C"][3] = "x"
    refused(tab, "subject 1, row 4, column C", "a comment flag is C, # or @")
    tab["C"][3] = 0
    tab["AMT"][1] = -1.0                                  # a bad row, commented out
    assert read(tab).n_subjects == 1
    refused(tab, "['C'] are read as the comment/censoring columns, never as covariates",
            covariates=["C"])
    refused(tab, "subject 1, row 4, column ID", "not one block", comment=None,
            covariates=[])                # read, row 3 (subject 2) splits subject 1's rows


def test_r8_censoring_columns():
    tab = table(dose(0.0, 4.0), obs(1.0, 5.0, LLOQ=0.5), obs(2.0, 0.2, LLOQ=0.5),
                obs(3.0, 0.0, LLOQ=0.5, BLQ=1), obs(4.0, 0.7, LLOQ=0.5, BLQ=0))
    data = read(tab)
    s = data.subjects[0]
    assert data.covariate_names == ()                    # LLOQ and BLQ never covariates
    np.testing.assert_array_equal(s.ys, [5.0, 0.5, 0.5, 0.7])
    np.testing.assert_array_equal(s.cens, [0, 1, 1, 0])
    bad = {k: list(v) for k, v in tab.items()}
    bad["LLOQ"][3] = "."
    refused(bad, "subject 1, row 4, column BLQ", "limit of quantification is unknown")
    np.testing.assert_array_equal(read(bad, lloq_column=None, lloq=0.4).subjects[0].ys,
                                  [5.0, 0.4, 0.4, 0.7])  # BLQ = 1 at the number lloq
    bad["LLOQ"][3], bad["DV"][4] = 0.5, 0.3
    refused(bad, "subject 1, row 5, column BLQ", "BLQ = 0 but DV 0.3 is below LLOQ 0.5")
    refused(tab, "both `lloq=0.5`", lloq=0.5)
    refused(tab, "never as covariates", covariates=["LLOQ"])
    # LIMIT on an uncensored row is ignored; -inf on a censored one is plain M3
    tab["LIMIT"] = [".", 0.0, "-inf", "-inf", 0.0]
    assert read(tab).subjects[0].cens.sum() == 2
    tab["LIMIT"][3] = 0.0
    refused(tab, "subject 1, row 4, column LIMIT", "interval censoring")
    refused(table(dose(0.0, 4.0), obs(1.0, 0.4, CENS=1, LLOQ=0.5)),
            "subject 1, row 2, column LLOQ", "make them agree")


def test_r9_observation_compartments():
    tab = table(dose(0.0, 4.0), obs(1.0, 2.0), obs(2.0, 1.0, CMT=0), obs(3.0, 1.0, CMT="."))
    data = read(tab)
    np.testing.assert_array_equal(data.subjects[0].obs_cmt, [1, -1, -1])
    data.check_observed_compartments(2)
    _check_refused(read(table(dose(0.0, 4.0), obs(1.0, 2.0), obs(2.0, 1.0, CMT=3))), 2,
                   "subject 1, row 3, column CMT", "CMT=3, but the model has 2 states")
    _check_refused(read(table(dose(0.0, 4.0), obs(1.0, 2.0), dose(0.0, 4.0, id=2),
                              obs(1.0, 2.0, id=2, CMT=1))), 2,
                   "subject 2, row 4, column CMT", "subject 1's row 2 observes CMT=2")
    refused(table(dose(0.0, 4.0), obs(1.0, 2.0, CMT=-2)), "subject 1, row 2, column CMT",
            "turns a compartment off")
    refused(table(dose(0.0, 4.0, CMT=0), obs(1.0, 2.0)), "subject 1, row 1, column CMT",
            "NONMEM's default dose compartment")


def _check_refused(data, n_states, *fragments):
    with pytest.raises(ValueError) as info:
        data.check_observed_compartments(n_states)
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))


@pytest.mark.parametrize("value", [float("nan"), ".", float("inf"), "-inf"])
def test_r10_time_must_be_finite(value):
    refused(table(dose(0.0, 4.0), obs(value, 2.0)), "subject 1, row 2, column TIME")


def test_a_missing_covariate_column_says_covariates_is_a_list():
    message = refused(table(dose(0.0, 4.0, WT=70.0), obs(1.0, 2.0, WT=70.0)), "no column 'AGE'",
                      "covariates=['<column>', ...]", covariates=["WT", "AGE"])
    assert "covariates='" not in message
    refused(table(dose(0.0, 4.0), obs(1.0, 2.0)), "no column 'TAD' (the `time` column)",
            "time='<your column name>'", time="TAD")


def infusion(t, amt, rate_column="RATE", **kw):
    return dose(t, amt, **{rate_column: 2.0}, **kw)


@pytest.mark.parametrize("column, how", [
    ("RTE", "one letter missing"), ("RTAE", "two letters swapped"),
    ("RAATE", "one letter doubled"), ("Rate", "the same name in other case")])
def test_a_misspelt_reserved_column_is_refused_not_read_as_a_covariate(column, how):
    """A column one typo from RATE, in a table without RATE, would be read as a covariate
    (and, changing within the subject, advised into `time_varying=`), leaving every
    infusion a bolus: refused, naming the reserved column and how to resolve it."""
    tab = table(infusion(0.0, 4.0, column), obs(1.0, 2.0, **{column: 0.0}))
    refused(tab, f"column {column!r} looks like the reserved column 'RATE' ({how})",
            f"rate={column!r}", "covariates=[...]")
    # Either resolution reads it: as the rate (an infusion of 4 at 2 per unit time) ...
    s = read(tab, rate=column).subjects[0]
    np.testing.assert_array_equal(s.dose_rates, [2.0])
    # ... or as a covariate the user names.
    assert column in read(tab, covariates=[column], time_varying=[column]).covariate_names


@pytest.mark.parametrize("column, reserved", [("EVD", "EVID"), ("TMIE", "TIME"),
                                              ("CMMT", "CMT"), ("BQL", "BLQ"),
                                              ("LOQ", "LLOQ"), ("ss", "SS")])
def test_misspellings_of_the_other_reserved_columns_are_refused(column, reserved):
    rows = [dose(0.0, 4.0), obs(1.0, 2.0)]
    if reserved == "TIME":
        rows = [{("TMIE" if k == "TIME" else k): v for k, v in r.items()} for r in rows]
        refused(table(*rows), "no column 'TIME'", "'TMIE' looks like a misspelling of it")
        return
    for r in rows:
        r.pop(reserved, None)
        r[column] = 1
    refused(table(*rows), f"column {column!r} looks like the reserved column {reserved!r}")


@pytest.mark.parametrize("column", ["WT", "AGE", "SEX", "CRCL", "DOSE", "II2", "SX", "RACE",
                                    "DATE", "ULOQ", "DVID", "TIMES", "AMT2"])
def test_real_covariates_near_a_reserved_name_are_read(column):
    """Names one letter from a reserved one that are common covariates (RACE and DATE
    from RATE, ULOQ from LLOQ, II2 from II, SX from SS) keep working."""
    tab = table(dose(0.0, 4.0, **{column: 3.0}), obs(1.0, 2.0, **{column: 3.0}))
    data = read(tab)
    assert column in data.covariate_names
    assert data.subjects[0].covariates[column] == 3.0
