"""The demo command's pieces and the command line's error handling.

The README's examples are run by tests/test_readme.py.
"""
import numpy as np
import pytest


def test_simulation_table_compares_models():
    from mlem_neuro.demo import simulation_figure as _simulation_figure
    from mlem_neuro.demo import simulation_table as _simulation_table

    lines = []
    table = _simulation_table(40, 3, noise_levels=(0.0, 1.0), seeds=(0, 1),
                              log=lines.append)
    assert list(table["model"]) == ["MLEM", "FR-RSA-I", "FR-RSA", "W_true"] * 4
    assert list(table["seed"]) == [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4
    assert table["frobenius_error"].between(0, 2).all()
    fitted = table[table["model"] != "W_true"]
    assert (fitted["steps"] >= 1).all() and len(lines) == 9
    assert "(2 seeds)" in lines[0] and "of 4 runs (by noise level 0: " in lines[-1]
    # realisable and noiseless: W_true ranks the held-out pairs exactly
    truth = table[table["model"] == "W_true"].set_index("noise")["test_spearman"]
    assert np.allclose(truth[0.0], 1.0) and (truth[1.0] < 0.99).all()
    # low noise predicts held-out distances better than high noise
    by_noise = fitted.groupby("noise")["test_spearman"].mean()
    assert by_noise[0.0] > by_noise[1.0]
    assert len(_simulation_figure(table).axes) == 3
    # the paper's embedding runs through the same table
    paper = _simulation_table(30, 3, noise_levels=(0.5,), seeds=(0,), log=lines.append,
                              kind="paper", feature_type="binary", n_units=10)
    assert len(paper) == 4 and paper["test_spearman"].notna().all()


@pytest.mark.parametrize("argv, message", [
    (["epochs", "missing-epo.fif", "--out", "x"], "epochs file not found"),
    (["searchlight", "--imgs", "nope.nii", "--events", "e.tsv", "--mask", "m.nii",
      "--t-r", "2", "--out", "x"], "image not found"),
])
def test_cli_bad_paths_give_one_line_errors(argv, message, capsys):
    from mlem_neuro.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_cli_bad_options_exit_nonzero(capsys):
    from mlem_neuro.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["epochs", "f-epo.fif", "--out", "x", "--n-permutations", "0"])
    assert exc.value.code != 0
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--bogus"])
    assert exc.value.code != 0


def test_simulation_table_log_with_one_seed_has_no_nan_spread():
    """With one seed (demo --seeds 1) the log printed 'mean ± nan' (the sd of one value)."""
    from mlem_neuro.demo import simulation_table as _simulation_table

    lines = []
    _simulation_table(30, 2, noise_levels=(0.5,), seeds=(0,), log=lines.append)
    assert not [line for line in lines if "nan" in line], lines
    assert "|W - W_true|_F = 0." in lines[0] and "(1 seeds)" in lines[0]
    assert "±" not in lines[0]
