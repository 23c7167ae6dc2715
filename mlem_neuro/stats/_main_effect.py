"""The checks every group test of a feature's main effect makes (time courses and brain
maps)."""
from __future__ import annotations


def check_main_effect_term(results, term, interactions_hint):
    """Index of feature ``term`` in every result's ``main_effect``, checked: a feature
    (not an interaction term, not None), the same features in every result, main effects
    computed.  ``interactions_hint`` names how the caller tests interactions."""
    names = list(results[0].feature_names)
    if term not in names:
        if term is None:
            what = "name the feature whose main effect to test"
        elif term in results[0].terms:
            what = (f"{term!r} is an interaction term, and measure='main_effect' tests a "
                    f"feature's main effect (test whether features interact with "
                    f"{interactions_hint})")
        else:
            what = f"unknown feature {term!r}"
        raise ValueError(f"{what}: term must be one of the features {names}.")
    for k, r in enumerate(results[1:], start=1):
        if list(r.feature_names) != names:
            raise ValueError(f"result {k} has other features than result 0 "
                             f"({list(r.feature_names)} vs {names}); use the same features "
                             "for every subject.")
    missing = [k for k, r in enumerate(results) if r.main_effect is None]
    if missing:
        raise ValueError(f"{len(missing)} of {len(results)} results (e.g. result "
                         f"{missing[0]}) have no main_effect (main_effect is None: a file "
                         "saved before results kept it, or a result built without it); "
                         "rerun the analysis of those subjects to test "
                         "measure='main_effect'.")
    return names.index(term)
