"""The demo command's pieces and the command line's error handling.

The README's examples are run by tests/test_readme.py.
"""
import pytest


def test_simulation_table_compares_models():
    from mlem_neuro.cli import _simulation_figure, _simulation_table

    lines = []
    table = _simulation_table(40, 3, 20, noise_levels=(0.1, 1.0), seeds=(0, 1),
                              log=lines.append)
    assert list(table["model"]) == ["MLEM", "FR-RSA-I"] * 4
    assert list(table["seed"]) == [0, 0, 1, 1] * 2
    assert table["frobenius_error"].between(0, 2).all()
    assert (table["steps"] >= 1).all() and len(lines) == 5
    assert "(2 seeds)" in lines[0] and lines[-1].endswith("of 4")
    # low noise predicts held-out distances better than high noise
    by_noise = table.groupby("noise")["test_spearman"].mean()
    assert by_noise[0.1] > by_noise[1.0]
    assert len(_simulation_figure(table).axes) == 3


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
