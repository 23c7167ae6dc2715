"""One options contract: every entry point refuses the same bad values with the same message,
before touching any data; cross-validation folds and groups are validated."""
import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import KFold, LeaveOneGroupOut

import mlem_neuro
from mlem_neuro import MLEM
from mlem_neuro.core.options import CHECKS, MLEMOptions, check_params
from mlem_neuro.crossval import DenseRDMSource, check_cv, run_cv

# (parameter, bad value, exception, message) -- the same for every entry point.
BAD = [
    ("lr", 0, ValueError, r"lr must be a finite number > 0; got 0.0"),
    ("lr", -1, ValueError, r"lr must be a finite number > 0; got -1.0"),
    ("lr", float("nan"), ValueError, r"lr must be a finite number > 0; got nan"),
    ("lr", "fast", ValueError, r"lr must be 'auto' or a float > 0; got 'fast'"),
    ("patience", 0, ValueError, r"patience must be an int >= 1; got 0"),
    ("patience", 2.5, TypeError, r"patience must be an int >= 1; got 2.5"),
    ("tol", float("nan"), ValueError, r"tol must be a finite number >= 0; got nan"),
    ("tol", -1, ValueError, r"tol must be a finite number >= 0; got -1.0"),
    ("interactions", "yes", TypeError, r"interactions must be True or False; got 'yes'"),
    ("chunk_size", 0, ValueError, r"chunk_size must be an int >= 1; got 0"),
    ("n_permutations", 0, ValueError, r"n_permutations must be an int >= 1; got 0"),
    ("n_null", -1, ValueError, r"n_null must be an int >= 0; got -1"),
    ("n_null", 2.0, TypeError, r"n_null must be an int >= 0; got 2.0"),
    ("held_out_pairs", "within", ValueError, r"held_out_pairs must be one of \['auto'"),
    ("null", "partial", ValueError, r"null must be one of \['conditional', 'marginal'\]"),
    ("feature_test", "mantel", ValueError,
     r"feature_test must be one of \['staged', 'combined', 'importance', 'main_effect'\]; "
     r"got 'mantel'"),
    ("backend", "cuda", ValueError, r"backend must be one of \[.auto., .compiled., "
                                    r".torch., .reference.\]"),
    ("n_repeats", 0, ValueError, r"n_repeats must be .auto. or an int >= 1; got 0"),
    ("max_steps", 0, ValueError, r"max_steps must be an int >= 1; got 0"),
    ("max_steps", True, TypeError, r"max_steps must be an int >= 1; got True"),
    ("constraint", "psd", ValueError, r"constraint must be one of \['spd', 'diagonal', "
                                      r"'none'\]; got 'psd'"),
    ("level", "terms", ValueError, r"level must be one of \['term', 'feature'\]"),
    ("distance", "manhattan", ValueError, r"distance must be one of \['euclidean'"),
    ("batch_size", 1, ValueError, r"batch_size must be 'auto', 'full' or an int >= 2"),
    ("batch_size", "all", ValueError, r"batch_size must be 'auto', 'full' or an int >= 2"),
    ("numeric_levels", 1, ValueError, r"numeric_levels must be 'auto', None or an int >= 2"),
    ("numeric_levels", "fine", TypeError, r"numeric_levels must be 'auto', None or an int"),
    ("feature_kinds", {"a": "nominal"}, ValueError, r"feature_kinds\['a'\] must be one of"),
    ("feature_groups", {"pos": "x"}, TypeError, r"feature_groups\['pos'\] must be a list"),
    ("missing_distance", -1.0, ValueError, r"missing_distance must be a finite number >= 0"),
    ("cv", 1, ValueError, r"cv must be >= 2 folds"),
    ("cv", 2.5, TypeError, r"cv must be None, an int >= 2, a scikit-learn splitter"),
    ("n_jobs", 0, ValueError, r"n_jobs must be None, a positive int or a negative int"),
    ("device", "tpu", ValueError, r"device must be 'cpu', 'cuda'"),
    ("random_state", -3, ValueError, r"random_state must be None or an int >= 0"),
    ("random_state", "seed", TypeError, r"random_state must be None, an int >= 0"),
]
#: options an entry point does not take (the estimator has no folds, chunks or jobs;
#: the brain-map analyses report term-level importance).
NOT_TAKEN = {
    "MLEM": {"cv", "chunk_size", "n_jobs", "level", "n_null", "null", "feature_test",
             "held_out_pairs", "n_repeats"},
    "mlem_searchlight": {"level"},
    "mlem_roi": {"level"},
}
GARBAGE = object()      # data no entry point can read: an option error must come first


def _mlem(**kw):
    MLEM(**kw).fit(GARBAGE, GARBAGE)


def _array(**kw):
    mlem_neuro.mlem_array(GARBAGE, GARBAGE, **kw)


def _epochs(**kw):
    mlem_neuro.mlem_epochs(GARBAGE, **kw)


def _searchlight(**kw):
    mlem_neuro.mlem_searchlight(GARBAGE, GARBAGE, GARBAGE, **kw)


def _roi(**kw):
    mlem_neuro.mlem_roi(GARBAGE, GARBAGE, GARBAGE, **kw)


ENTRY_POINTS = {"MLEM": _mlem, "mlem_array": _array, "mlem_epochs": _epochs,
                "mlem_searchlight": _searchlight, "mlem_roi": _roi}
CASES = [pytest.param(entry, p, v, exc, msg, id=f"{entry}-{p}={v!r}")
         for entry in ENTRY_POINTS for p, v, exc, msg in BAD
         if p not in NOT_TAKEN.get(entry, ())]


@pytest.mark.parametrize("entry, param, value, exc, match", CASES)
def test_every_entry_point_refuses_bad_options_before_reading_data(entry, param, value, exc,
                                                                   match):
    with pytest.raises(exc, match=match):
        ENTRY_POINTS[entry](**{param: value})


def test_the_table_covers_every_option_and_every_check():
    """Each option of MLEMOptions has a check, and the bad-value table exercises most."""
    assert set(MLEMOptions.names()) <= set(CHECKS)
    tried = {p for p, *_ in BAD}
    assert set(MLEMOptions.names()) <= tried              # every option is tried
    counts = {e: sum(c.values[0] == e for c in CASES) for e in ENTRY_POINTS}
    assert min(counts.values()) >= 20, counts


# ------------------------------------------------------- one validation vocabulary
#: raises about a registered parameter outside the registry, each with its reason
RAISES_ELSEWHERE = {
    # the backends a design can use on its device: narrower than the registry's list
    ("core/training/backends.py", "backend"),
}


def test_no_module_but_the_registry_raises_about_a_registered_parameter():
    """Each parameter of :data:`mlem_neuro.core.checks.CHECKS` is refused by one function:
    no other module raises ``"<name> must ..."`` for it."""
    import re
    from pathlib import Path

    root = Path(mlem_neuro.__file__).parent
    names = "|".join(sorted(CHECKS, key=len, reverse=True))
    pattern = re.compile(r"(?:ValueError|TypeError)\(\s*f?[\"'](" + names + r") must")
    found = set()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel == "core/checks.py":
            continue
        found |= {(rel, m.group(1)) for m in pattern.finditer(path.read_text())}
    assert found <= RAISES_ELSEWHERE, sorted(found - RAISES_ELSEWHERE)


#: the parameters checked outside MLEMOptions: (parameter, call with a bad value)
def _cluster(**kw):
    mlem_neuro.stats.permutation_cluster_test([GARBAGE], "a", **kw)


OTHER_ENTRIES = [
    ("measure", "weights", lambda: _cluster(measure="weights")),
    ("tail", 2, lambda: _cluster(tail=2)),
    ("n_null", 0, lambda: _cluster(n_null=0)),
    ("random_state", -1, lambda: _cluster(random_state=-1)),
    ("model", "block", lambda: mlem_neuro.fmri.trial_images([], [], t_r=2.0, model="block")),
    ("t_r", 0, lambda: mlem_neuro.fmri.trial_images([], [], t_r=0)),
    ("t_r", "2", lambda: mlem_neuro.fmri.events_from_labels(["a"], t_r="2")),
    ("sfreq", -1.0, lambda: mlem_neuro.mlem_array(np.zeros((6, 2, 3)), pd.DataFrame(
        {"a": list("xyxyxy")}), sfreq=-1.0)),
    ("radius", 0, lambda: _searchlight(radius=0)),
    ("spatial_radius", 10.0, lambda: mlem_neuro.mlem_epochs(GARBAGE, spatial_radius=10.0)),
    ("spatial_radius", 10.0, lambda: mlem_neuro.mlem_stcs(GARBAGE, GARBAGE,
                                                          spatial_radius=10.0)),
    ("n_permutations", 0, lambda: MLEM().permutation_importance(GARBAGE, GARBAGE,
                                                                n_permutations=0)),
    ("level", "pair", lambda: MLEM().permutation_importance(GARBAGE, GARBAGE, level="pair")),
    ("cv", 1, lambda: check_cv(1, 30, np.random.default_rng(0))),
    ("cv", "folds", lambda: check_cv("folds", 30, np.random.default_rng(0))),
    ("constraint", "psd", lambda: __import__(
        "mlem_neuro.core.training.metric").core.training.metric.make_W(
        __import__("torch").zeros(1, 2, 2), "psd")),
    ("device", "tpu", lambda: mlem_neuro.utils.check_device("tpu")),
    ("random_state", "x", lambda: mlem_neuro.utils.check_random_state("x")),
    ("distance", "manhattan", lambda: __import__(
        "mlem_neuro.core.rdms.distances").core.rdms.distances.get_metric("manhattan")),
]
#: narrower checks of the same name where a function needs them
NARROWER = {"n_null": dict(low=1),                    # the cluster test needs one at least
            "distance": dict(allowed=("euclidean", "correlation", "cosine"))}


@pytest.mark.parametrize("name, value, call", OTHER_ENTRIES,
                         ids=[f"{n}={v!r}" for n, v, _ in OTHER_ENTRIES])
def test_functions_outside_the_options_refuse_with_the_registry_message(name, value, call):
    """What a function refuses is what the registry's check of that name refuses, with the
    same exception and message."""
    from mlem_neuro.core.checks import check

    with pytest.raises((TypeError, ValueError)) as want:
        check(name, value, **NARROWER.get(name, {}))
    with pytest.raises(want.type) as got:
        call()
    # the same sentence (a function may add a hint after it)
    assert str(got.value).split(";")[0] == str(want.value).split(";")[0]


def test_every_cli_flag_of_a_parameter_uses_the_registry_check(capsys):
    """The command line's analysis flags are typed by the same checks: a bad value gets
    the registry's message (after argparse's "argument --flag:")."""
    import argparse

    from mlem_neuro.cli import FLAG_PARAMS, build_parser, main
    from mlem_neuro.core.checks import check

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("epochs", "searchlight"):
        actions = {s: a for a in sub.choices[command]._actions for s in a.option_strings}
        for flag, (name, _) in FLAG_PARAMS.items():
            if flag in ("--distance", "--radius", "--model") and flag not in actions:
                continue
            assert name in CHECKS and actions[flag].type.__name__ == name, (command, flag)
        # only --standardize ("auto", "run", "none": the command line's own words)
        assert {a.dest for a in actions.values() if a.choices} <= {"standardize"}
    for flag, text, value in [("--cv", "1", 1), ("--n-null", "-1", -1),
                              ("--level", "terms", "terms"), ("--lr", "0", 0.0),
                              ("--constraint", "psd", "psd"), ("--n-jobs", "0", 0),
                              ("--random-state", "-2", -2), ("--batch-size", "1", 1),
                              ("--numeric-levels", "1", 1), ("--n-repeats", "0", 0),
                              ("--distance", "manhattan", "manhattan"),
                              ("--feature-kinds", "a=nominal", {"a": "nominal"})]:
        name = FLAG_PARAMS[flag][0]
        with pytest.raises((TypeError, ValueError)) as want:
            check(name, value)
        with pytest.raises(SystemExit):
            main(["epochs", "x-epo.fif", flag, text, "--out", "o"])
        err = str(want.value)
        err = err[len(name) + 1:] if err.startswith(name + " ") else err
        assert err in capsys.readouterr().err, flag


def test_check_params_checks_only_the_names_given_and_refuses_unknown_ones():
    assert check_params({"lr": 1, "cv": None}) == {"lr": 1.0, "cv": None}
    with pytest.raises(TypeError, match="unknown option 'learning_rate'"):
        check_params({"learning_rate": 0.1})


def test_options_are_frozen_and_serialise_to_json():
    import json

    opts = MLEMOptions(cv=KFold(3), missing_distance={"a": 1}, random_state=np.int64(3))
    with pytest.raises(AttributeError):
        opts.lr = 1.0
    settings = opts.to_settings()
    json.dumps(settings)
    assert settings["cv"].startswith("KFold(") and settings["random_state"] == 3
    assert settings["missing_distance"] == {"a": 1.0}
    assert MLEMOptions(cv=iter([([0, 1, 2], [3, 4, 5])])).cv == [([0, 1, 2], [3, 4, 5])]


def test_results_record_the_same_settings_keys_from_every_analysis(tmp_path):
    """mlem_array and mlem_searchlight both record MLEMOptions.to_settings()."""
    nib = pytest.importorskip("nibabel")
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile(["x", "y"], 12), "b": np.repeat(["u", "v"], 12)})
    kw = dict(cv=3, n_repeats=1, max_steps=5, n_permutations=1, random_state=0)
    r1 = mlem_neuro.mlem_array(rng.standard_normal((24, 3, 2)), table, **kw)
    img = nib.Nifti1Image(rng.standard_normal((3, 3, 3, 24)).astype("float32"), np.eye(4))
    mask = nib.Nifti1Image(np.ones((3, 3, 3), "int8"), np.eye(4))
    r2 = mlem_neuro.mlem_searchlight(img, table, mask, radius=1.0, **kw)
    for res in (r1, r2):
        assert set(MLEMOptions.names()) <= set(res.settings)
        assert res.settings["lr"] == "auto" and res.settings["cv"] == 3


# ------------------------------------------------------------------ folds and groups
@pytest.fixture(scope="module")
def stack():
    rng = np.random.default_rng(0)
    a = np.tile(["x", "y", "z"], 10)
    Y = rng.standard_normal((1, 30, 6))
    Y[0, :, 0] += 3 * (a == "x")
    table = pd.DataFrame({"a": a, "b": rng.permutation(np.repeat(["u", "v"], 15))})
    return Y, table


FAST = dict(max_steps=20, n_permutations=2, random_state=0)


@pytest.mark.parametrize("folds, exc, match", [
    ([([0, 1, 2, 3], [3, 4, 5, 6])], ValueError, r"fold 1 has 1 stimuli both in training"),
    ([([-1, 1, 2], [3, 4, 5])], ValueError, r"indices outside 0\.\.29"),
    ([([0, 1, 2, 40], [3, 4, 5])], ValueError, r"indices outside 0\.\.29"),
    ([([0, 1, 1, 2], [3, 4, 5])], ValueError, r"repeats stimulus indices"),
    ([([0.0, 1.0, 2.0], [3, 4, 5])], TypeError, r"integer stimulus indices; got dtype float"),
    ([(np.arange(30) < 20, np.arange(30) >= 20)], TypeError, r"not a boolean mask"),
    ([(np.arange(27), [27, 28])], ValueError, r"at least 3 training and 3 held-out"),
    ([np.arange(30)], TypeError, r"fold 1 of cv must be a \(train, test\) pair"),
    ([], ValueError, r"cv produced no fold"),
])
def test_explicit_folds_are_validated(folds, exc, match):
    with pytest.raises(exc, match=match):
        check_cv(folds, 30, np.random.default_rng(0))


def test_groups_reach_the_folds(stack):
    Y, table = stack
    groups = np.repeat(np.arange(6), 5)                   # 6 "runs" of 5 trials
    for cv in (3, LeaveOneGroupOut()):
        out = run_cv(DenseRDMSource(Y), table, MLEMOptions(cv=cv, **FAST), groups=groups)
        for train, test in out.folds:
            assert not set(groups[train]) & set(groups[test])
    assert len(out.folds) == 6                            # one fold per run
    # an int cv without groups splits runs; with groups, the folds differ accordingly
    plain = check_cv(3, 30, np.random.default_rng(0))
    assert any(set(groups[tr]) & set(groups[te]) for tr, te in plain)


def test_groups_are_checked(stack):
    Y, table = stack
    groups = np.repeat(np.arange(6), 5)
    src = DenseRDMSource(Y)
    with pytest.raises(ValueError, match=r"fold 1 puts stimuli of group 1 both in training"):
        run_cv(src, table, MLEMOptions(cv=KFold(4), **FAST), groups=groups)
    with pytest.raises(ValueError, match=r"cv=8 folds over groups needs at least 8 groups"):
        run_cv(src, table, MLEMOptions(cv=8, n_repeats=1, **FAST), groups=groups)
    with pytest.raises(ValueError, match=r"one label per stimulus \(30\); got shape \(29,\)"):
        run_cv(src, table, MLEMOptions(**FAST), groups=groups[:29])
    with pytest.raises(TypeError, match=r"got the string 'run'"):
        run_cv(src, table, MLEMOptions(**FAST), groups="run")
    with pytest.raises(ValueError, match="missing values"):
        run_cv(src, table, MLEMOptions(**FAST), groups=np.r_[groups[:-1], np.nan])


def test_groups_in_every_analysis():
    rng = np.random.default_rng(1)
    n = 24
    table = pd.DataFrame({"a": np.tile(["x", "y"], n // 2), "b": np.repeat(["u", "v"], 12)})
    runs = np.repeat(np.arange(4), 6)
    res = mlem_neuro.mlem_array(rng.standard_normal((n, 3, 2)), table, groups=runs, cv=2,
                                n_repeats=1,
                                **FAST)
    for test in res.settings["fold_test_indices"]:
        assert len(set(runs[test])) == 2 and set(runs[test]).isdisjoint(
            set(runs) - set(runs[test]))
    assert res.settings["n_groups"] == 4 and res.score_kind == "held-out"
    insample = mlem_neuro.mlem_array(rng.standard_normal((n, 3, 2)), table, cv=None, **FAST)
    assert insample.settings["n_groups"] is None and insample.score_kind == "in-sample"
    fig = insample.plot(show=False)
    assert any("in-sample" in ax.get_ylabel() for ax in fig.axes)


def test_rare_level_error_names_the_fold(stack):
    Y, table = stack
    table = table.assign(rare=["r"] * 3 + ["s"] * 27)
    folds = [(np.arange(6, 30), np.arange(6))]            # every "r" is held out
    with pytest.raises(ValueError, match=r"fold 1 of 1: over its 24 training stimuli, "
                                         r"feature 'rare' is constant.*rarer values are all "
                                         r"held out"):
        run_cv(DenseRDMSource(Y), table, MLEMOptions(cv=folds, **FAST))
    # constant over the whole table: the plain message, no fold
    with pytest.raises(ValueError, match=r"^feature 'c' is constant over the stimuli"):
        run_cv(DenseRDMSource(Y), table.assign(c="k"), MLEMOptions(cv=3, n_repeats=1, **FAST))


# ------------------------------------------------------------- estimator inputs
def test_disagreeing_pandas_indexes_are_refused():
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.standard_normal((20, 4)), index=np.arange(20))
    y = pd.DataFrame({"a": np.tile(["p", "q"], 10)}, index=np.arange(20)[::-1])
    with pytest.raises(ValueError, match=r"indexes disagree.*y = y.loc\[X.index\]"):
        MLEM(max_steps=5).fit(X, y)
    MLEM(max_steps=5).fit(X, y.loc[X.index])              # aligned: accepted
    # numpy X: rows go by position, so a table whose index says it was reordered
    # (0..n-1 out of order) is refused too; re-indexed, it is accepted
    with pytest.raises(ValueError, match=r"out of order.*reset_index"):
        MLEM(max_steps=5).fit(X.to_numpy(), y)
    MLEM(max_steps=5).fit(X.to_numpy(), y.reset_index(drop=True))


def test_colon_in_feature_names_is_refused():
    rng = np.random.default_rng(0)
    y = pd.DataFrame({"a": np.tile(["p", "q"], 10), "b": np.repeat(["u", "v"], 10),
                      "a:b": rng.permutation(np.tile(["s", "t"], 10))})
    with pytest.raises(ValueError, match=r"must not contain ':'.*rename \['a:b'\], e.g. "
                                         r"'a_b'"):
        MLEM(max_steps=5).fit(rng.standard_normal((20, 3)), y)
    with pytest.raises(ValueError, match=r"must not contain ':'"):
        MLEM(max_steps=5, feature_groups={"p:q": ["a"]}).fit(rng.standard_normal((20, 3)),
                                                              y.drop(columns="a:b"))


# ------------------------------------------------------------------- command line
CLI_FLAGS = {"lr": "--lr", "patience": "--patience", "tol": "--tol",
             "chunk_size": "--chunk-size", "max_steps": "--max-steps",
             "batch_size": "--batch-size", "n_jobs": "--n-jobs", "device": "--device",
             "random_state": "--random-state", "n_permutations": "--n-permutations",
             "n_null": "--n-null"}


def _reaches_the_options(param, value):
    """Values that the command line can spell (a float patience or a word for lr cannot
    be read as the flag's number, in test_cli.py)."""
    if param not in CLI_FLAGS or isinstance(value, bool):
        return False
    return param == "device" or isinstance(value, int) or (
        param in ("lr", "tol") and isinstance(value, float))


CLI_CASES = [pytest.param(cmd, p, v, msg, id=f"cli-{cmd}-{p}={v!r}")
             for cmd in ("epochs", "searchlight") for p, v, exc, msg in BAD
             if _reaches_the_options(p, v)]


@pytest.mark.parametrize("cmd, param, value, match", CLI_CASES)
def test_command_line_refuses_the_same_values_before_reading_files(cmd, param, value, match,
                                                                   tmp_path, capsys):
    """The inputs do not exist: the option error must come first, as in the API, from the
    same check (the flag's argparse type), named by argparse."""
    from mlem_neuro.cli import main

    inputs = (["missing-epo.fif"] if cmd == "epochs" else
              ["--imgs", "run1.nii.gz", "--events", "run1.tsv", "--mask", "mask.nii.gz",
               "--t-r", "2.0"])
    with pytest.raises(SystemExit) as exc:
        main([cmd, *inputs, "--out", str(tmp_path / "out"), CLI_FLAGS[param], str(value)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2
    assert err[-1].startswith(f"mlem-neuro {cmd}: error: argument {CLI_FLAGS[param]}")
    import re

    assert re.search(match.removeprefix(param + " "), err[-1])
    assert not (tmp_path / "out").exists()


def test_command_line_cases_cover_its_training_options():
    assert len(CLI_CASES) >= 24
