"""
Is it significant? Single-subject permutation tests
===================================================

An importance time course says how much each feature shapes the neural geometry; it does
not say whether that is more than chance *for this subject* (or this recording, often the
only one with intracranial data).  ``n_null > 0`` answers with permutation tests run inside
the same analysis:

* ``"score"``: is the held-out fit better than with the stimuli's labels shuffled?
* one test per feature: does the feature matter *given the others*?  Its null shuffles the
  stimuli only among those that agree on every other feature, so the other features keep
  their effect in the null data;
* ``"interactions"``: is the geometry non-additive, i.e. does the model with interactions
  predict held-out pairs better than the best additive (diagonal) metric, beyond what data
  with the same main effects would give?

Every null dataset is one more model in the engine's stack, and the same shuffles serve
every time point, so ``pvalues_fwe`` controls the family-wise error over the time points
*of each test* (maximum statistic).  ``pvalues_fwe_tests`` corrects over the time points
*and* the tests (Holm's step-down over the tests on top of ``pvalues_fwe``), for the claim
"nothing anywhere is a false positive".  The calibration figures (false-positive rates on
pure noise, power on injected effects) are on the method page.
"""
# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scipy.io

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs

# %%
# One EEG subject
# ---------------
# A simulated subject: ``shape`` is encoded from 100 to 300 ms, ``colour`` never (a
# control).  99 null datasets give p-values down to 1/100.
data, features, times = simulate_epochs(
    n_trials=48, n_channels=16, n_times=20, sfreq=40.0, tmin=-0.1,
    windows={"shape": (0.1, 0.3), "colour": None}, amplitude=0.8, random_state=3)
res = mlem_neuro.mlem_array(data, features, times=times, n_null=99, random_state=0)
print(res.tests)

# %%
# Three kinds of p-values, each ``(n_times, n_tests)``, for three families:
#
# * ``pvalues``: one time point of one test (a time point and test chosen in advance);
# * ``pvalues_fwe``: corrected over the time points of each test on its own;
# * ``pvalues_fwe_tests``: corrected over the time points and the four tests together.
#
# Bars under the curves mark where a p-value is below 0.05 (the score's in the lower
# panel); ``corrected="all"`` draws them from ``pvalues_fwe_tests``, so that the chance of
# any false bar in the figure stays at 5 % (the default, ``corrected=True``, corrects
# within each test).
fig = res.plot(corrected="all")

# %%
# The tidy table has the p-values next to the importances:
df = res.to_data_frame()
df[df["pvalue_fwe_tests"] < 0.05][["time", "term", "importance", "pvalue", "pvalue_fwe",
                                   "pvalue_fwe_tests"]]

# %%
# ``significant(test, corrected=...)`` gives the mask of the significant time points, per
# test (``corrected=True``) or with every test accounted for (``corrected="all"``).  With
# 99 nulls and 4 tests the smallest p-value corrected over the tests is 4/100: only time
# points where no null beat the observed statistic pass (use more nulls, e.g. 199 or
# 999, for room).
for test in res.tests:
    per_test = res.times[res.significant(test)]
    overall = res.times[res.significant(test, corrected="all")]
    print(f"{test:>12}: per test " + (", ".join(f"{t:.3f}" for t in per_test) or "nowhere")
          + "; over all tests " + (", ".join(f"{t:.3f}" for t in overall) or "nowhere"))

# %%
# Two features both binary, with interactions modelled: the interaction test asks whether
# pairs differing in both features sit where an additive metric puts them.  ``shape`` and
# ``colour`` are coded additively here, so the corrected test should stay quiet; among 20
# uncorrected p-values one or two below 0.05 are expected by chance, which is why the
# corrected ones are the ones to read.  (A *term-level* importance of ``shape:colour``
# would not be evidence either way: with two-valued features it is not identifiable, see
# the method page.)
k = res.tests.index("interactions")
print(f"interaction test: smallest p {res.pvalues[:, k].min():.2f} uncorrected, "
      f"{res.pvalues_fwe[:, k].min():.2f} corrected over the {res.n_times} time points")


# %%
# An intracranial pseudo-population
# ---------------------------------
# 64 macaque IT units, 7 objects × 3 positions (as in the intracranial tutorial), binned to
# 100 ms rates every 100 ms.  Where the recordings are absent, a simulated array stands in.
def find_data(name):
    here = [Path(__file__).resolve().parent] if "__file__" in globals() else []
    for start in here + [Path.cwd()]:
        for folder in [start, *start.parents]:
            candidate = folder / "shared" / "data" / name
            if candidate.is_dir():
                return candidate
    return None


folder = find_data("zhang_desimone_it_units_part1")
unit_times = np.arange(-500, 500) / 1000


def unit_rates(path, n_groups=4):
    """(conditions × pseudo-trials, 1000 ms) rates of one unit, and the conditions."""
    mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
    rate = mat["raster_data"].astype(float) * 1000
    labels = np.asarray(mat["raster_labels"].combined_ID_position)
    rows, conditions = [], []
    for condition in sorted(set(labels)):
        for group in np.array_split(np.flatnonzero(labels == condition), n_groups):
            rows.append(rate[group].mean(axis=0))
            conditions.append(condition)
    return np.array(rows), conditions


if folder is not None:
    units = [unit_rates(f) for f in sorted((folder / "raster_mat").glob("*.mat"))]
    rates = np.stack([u[0] for u in units], axis=1)          # (pseudo-trials, units, ms)
    table = pd.DataFrame([c.split("_") for c in units[0][1]], columns=["object", "position"])
else:
    print("IT recordings not found: a simulated array instead ('object' encoded from 100 "
          "to 450 ms, 'position' never).")
    rates, table, _ = simulate_epochs(
        n_trials=84, n_channels=64, n_times=len(unit_times), sfreq=1000.0,
        tmin=unit_times[0], windows={"object": (0.1, 0.45), "position": None}, n_levels=3,
        amplitude=0.7, random_state=0)
    table["position"] = table["position"].cat.rename_categories(["lower", "middle",
                                                                 "upper"])
# unordered: these units' distances do not grow with the distance between positions (the
# intracranial tutorial measures it); an ordinal code hid position's effect
table["position"] = pd.Categorical(table["position"], categories=["lower", "middle", "upper"])
it = mlem_neuro.mlem_array(rates, table, times=unit_times, window=0.1, decim=100,
                           tmin=-0.1, tmax=0.4, n_null=49, random_state=0)
fig = it.plot()

# %%
# p-values corrected over the time points of each test (rows: tests; 49 nulls, so the
# smallest is 0.02).  Corrected over the four tests as well, none could go below
# 4/50 = 0.08 (``significant(..., corrected="all")`` warns so): the statements below are
# per test; a claim over all tests needs ``n_null >= 80``.
# On the IT recordings object identity, position (tested among stimuli of the same
# object) and the held-out score pass the corrected test from 200 ms on; the test of
# interactions does not (no evidence that the codes interact).  Coded as ordinal (lower
# < middle < upper), position passes only at the last time point (corrected p 0.04 at
# 400 ms; 0.50 and 0.12 at 200 and 300 ms): the ordinal code tests a distance that grows
# with the gap between positions, which these units show far less.
pd.DataFrame(it.pvalues_fwe.T, index=it.tests,
             columns=[f"{t:.1f} s" for t in it.times]).round(2)

# %%
# What the tests say, and what they do not
# ----------------------------------------
# * A corrected p-value below 0.05 at a time point means: under the null (the feature
#   carries no information given the others), a statistic this large at *any* time point
#   would have appeared in fewer than 5 % of the shuffles.
# * Time points are many, and so are tests.  ``pvalues_fwe`` (maximum over time points of
#   each null; ``corrected=True`` or ``"models"``) keeps the chance of a false positive
#   *within one test* at the nominal level, but an analysis runs several tests: on pure
#   noise (1,000 datasets of 40 trials × 16 channels × 10 time points, two binary features,
#   4 tests, 99 nulls, one 5-fold split: the former defaults) 10.8 % of the datasets had
#   some ``pvalues_fwe`` below 0.05 (95 % interval 9.0–12.9 %).  ``pvalues_fwe_tests``
#   (``corrected="all"``) keeps the chance of *any* false positive, at any time point in
#   any test, at or below the nominal level: 2.5 % (1.7–3.7 %) of the same datasets.
#   Uncorrected ``pvalues`` are for a time point and test chosen in advance.
# * With 49 or 99 shuffles the smallest possible p-value is 1/50 or 1/100, and corrected
#   over ``k`` tests ``k`` times that: use more for stricter levels or more tests.
# * The group level (several subjects) is :func:`mlem_neuro.stats.permutation_cluster_test`,
#   on importances, and for interactions on the held-out gain over each subject's
#   additive analysis (``measure="interactions"``); these tests are for one subject or
#   one recording.
plt.show()
