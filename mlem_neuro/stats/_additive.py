"""Pairs of per-subject results for the group test of interactions: each subject analysed
with interactions (the default SPD metric) and with the additive (diagonal) metric."""
from __future__ import annotations

import warnings

NO_ADDITIVE = ("the test of interactions compares each subject's models with interactions to "
               "the same subject's additive ones: pass additive=[...] (the same subjects, in "
               "the same order, analysed with constraint='diagonal').")


def _interacts(result):
    """Whether ``result``'s metric has interaction weights."""
    return bool(result.settings.get("interactions")) and result.settings.get(
        "constraint") in ("spd", "none")


def check_pairs(results, additive, same_space):
    """Check that ``additive[k]`` is ``results[k]``'s subject analysed additively.

    ``same_space(add, full, what)`` raises when the two results' models (times, voxels)
    differ.  Warns when a pair's folds differ (valid, but the gain is noisier).
    """
    if len(additive) != len(results):
        raise ValueError(f"additive must hold one result per subject of results "
                         f"({len(results)}); got {len(additive)}")
    refolded = []
    for k, (full, add) in enumerate(zip(results, additive)):
        if not _interacts(full) or len(full.feature_names) < 2:
            raise ValueError(f"result {k} has no interactions to test (settings "
                             f"interactions={full.settings.get('interactions')}, constraint="
                             f"{full.settings.get('constraint')!r}, features "
                             f"{full.feature_names}): analyse with interactions=True and "
                             "constraint='spd' (the defaults) and at least 2 features.")
        if _interacts(add):
            raise ValueError(f"additive result {k} models interactions: analyse the "
                             "additive models with constraint='diagonal'.")
        if list(add.feature_names) != list(full.feature_names):
            raise ValueError(f"additive result {k} has features {add.feature_names}, result "
                             f"{k} {full.feature_names}: pair each subject's two analyses.")
        same_space(add, full, f"additive result {k}")
        if add.n_folds != full.n_folds or any(
                add.settings.get(key) != full.settings.get(key)
                for key in ("fold_test_indices", "n_trials")):
            refolded.append(k)
    if refolded:
        warnings.warn(f"{len(refolded)} of {len(results)} subjects (e.g. subject "
                      f"{refolded[0]}) have other folds in additive than in results: pass "
                      "the same cv and an int random_state to both analyses, so that each "
                      "subject's two scores come from the same held-out pairs (the gain is "
                      "then far less noisy).", UserWarning, stacklevel=4)
