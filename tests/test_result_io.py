"""Result files: ``save`` never loses the old file, ``read_result`` turns every kind of
damage into one ValueError that names the file."""
import json
import os
import zipfile

import numpy as np
import pytest

from mlem_neuro import read_result
from mlem_neuro.results import BrainMapResult, TimeCourseResult

READABLE = "is not a readable mlem_neuro result file"


def _timecourse(F=2, M=5, seed=0):
    rng = np.random.default_rng(seed)
    terms = ["a", "b", "a:b"]
    return TimeCourseResult(
        rng.standard_normal((F, M, 3)), rng.uniform(-1, 1, (F, M)),
        rng.standard_normal((F, M, 2, 2)), rng.integers(1, 99, (F, M)), terms, ["a", "b"],
        settings={"cv": F}, times=np.linspace(0, 0.4, M), ch_names=["c1", "c2"])


def _brainmap(F=2, seed=0):
    rng = np.random.default_rng(seed)
    ijk = np.argwhere(rng.random((4, 5, 3)) < 0.5)
    M = len(ijk)
    return BrainMapResult(rng.standard_normal((F, M, 3)), rng.uniform(-1, 1, (F, M)),
                          rng.standard_normal((F, M, 2, 2)), rng.integers(1, 9, (F, M)),
                          ["a", "b", "a:b"], ["a", "b"], {"cv": F}, affine=np.eye(4),
                          shape=(4, 5, 3), voxel_indices=ijk)


def _contents(fname):
    """(header dict, {entry: array}) of a saved result, for writing damaged copies."""
    with np.load(fname) as f:
        entries = {k: f[k] for k in f.files}
    return json.loads(str(entries.pop("__header__"))), entries


def _rewrite(fname, header, entries):
    payload = dict(entries)
    if header is not None:
        payload["__header__"] = np.array(header if isinstance(header, str)
                                         else json.dumps(header))
    with open(fname, "wb") as f:          # exact name: np.savez would not add ".npz"
        np.savez(f, **payload)


# ------------------------------------------------------------------------------ save
@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_save_interrupted_midway_keeps_the_old_file(tmp_path, monkeypatch, error):
    fname = _timecourse(seed=0).save(tmp_path / "sub-01_mlem.npz")
    before = fname.read_bytes()
    real = np.savez

    def dies_midway(file, *args, **kwargs):
        real(file, *args, **kwargs)      # a complete archive went to the temporary file...
        file.seek(0)
        file.truncate(100)               # ...then the write is cut short
        raise error

    monkeypatch.setattr(np, "savez", dies_midway)
    with pytest.raises(type(error)):
        _timecourse(seed=1).save(fname, overwrite=True)
    monkeypatch.undo()
    assert fname.read_bytes() == before
    assert os.listdir(tmp_path) == ["sub-01_mlem.npz"]          # no temporary file left
    np.testing.assert_array_equal(read_result(fname).fold_score,
                                  _timecourse(seed=0).fold_score)


def test_save_interrupted_before_any_file_existed(tmp_path, monkeypatch):
    def fails(file, *args, **kwargs):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", fails)
    with pytest.raises(OSError, match="disk full"):
        _timecourse().save(tmp_path / "r.npz")
    assert os.listdir(tmp_path) == []


def test_save_replaces_in_place_with_normal_permissions(tmp_path):
    fname = _timecourse(seed=0).save(tmp_path / "r.npz")
    umask = os.umask(0)
    os.umask(umask)
    assert fname.stat().st_mode & 0o777 == 0o666 & ~umask    # not mkstemp's 0600
    os.chmod(fname, 0o640)
    _timecourse(seed=1).save(fname, overwrite=True)
    assert fname.stat().st_mode & 0o777 == 0o640              # the old file's mode is kept
    np.testing.assert_array_equal(read_result(fname).fold_score,
                                  _timecourse(seed=1).fold_score)
    assert os.listdir(tmp_path) == ["r.npz"]


def test_save_into_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
        _timecourse().save(tmp_path / "nope" / "r.npz")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------ read
def test_read_result_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such result file"):
        read_result(tmp_path / "missing.npz")


@pytest.mark.parametrize("make", [_timecourse, _brainmap])
def test_round_trip_still_exact(tmp_path, make):
    res = make()
    back = read_result(res.save(tmp_path / "r.npz"))
    assert type(back) is type(res) and back.terms == res.terms
    for name in ("fold_importance", "fold_score", "fold_weights", "n_iter"):
        np.testing.assert_array_equal(getattr(back, name), getattr(res, name))


def _damage_bytes(fname, kind):
    data = fname.read_bytes()
    if kind == "text":
        fname.write_text("onset\tduration\n0\t1\n")
    elif kind == "empty":
        fname.write_bytes(b"")
    elif kind == "npy":
        with open(fname, "wb") as f:
            np.save(f, np.zeros(3))
    elif kind == "truncated":
        fname.write_bytes(data[: len(data) // 2])
    elif kind == "corrupt_member":      # flip bytes inside a stored array: bad CRC
        with zipfile.ZipFile(fname) as z:
            info = z.getinfo("array__fold_importance.npy")
        at = info.header_offset + 30 + len(info.filename) + 200
        fname.write_bytes(data[:at] + bytes(b ^ 0xFF for b in data[at:at + 16])
                          + data[at + 16:])


@pytest.mark.parametrize("kind, what", [
    ("text", "not a .npz (zip) archive"),
    ("empty", "empty file"),
    ("npy", "not a .npz (zip) archive"),
    ("truncated", "truncated or corrupt archive"),
    ("corrupt_member", "truncated or corrupt archive"),
])
def test_read_result_damaged_bytes(tmp_path, kind, what):
    fname = _timecourse().save(tmp_path / "sub-01_mlem.npz")
    _damage_bytes(fname, kind)
    with pytest.raises(ValueError) as exc:
        read_result(fname)
    msg = str(exc.value)
    assert msg.startswith(f"{fname} {READABLE} ({what}): ")
    assert "\n" not in msg


def _drop(key):
    def edit(header, entries):
        if key in entries:
            del entries[key]
        else:
            del header[key]
    return edit


def _set_header(key, value):
    def edit(header, entries):
        header[key] = value
    return edit


def _set_array(key, value):
    def edit(header, entries):
        entries[key] = value
    return edit


@pytest.mark.parametrize("make, edit, what, detail", [
    (_timecourse, "no header", "missing header", "no '__header__' entry"),
    (_timecourse, "not json", "bad header", "not valid JSON"),
    (_timecourse, "json list", "bad header", "not a JSON object"),
    (_timecourse, _drop("array__n_iter"), "missing entries", "'n_iter'"),
    (_timecourse, _drop("array__times"), "missing entries", "'times'"),
    (_brainmap, _drop("array__affine"), "missing entries", "'affine'"),
    (_timecourse, _drop("terms"), "missing entries", "'terms'"),
    (_timecourse, _drop("settings"), "missing entries", "'settings'"),
    (_timecourse, _drop("kind"), "unknown result kind", "None"),
    (_timecourse, _set_header("kind", "Evoked"), "unknown result kind", "'Evoked'"),
    (_timecourse, _set_header("format", 99), "format 99", "newer mlem_neuro"),
    (_timecourse, _set_header("format", "1"), "bad header", "format number"),
    (_timecourse, _set_header("terms", ["a"]), "inconsistent contents", "terms"),
    (_timecourse, _set_array("array__fold_score", np.zeros((2, 4))),
     "inconsistent contents", "disagree"),
    (_timecourse, _set_array("array__fold_importance", np.zeros((2, 5))),
     "inconsistent contents", "fold_importance must have shape"),
    (_timecourse, _set_array("array__fold_weights", np.zeros((2, 5, 3, 3))),
     "inconsistent contents", "fold_weights must have shape"),
    (_timecourse, _set_array("array__n_iter", np.zeros(5)),
     "inconsistent contents", "n_iter must have shape"),
    (_timecourse, _set_array("array__times", np.zeros(4)),
     "inconsistent contents", "times has shape"),
    (_brainmap, _set_array("array__affine", np.eye(3)), "inconsistent contents", "4x4"),
    # read as floats, the imaginary part was dropped (a ComplexWarning only)
    (_timecourse, _set_array("array__fold_score", np.zeros((2, 5)) + 1j), "complex array",
     "'fold_score' holds complex values (complex128)"),
    (_timecourse, _set_array("array__times", np.zeros(5) + 1j), "complex array",
     "'times' holds complex values"),
    # read, then repr raised AttributeError ('str' object has no attribute 'get')
    (_timecourse, _set_header("provenance", "made by hand"), "bad header",
     "'provenance' is a str ('made by hand'), not a JSON object"),
    (_timecourse, _set_header("provenance", {"versions": "1.0"}), "bad header",
     "'provenance' field 'versions' is not an object of version strings"),
    (_timecourse, _set_header("provenance", {"training": "numba"}), "bad header",
     "'provenance' field 'training' is not a list of strings"),
    (_timecourse, _set_header("settings", "cv=2"), "bad header",
     "'settings' is a str ('cv=2'), not a JSON object"),
    (_timecourse, _set_header("terms", "ab"), "bad header", "'terms' is a str"),
])
def test_read_result_damaged_contents(tmp_path, make, edit, what, detail):
    fname = make().save(tmp_path / "sub-01_mlem.npz")
    header, entries = _contents(fname)
    if edit == "no header":
        header = None
    elif edit == "not json":
        header = '{"format": 1, "kind": "TimeCourseResult", "terms": ['
    elif edit == "json list":
        header = json.dumps([1, 2])
    else:
        edit(header, entries)
    _rewrite(fname, header, entries)
    with pytest.raises(ValueError) as exc:
        read_result(fname)
    msg = str(exc.value)
    assert msg.startswith(f"{fname} {READABLE} ({what}): "), msg
    assert detail in msg and "\n" not in msg


def test_read_result_on_a_folder(tmp_path):
    with pytest.raises(ValueError, match=f"{READABLE} \\(a folder\\)"):
        read_result(tmp_path)


def test_save_without_overwrite_loses_a_race_cleanly(tmp_path, monkeypatch):
    """Another process writes the file between the existence check and the move into
    place: this save fails with FileExistsError, the other file is intact, no temporary
    file is left (check-then-replace used to report success for both)."""
    from mlem_neuro.results import _base

    target = tmp_path / "r_mlem.npz"
    other = _timecourse(seed=1)
    real_savez = np.savez

    raced = []

    def savez_then_race(f, **payload):
        real_savez(f, **payload)
        if not raced:
            raced.append(True)
            other.save(target)               # the other process wins meanwhile

    monkeypatch.setattr(_base.np, "savez", savez_then_race)
    with pytest.raises(FileExistsError, match="meanwhile"):
        _timecourse(seed=0).save(target)
    monkeypatch.setattr(_base.np, "savez", real_savez)
    np.testing.assert_array_equal(read_result(target).fold_score, other.fold_score)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r_mlem.npz"]


def test_concurrent_saves_to_one_new_path_give_one_success(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    target = tmp_path / "c_mlem.npz"
    results = [_timecourse(seed=s) for s in range(6)]

    def save(res):
        try:
            res.save(target)
            return True
        except FileExistsError:
            return False

    with ThreadPoolExecutor(6) as pool:
        won = list(pool.map(save, results))
    assert sum(won) == 1
    winner = results[won.index(True)]
    np.testing.assert_array_equal(read_result(target).fold_score, winner.fold_score)
    assert [p.name for p in tmp_path.iterdir()] == ["c_mlem.npz"]


def test_read_result_refuses_a_named_pipe_without_blocking(tmp_path):
    pipe = tmp_path / "pipe_mlem.npz"
    os.mkfifo(pipe)
    with pytest.raises(ValueError, match=f"{READABLE} .not a regular file"):
        read_result(pipe)


def test_read_result_never_unpacks_entries_it_does_not_use(tmp_path, monkeypatch):
    """A small file carrying a huge unused entry: read without decompressing it; an
    oversized entry that is used is refused before it is unpacked."""
    from mlem_neuro.results import _base

    fname = _timecourse().save(tmp_path / "r_mlem.npz")
    header, entries = _contents(fname)
    entries["array__junk"] = np.zeros(2_000_000)                  # 16 MB, packs small

    def rewrite():
        with open(fname, "wb") as f:
            np.savez_compressed(f, __header__=np.array(json.dumps(header)), **entries)

    rewrite()
    assert fname.stat().st_size < 1_000_000
    monkeypatch.setattr(_base, "_MAX_ENTRY_BYTES", 1_000_000)
    read = []
    real = _base._ArchiveArrays.__getitem__
    monkeypatch.setattr(_base._ArchiveArrays, "__getitem__",
                        lambda self, key: read.append(key) or real(self, key))
    back = read_result(fname)
    assert "junk" not in read
    np.testing.assert_array_equal(back.fold_score, _timecourse().fold_score)
    entries["array__fold_score"] = np.zeros(2_000_000)
    rewrite()
    with pytest.raises(ValueError, match="oversized entry"):
        read_result(fname)


def test_settings_with_numpy_values_and_bytes_paths_save_and_read(tmp_path):
    res = _timecourse()
    res.settings.update(n=np.int64(3), x=np.float32(1.5), flag=np.bool_(True),
                        folds=np.arange(3))
    fname = res.save(os.fsencode(tmp_path / "np_mlem.npz"))
    back = read_result(os.fsencode(fname))
    assert back.settings["n"] == 3 and back.settings["folds"] == [0, 1, 2]
    assert back.settings["flag"] is True and back.settings["x"] == 1.5


def test_settings_sets_are_saved_as_sorted_lists_and_objects_are_refused(tmp_path):
    """A set was saved as its repr, the string '{1, 2}'."""
    res = _timecourse()
    res.settings.update(levels={2, 1, 3}, names=frozenset({"b", "a"}), mixed={1, "a"},
                        nested={"pair": (1, {0.5})})
    back = read_result(res.save(tmp_path / "sets_mlem.npz"))
    assert back.settings["levels"] == [1, 2, 3] and back.settings["names"] == ["a", "b"]
    assert back.settings["mixed"] == ["a", 1]       # unorderable: by repr, "'a'" < "1"
    assert back.settings["nested"] == {"pair": [1, [0.5]]}
    for value, what in [(object(), r"settings\['thing'\] holds a object"),
                        ({"deep": [np.datetime64("2020-01-01")]},
                         r"settings\['thing'\]\['deep'\]\[0\] holds a datetime64"),
                        (1 + 2j, r"settings\['thing'\] holds complex values")]:
        res.settings["thing"] = value
        with pytest.raises(TypeError, match=what):
            res.save(tmp_path / "bad_mlem.npz")
        assert not (tmp_path / "bad_mlem.npz").exists()


def test_complex_fold_arrays_are_refused_by_the_constructor():
    res = _timecourse()
    with pytest.raises(ValueError, match="fold_score holds complex values"):
        TimeCourseResult(res.fold_importance, res.fold_score + 1j, res.fold_weights,
                         res.n_iter, res.terms, res.feature_names, times=res.times)


def test_memory_budget_names_its_variable_when_out_of_range(monkeypatch):
    from mlem_neuro.core.memory import memory_budget

    monkeypatch.setenv("MLEM_NEURO_MEMORY", "1e400")
    with pytest.raises(ValueError, match="MLEM_NEURO_MEMORY must be a finite size"):
        memory_budget()


def test_a_bad_memory_budget_is_not_reported_as_a_damaged_file(tmp_path, monkeypatch):
    """MLEM_NEURO_MEMORY=abc: reading a good file says what is wrong with the variable (its
    name and value), not that the file is truncated or corrupt."""
    fname = _timecourse().save(tmp_path / "ok.npz")
    monkeypatch.setenv("MLEM_NEURO_MEMORY", "abc")
    with pytest.raises(ValueError, match=r"environment variable MLEM_NEURO_MEMORY must be a "
                                         r"size .*got 'abc'\. Set it") as err:
        read_result(fname)
    assert "corrupt" not in str(err.value) and "readable" not in str(err.value)
    monkeypatch.delenv("MLEM_NEURO_MEMORY")
    assert read_result(fname).terms == _timecourse().terms
