"""The defaults are defined once (:class:`mlem_neuro.core.options.MLEMOptions`): every
entry point's signature agrees with it (the command line's defaults are the API's:
``tests/test_cli_defaults.py``), and ``n_repeats="auto"`` resolves as documented."""
import inspect

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.crossval import AUTO_FOLDS, check_cv, resolve_n_repeats

ENTRIES = {"mlem_array": mlem_neuro.mlem_array, "mlem_epochs": mlem_neuro.mlem_epochs,
           "mlem_searchlight": mlem_neuro.mlem_searchlight,
           "mlem_roi": mlem_neuro.mlem_roi, "mlem_stcs": mlem_neuro.mlem_stcs,
           "MLEM": mlem_neuro.MLEM.__init__}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_signature_defaults_are_the_options_defaults(entry):
    defaults = MLEMOptions()
    checked = 0
    for p in inspect.signature(ENTRIES[entry]).parameters.values():
        if p.name in MLEMOptions.names() and p.default is not inspect.Parameter.empty:
            want = getattr(defaults, p.name)
            assert p.default == want and type(p.default) is type(want), \
                f"{entry}({p.name}={p.default!r}) but MLEMOptions has {want!r}"
            checked += 1
    assert checked >= 8


def test_auto_repeats_follow_the_number_of_stimuli_and_models():
    low, high = AUTO_FOLDS
    assert resolve_n_repeats("auto", 2, 200, 100) == 10        # the reference
    assert resolve_n_repeats("auto", 2, 400, 100) == low // 2
    assert resolve_n_repeats("auto", 2, 40, 100) == high // 2
    assert resolve_n_repeats("auto", 2, 200, 1) == high // 2    # one region: the most
    assert resolve_n_repeats("auto", 2, 96, 38_000) == low // 2  # a whole brain: the least
    counts = [resolve_n_repeats("auto", 2, n, 100) for n in range(20, 400, 7)]
    assert counts == sorted(counts, reverse=True)            # fewer stimuli, more repeats
    counts = [resolve_n_repeats("auto", 2, 150, m) for m in range(1, 2000, 37)]
    assert counts == sorted(counts, reverse=True)            # more models, fewer repeats
    # the training cost (folds x stimuli^2 x models) stays that of the reference between
    # the bounds
    for n, m in [(150, 100), (200, 60), (300, 20)]:
        cost = 2 * resolve_n_repeats("auto", 2, n, m) * n**2 * m
        assert cost == pytest.approx(20 * 200**2 * 100, rel=0.1)
    assert resolve_n_repeats("auto", 5, 40) == high // 5     # the same number of folds
    assert resolve_n_repeats("auto", None, 40) == 1           # no cv, splitter: once
    assert resolve_n_repeats("auto", [([0, 1, 2], [3, 4, 5])], 40) == 1
    assert resolve_n_repeats(3, 2, 40) == 3
    folds = check_cv(2, 200, np.random.default_rng(0), n_repeats="auto", n_models=100)
    assert len(folds) == 20


def test_auto_repeats_are_recorded_and_refused_when_misspelt():
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile([True, False], 15)})
    res = mlem_neuro.mlem_array(rng.standard_normal((30, 3, 1)), table, cv=2,
                                n_repeats="auto", max_steps=2, random_state=0,
                                verbose="ERROR")
    assert res.settings["n_repeats"] == "auto"
    assert res.settings["n_repeats_used"] == AUTO_FOLDS[1] // 2
    assert res.settings["n_folds"] == AUTO_FOLDS[1]
    with pytest.raises(ValueError, match="'auto' or an int >= 1"):
        MLEMOptions(n_repeats=0)
    with pytest.raises(TypeError, match="'auto' or an int"):
        MLEMOptions(n_repeats="many")
