"""Events tables of block designs from per-volume labels (PyMVPA's ``attributes.txt``,
nilearn's Haxby labels) and from FSL three-column onset files (OpenFMRI layout): known
answers, the Haxby data's three layouts against each other, every refusal, and labels →
events → ``trial_images``."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mlem_neuro.fmri import (
    events_from_labels,
    read_fsl_onsets,
    read_openfmri_onsets,
    trial_images,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
STUDY = DATA / "haxby2001_sub001_25mm"
HAXBY = STUDY / "sub001"
HAXBY_T_R, HAXBY_SCANS = 2.5, 121


def _frame(rows):
    return pd.DataFrame(rows, columns=["onset", "duration", "trial_type"]).astype(
        {"onset": float, "duration": float})


def _by_onset(ev):
    return ev.sort_values(["onset", "trial_type"]).reset_index(drop=True)[
        ["onset", "duration", "trial_type"]]


# ----------------------------------------------------------- labels: known answers
def test_two_runs_blocks_of_different_lengths_rest_between():
    labels = (["rest"] * 2 + ["A"] * 3 + ["rest"] + ["B"] * 5 + ["rest"] * 2 + ["A"] * 2
              + ["A", "rest", "C", "C", "B", "rest"])
    runs = [1] * 15 + [2] * 6
    run1, run2 = events_from_labels(labels, runs, t_r=2.0)
    # run 1: A at volumes 2-4, B at 6-10, A again at 13-14 (a second row)
    pd.testing.assert_frame_equal(run1, _frame([(4.0, 6.0, "A"), (12.0, 10.0, "B"),
                                                (26.0, 4.0, "A")]))
    # run 2 starts again at 0 s; C then B back to back are two blocks
    pd.testing.assert_frame_equal(run2, _frame([(0.0, 2.0, "A"), (4.0, 4.0, "C"),
                                                (8.0, 2.0, "B")]))


def test_rest_none_several_and_other_names():
    labels = ["fix", "A", "A", "baseline", "B", "fix"]
    # rest=None: every stretch is a block
    (ev,) = events_from_labels(labels, t_r=1.5, rest=None)
    assert ev["trial_type"].tolist() == ["fix", "A", "baseline", "B", "fix"]
    assert ev["onset"].tolist() == [0.0, 1.5, 4.5, 6.0, 7.5]
    assert ev["duration"].tolist() == [1.5, 3.0, 1.5, 1.5, 1.5]
    # several rest labels
    (ev,) = events_from_labels(labels, t_r=1.5, rest=["fix", "baseline"])
    pd.testing.assert_frame_equal(ev, _frame([(1.5, 3.0, "A"), (6.0, 1.5, "B")]))
    # the default rest label "rest" is absent: the fixations are blocks too
    (ev,) = events_from_labels(labels, t_r=1.5)
    assert len(ev) == 5


def test_runs_come_in_the_order_of_the_volumes_not_sorted():
    labels = ["A", "rest", "B", "B", "rest", "A"]
    runs = ["run10", "run10", "run10", "run2", "run2", "run2"]
    first, second = events_from_labels(labels, runs, t_r=1.0)
    assert first["trial_type"].tolist() == ["A", "B"]          # run10's volumes came first
    pd.testing.assert_frame_equal(second, _frame([(0.0, 1.0, "B"), (2.0, 1.0, "A")]))


def test_labels_from_a_table_and_from_attribute_files(tmp_path):
    labels = ["rest", "face", "face", "rest", "house", "rest", "cat", "cat"]
    chunks = [0, 0, 0, 0, 1, 1, 1, 1]
    want = events_from_labels(labels, chunks, t_r=2.5)
    assert [len(ev) for ev in want] == [1, 2]
    # nilearn's Haxby example: a table with 'labels' and 'chunks'
    table = pd.DataFrame({"labels": labels, "chunks": chunks})
    for got in (events_from_labels(table, t_r=2.5),
                events_from_labels(table["labels"], table["chunks"], t_r=2.5)):
        for g, w in zip(got, want):
            pd.testing.assert_frame_equal(g, w)
    # PyMVPA's attributes.txt: 'label run' lines, no header; tabs and blank lines allowed
    lines = [f"{lab} {run}" for lab, run in zip(labels, chunks)]
    plain = tmp_path / "attributes.txt"
    plain.write_text("\n".join(lines[:3]) + "\n\n" + "\t".join(lines[3].split()) + "\n"
                     + "\n".join(lines[4:]) + "\n")
    # nilearn's copy: a 'labels chunks' header
    header = tmp_path / "labels.txt"
    header.write_text("labels chunks\n" + "\n".join(lines) + "\n")
    # another header: detected because its run field is not a number
    other = tmp_path / "attributes_header.txt"
    other.write_text("condition run\n" + "\n".join(lines) + "\n")
    for path in (plain, str(header), other):
        got = events_from_labels(path, t_r=2.5)
        assert len(got) == 2
        for g, w in zip(got, want):
            pd.testing.assert_frame_equal(g, w)
    # string runs in a file are kept as strings (order of the volumes)
    named = tmp_path / "named.txt"
    named.write_text("A s2\nB s2\nA s1\n")
    s2, s1 = events_from_labels(named, t_r=1.0, rest=None)
    assert s2["trial_type"].tolist() == ["A", "B"] and s1["trial_type"].tolist() == ["A"]


def test_labels_refusals(tmp_path):
    with pytest.raises(ValueError, match=r"^5 label\(s\) but 4 run value\(s\): give one "
                       r"label and one run per volume"):
        events_from_labels(["A"] * 5, [0] * 4, t_r=2.0)
    with pytest.raises(ValueError, match=r"^t_r must be a finite number > 0; got 0.0\. It is "
                       r"the repetition time in seconds\."):
        events_from_labels(["A"], t_r=0)
    with pytest.raises(ValueError, match=r"^t_r must be a finite number > 0; got -2.5"):
        events_from_labels(["A"], t_r=-2.5)
    with pytest.raises(TypeError, match=r"^t_r must be a number; got '2'"):
        events_from_labels(["A"], t_r="2")
    with pytest.raises(ValueError, match=r"^run 1 \(volumes 3-5\) has no block: all its 3 "
                       r"volumes are labelled \['rest'\], which rest=\['rest'\] leaves out"):
        events_from_labels(["A", "rest", "A", "rest", "rest", "rest"], [0, 0, 0, 1, 1, 1],
                           t_r=2.0)
    with pytest.raises(ValueError, match=r"^run 's1' \(volumes 0-1\) has no block: all its "
                       r"2 volumes are labelled \['fix', 'rest'\]"):
        events_from_labels(["rest", "fix", "A"], ["s1", "s1", "s2"], t_r=2.0,
                           rest=["rest", "fix"])
    with pytest.raises(TypeError, match=r"^labels: volume 1 has the label 3 \(int\), not a "
                       r"string \(2 such volume\(s\)\); labels are condition names"):
        events_from_labels(["A", 3, 4], t_r=2.0)
    with pytest.raises(TypeError, match=r"^labels: volume 0 has the label nan \(float\)"):
        events_from_labels([np.nan, "A"], t_r=2.0)
    with pytest.raises(ValueError, match=r"^run 0 comes back at volume 4 after other runs "
                       r"\(its first volumes are 0-1\): list each run's volumes together"):
        events_from_labels(["A"] * 6, [0, 0, 1, 1, 0, 0], t_r=2.0)
    with pytest.raises(ValueError, match=r"^runs: volume 1 has no run \(missing value; 1 "
                       r"such volume\(s\)\)"):
        events_from_labels(["A", "B"], [0, None], t_r=2.0)
    with pytest.raises(TypeError, match=r"^rest: give the label of the volumes outside the "
                       r"blocks \(a str\), several labels \(a list of str\) or None; got 0"):
        events_from_labels(["A", "B"], t_r=2.0, rest=0)
    with pytest.raises(ValueError, match=r"^labels: one label per volume is expected \(a 1D "
                       r"sequence\); got shape \(2, 2\)"):
        events_from_labels([["A", "B"], ["A", "B"]], t_r=2.0)
    with pytest.raises(ValueError, match=r"^labels is empty: give one label per volume"):
        events_from_labels([], t_r=2.0)
    with pytest.raises(ValueError, match=r"^labels: a table of labels needs a 'labels' "
                       r"column .*; its columns are \['label', 'run'\]"):
        events_from_labels(pd.DataFrame({"label": ["A"], "run": [0]}), t_r=2.0)
    path = tmp_path / "attributes.txt"
    with pytest.raises(ValueError, match=r"^labels: no such file '.*attributes\.txt'"):
        events_from_labels(path, t_r=2.0)
    path.write_text("rest 0\nface 0 extra\n")
    with pytest.raises(ValueError, match=r"^labels: '.*attributes\.txt', line 2: 3 field\(s\)"
                       r" \('face 0 extra'\); an attributes file has two per line"):
        events_from_labels(path, t_r=2.0)
    path.write_text("\n\n")
    with pytest.raises(ValueError, match=r"^labels: '.*attributes\.txt' is empty"):
        events_from_labels(path, t_r=2.0)
    path.write_text("A 0\n")
    with pytest.raises(ValueError, match=r"^runs is read from the attributes file with the "
                       r"labels; pass runs=None"):
        events_from_labels(path, [0], t_r=2.0)


# --------------------------------------------------------- FSL files: known answers
def test_fsl_onsets_merge_sort_and_name(tmp_path):
    (tmp_path / "cond001.txt").write_text("30\t10\t1\n0 10 1\n\n")
    (tmp_path / "cond002.txt").write_text("15.5 5 1\n30 10 1\n")
    files = [tmp_path / "cond001.txt", tmp_path / "cond002.txt"]
    want = _frame([(0.0, 10.0, "cond001"), (15.5, 5.0, "cond002"), (30.0, 10.0, "cond001"),
                   (30.0, 10.0, "cond002")])                 # ties: in the files' order
    pd.testing.assert_frame_equal(read_fsl_onsets(files), want)
    named = want.assign(trial_type=want["trial_type"].map({"cond001": "face",
                                                           "cond002": "house"}))
    pd.testing.assert_frame_equal(
        read_fsl_onsets(files, names={"cond001": "face", "cond002": "house"}), named)
    pd.testing.assert_frame_equal(
        read_fsl_onsets({"face": files[0], "house": str(files[1])}), named)
    # one file, given alone
    pd.testing.assert_frame_equal(read_fsl_onsets(str(files[1])), _frame(
        [(15.5, 5.0, "cond002"), (30.0, 10.0, "cond002")]))
    # two stems mapped to one condition: merged
    merged = read_fsl_onsets(files, names={"cond001": "x", "cond002": "x"})
    assert merged["trial_type"].tolist() == ["x"] * 4


def test_fsl_weights_other_than_one_are_kept(tmp_path):
    (tmp_path / "a.txt").write_text("0 2 1\n10 2 0.5\n")
    (tmp_path / "b.txt").write_text("5 2 1\n")
    ev = read_fsl_onsets([tmp_path / "a.txt", tmp_path / "b.txt"])
    assert list(ev.columns) == ["onset", "duration", "trial_type", "modulation"]
    assert ev["modulation"].tolist() == [1.0, 1.0, 0.5]
    assert ev["trial_type"].tolist() == ["a", "b", "a"]
    # all weights 1: no column
    assert "modulation" not in read_fsl_onsets(tmp_path / "b.txt").columns


def test_fsl_empty_file_warns_and_gives_no_rows(tmp_path):
    (tmp_path / "a.txt").write_text("0 2 1\n")
    (tmp_path / "empty.txt").write_text("")
    with pytest.warns(UserWarning, match=r"FSL onset file '.*empty\.txt' is empty: condition "
                      r"'empty' has no event \(as in FSL, where an empty file is a condition "
                      r"that did not occur\) and no row"):
        ev = read_fsl_onsets([tmp_path / "a.txt", tmp_path / "empty.txt"])
    pd.testing.assert_frame_equal(ev, _frame([(0.0, 2.0, "a")]))
    with pytest.warns(UserWarning, match="is empty"):
        ev = read_fsl_onsets(tmp_path / "empty.txt")
    assert len(ev) == 0 and list(ev.columns) == ["onset", "duration", "trial_type"]


def test_fsl_refusals(tmp_path):
    bad = tmp_path / "cond003.txt"
    cases = [
        ("0 10 1\n20 10\n", r"'.*cond003\.txt', line 2 \('20 10'\): 2 column\(s\); an FSL "
                            r"onset file has three per line, onset, duration and weight"),
        ("0 10 1 4\n", r"line 1 \('0 10 1 4'\): 4 column\(s\)"),
        ("0\n2\n", r"line 1 \('0'\): 1 column\(s\); .* A single column is FSL's "
                   r"one-value-per-volume format"),
        ("0 10 1\n20 ten 1\n", r"line 2 \('20 ten 1'\): not three numbers"),
        ("nan 10 1\n", r"line 1 \('nan 10 1'\): not three numbers"),
        ("0 10 1\n20 -1.5 1\n", r"line 2 \('20 -1.5 1'\): negative duration \(-1.5 s\); "
                                r"durations are >= 0 s"),
    ]
    for text, message in cases:
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_fsl_onsets([bad])
    with pytest.raises(ValueError, match=r"^no such FSL onset file '.*nope\.txt' \(condition "
                       r"'nope'\)"):
        read_fsl_onsets([tmp_path / "nope.txt"])
    good = tmp_path / "cond001.txt"
    good.write_text("0 1 1\n")
    with pytest.raises(ValueError, match=r"^names has no condition for the file "
                       r"'.*cond001\.txt' \(stem 'cond001'\); its entries are \['cond002'\]"):
        read_fsl_onsets([good], names={"cond002": "house"})
    with pytest.raises(ValueError, match=r"^names renames the files of a list; a dict of "
                       r"files"):
        read_fsl_onsets({"face": good}, names={"cond001": "face"})
    other = tmp_path / "run2"
    other.mkdir()
    (other / "cond001.txt").write_text("0 1 1\n")
    with pytest.raises(ValueError, match=r"have one stem, 'cond001', so one condition: files "
                       r"of several runs in one call\?"):
        read_fsl_onsets([good, other / "cond001.txt"])
    with pytest.raises(TypeError, match=r"^files: give a path, a list of paths or a dict"):
        read_fsl_onsets(3)
    with pytest.raises(TypeError, match=r"^files: 3 is not a path"):
        read_fsl_onsets([good, 3])
    with pytest.raises(TypeError, match=r"^names: give a dict \{file stem: condition\} or "
                       r"None; got list"):
        read_fsl_onsets([good], names=["face"])
    with pytest.raises(ValueError, match=r"^files is empty"):
        read_fsl_onsets([])


def test_openfmri_folder_and_key(tmp_path):
    run = tmp_path / "onsets" / "task002_run001"
    run.mkdir(parents=True)
    (run / "cond001.txt").write_text("10 5 1\n")
    (run / "cond002.txt").write_text("0 5 1\n")
    (run / "notes.md").write_text("not an onset file")
    key = tmp_path / "condition_key.txt"
    key.write_text("task001 cond001 word\ntask001 cond002 nonword\n"
                   "task002 cond001 famous face\ntask002 cond002 house\n")
    want = _frame([(0.0, 5.0, "house"), (10.0, 5.0, "famous face")])
    pd.testing.assert_frame_equal(read_openfmri_onsets(run, key), want)   # task from folder
    got = read_openfmri_onsets(run, key, task="task001")
    assert got["trial_type"].tolist() == ["nonword", "word"]
    pd.testing.assert_frame_equal(
        read_openfmri_onsets(str(run), {"cond001": "famous face", "cond002": "house"}), want)
    # a folder not named taskNNN_runNNN: the key's only task, else say which
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "cond001.txt").write_text("1 1 1\n")
    one_task = tmp_path / "one_task.txt"
    one_task.write_text("task001 cond001 word\n")
    assert read_openfmri_onsets(plain, one_task)["trial_type"].tolist() == ["word"]
    with pytest.raises(ValueError, match=r"^the condition key names several tasks "
                       r"\(\['task001', 'task002'\]\) and the folder's name 'plain' is not "
                       r"'taskNNN_runNNN': pass task='task001'"):
        read_openfmri_onsets(plain, key)
    with pytest.raises(ValueError, match=r"^the condition key has no condition of task "
                       r"'task003'; its tasks are \['task001', 'task002'\]"):
        read_openfmri_onsets(run, key, task="task003")
    # a condition of the key with no file: a warning; a file the key does not name: refused
    (run / "cond002.txt").unlink()
    with pytest.warns(UserWarning, match=r"has no onset file for \['cond002'\] "
                      r"\(\['house'\]\): those conditions have no event in this run"):
        ev = read_openfmri_onsets(run, key)
    assert ev["trial_type"].tolist() == ["famous face"]
    (run / "cond007.txt").write_text("1 1 1\n")
    with pytest.raises(ValueError, match=r"^the condition key gives no name to "
                       r"\['cond007.txt'\] \(task 'task002'; it names \['cond001', "
                       r"'cond002'\]\)"):
        read_openfmri_onsets(run, key)
    with pytest.raises(ValueError, match=r"^onsets_dir: no such folder '.*nowhere'"):
        read_openfmri_onsets(tmp_path / "nowhere", key)
    with pytest.raises(ValueError, match=r"^onsets_dir: no cond\*\.txt onset file in "
                       r"'.*onsets'"):
        read_openfmri_onsets(tmp_path / "onsets", key)
    broken = tmp_path / "broken_key.txt"
    broken.write_text("task002 cond001\n")
    with pytest.raises(ValueError, match=r"^condition_key: '.*broken_key\.txt', line 1 "
                       r"\('task002 cond001'\): 2 field\(s\); each line of an OpenFMRI "
                       r"condition key is a task, a condition and its name"):
        read_openfmri_onsets(run, broken)
    broken.write_text("\n")
    with pytest.raises(ValueError, match=r"^condition_key: '.*broken_key\.txt' is empty"):
        read_openfmri_onsets(run, broken)
    with pytest.raises(ValueError, match=r"^condition_key: no such file '.*missing_key'"):
        read_openfmri_onsets(run, tmp_path / "missing_key")


# ------------------------------------------------------------------- Haxby layouts
needs_haxby = pytest.mark.skipif(not HAXBY.exists(), reason="shared Haxby data absent")


def _haxby_events(r):
    return pd.read_csv(HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv", sep="\t")


@needs_haxby
def test_haxby_fsl_onsets_match_the_events_tables():
    key = STUDY / "models/model001/condition_key.txt"
    names = {line.split()[1]: line.split()[2] for line in key.read_text().splitlines()}
    for r in range(1, 13):
        want = _by_onset(_haxby_events(r))
        folder = HAXBY / f"model/model001/onsets/task001_run{r:03d}"
        got = read_openfmri_onsets(folder, key)
        assert list(got.columns) == ["onset", "duration", "trial_type"]   # weights all 1
        pd.testing.assert_frame_equal(_by_onset(got), want, check_dtype=False)
        files = sorted(folder.glob("cond*.txt"))
        assert len(files) == 8
        pd.testing.assert_frame_equal(_by_onset(read_fsl_onsets(files, names=names)), want,
                                      check_dtype=False)


@needs_haxby
def test_haxby_blocks_recovered_from_per_volume_labels(tmp_path):
    labels, runs = [], []
    for r in range(1, 13):
        ev = _haxby_events(r)
        vol = np.full(HAXBY_SCANS, "rest", dtype=object)
        for onset, duration, name in ev[["onset", "duration", "trial_type"]].itertuples(
                index=False):
            first = int(round(onset / HAXBY_T_R))
            vol[first:first + int(round(duration / HAXBY_T_R))] = name
        labels += list(vol)
        runs += [r - 1] * HAXBY_SCANS
    got = events_from_labels(labels, runs, t_r=HAXBY_T_R)
    assert len(got) == 12
    for r, ev in enumerate(got, start=1):
        want = _by_onset(_haxby_events(r))
        pd.testing.assert_frame_equal(ev, want, check_dtype=False)
        assert (ev["duration"] == 9 * HAXBY_T_R).all()            # 9 labelled volumes
    # the same from an attributes.txt as PyMVPA ships it (label and chunk per volume)
    path = tmp_path / "attributes.txt"
    path.write_text("".join(f"{lab} {run}\n" for lab, run in zip(labels, runs)))
    for a, b in zip(events_from_labels(path, t_r=HAXBY_T_R), got):
        pd.testing.assert_frame_equal(a, b)


# ------------------------------------------------------------- end to end (GLM)
def test_labels_to_events_to_trial_images():
    nib = pytest.importorskip("nibabel")
    pytest.importorskip("nilearn")
    from nilearn.glm.first_level import make_first_level_design_matrix

    t_r, shape = 2.0, (4, 4, 4)
    affine = np.diag([3.0, 3.0, 3.0, 1.0])
    rng = np.random.default_rng(0)
    design = {0: [("rest", 4), ("A", 5), ("rest", 4), ("B", 7), ("rest", 4), ("A", 5),
                  ("rest", 4), ("B", 5), ("rest", 6)],
              1: [("rest", 3), ("B", 6), ("rest", 5), ("A", 5), ("rest", 5), ("B", 5),
                  ("rest", 11)]}
    labels, runs = [], []
    for run, blocks in design.items():
        for name, n in blocks:
            labels += [name] * n
            runs += [run] * n
    events = events_from_labels(labels, runs, t_r=t_r)
    assert [ev["trial_type"].tolist() for ev in events] == [["A", "B", "A", "B"],
                                                             ["B", "A", "B"]]
    assert events[0]["duration"].tolist() == [10.0, 14.0, 10.0, 10.0]
    bold = []
    for ev in events:
        n_scans = int(np.sum(np.asarray(runs) == len(bold)))
        X = make_first_level_design_matrix(
            t_r * np.arange(n_scans), ev, hrf_model="glover", drift_model=None)
        amp = {c: rng.normal(1.0, 0.3, shape) for c in ("A", "B")}
        signal = sum(np.multiply.outer(X[c].to_numpy(), amp[c]) for c in ("A", "B"))
        data = 100.0 + signal + 0.05 * rng.standard_normal(signal.shape)
        bold.append(nib.Nifti1Image(np.moveaxis(data, 0, -1).astype(np.float32), affine))
    mask = nib.Nifti1Image(np.ones(shape, np.int8), affine)
    imgs, table = trial_images(bold, events, t_r, mask_img=mask)
    assert imgs.shape == (*shape, 7)                                  # one image per block
    assert table["trial_type"].tolist() == ["A", "B", "A", "B", "B", "A", "B"]
    assert table.index.tolist() == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    assert np.isfinite(imgs.get_fdata()).all()
