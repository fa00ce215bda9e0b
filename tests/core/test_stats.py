"""The shared statistics module's multiple-comparison corrections and bootstrap test."""

from __future__ import annotations

import math

import numpy as np

from refusalbench.tasks.core.stats import bh_adjust, bootstrap_p_value, holm_adjust


def test_holm_matches_the_step_down_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max
    adjusted = holm_adjust([0.01, 0.04, 0.03, 0.005])
    assert np.allclose(adjusted, [0.03, 0.06, 0.06, 0.02])


def test_bh_matches_the_step_up_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4/1, x4/2, x4/3, x4/4 = 0.02, 0.02, 0.04, 0.04
    adjusted = bh_adjust([0.01, 0.04, 0.03, 0.005])
    assert np.allclose(adjusted, [0.02, 0.04, 0.04, 0.02])


def test_missing_p_values_stay_missing_and_do_not_enlarge_the_family():
    holm = holm_adjust([0.01, float("nan"), 0.02])
    assert math.isnan(holm[1]) and np.allclose(holm[[0, 2]], [0.02, 0.02])
    assert np.isnan(bh_adjust([float("nan")])).all()


def test_bh_is_never_stricter_than_holm():
    p = np.random.default_rng(0).uniform(size=40) ** 3
    assert (bh_adjust(p) <= holm_adjust(p) + 1e-12).all()


def test_bootstrap_p_value_agrees_with_the_percentile_interval():
    rng = np.random.default_rng(1)
    shifted = rng.normal(0.3, 0.1, size=2000)  # interval far from 0
    centred = rng.normal(0.0, 0.1, size=2000)
    assert bootstrap_p_value(shifted, 0.3) < 0.01
    assert bootstrap_p_value(centred, 0.0) > 0.5
    assert bootstrap_p_value(np.zeros(0), 0.1) != bootstrap_p_value(np.zeros(0), 0.1)  # NaN
    assert bootstrap_p_value(np.full(99, 1.0), 1.0) == 2 / 100  # never 0 with finite replicates


def test_interval_and_error_rows_give_each_row_what_the_row_functions_give():
    from refusalbench.tasks.core.stats import interval_and_error_rows, percentile_interval, standard_error

    rng = np.random.default_rng(3)
    values = rng.beta(2, 5, size=(7, 1000))
    values[1, ::3] = np.nan  # some resamples undefined
    values[2] = np.nan  # all of them
    values[3, 1:] = np.nan  # one defined: no standard error
    for block in (values, values.T.copy().T, values[:, :1]):  # also a transposed layout, and one resample
        rows = interval_and_error_rows(block, 0.9)
        for row, (interval, error) in zip(block, rows):
            expected = (percentile_interval(row, 0.9), standard_error(row))
            assert repr((interval, error)) == repr(expected)  # bit for bit, NaN where they give NaN
