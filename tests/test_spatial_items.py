"""``items=`` and ``distance="cv_euclidean"`` in the spatial searchlights (mlem_stcs and
mlem_epochs with spatial_radius): equal to averaging by hand (or to the cross-validated
distances computed time point by time point), a planted effect found where it was
planted, settings saved and read back, and clear errors."""
import mne
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import mlem_neuro
from mlem_neuro.adapters.sensors import channel_neighbourhoods
from mlem_neuro.adapters.stcs import src_neighbourhoods
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms import crossdist
from mlem_neuro.core.rdms.crossdist import crossval_sq_distances
from mlem_neuro.core.rdms.sources import CondensedRDMSource
from mlem_neuro.crossval import run_cv
from mlem_neuro.items import check_items
from mlem_neuro.spatial import crossval_spacetime_sq_distances
from mlem_neuro.time_resolved import _scale_channels

FAST = dict(cv=3, n_repeats=1, max_steps=100, n_permutations=2, random_state=0, verbose="ERROR")
WINDOW = [2, 3]                     # time points holding the planted effect (sources)
# the small item sets of the equality tests leave some held-out folds constant in "a"
pytestmark = pytest.mark.filterwarnings("ignore:every held-out pair")


def item_table(seed, n_items=24, r=4):
    """Items of a binary feature ``a`` (encoded) and ``b`` (not), ``r`` trials each; the
    trial's run (0 to r - 1) is a column too."""
    rng = np.random.default_rng(seed)
    a = rng.permutation(np.arange(n_items) % 2)
    b = rng.permutation(np.arange(n_items) // 2 % 2)
    items = np.repeat(np.arange(n_items), r)
    table = pd.DataFrame({"a": a[items].astype(bool), "b": b[items].astype(bool),
                          "item": [f"i{k:02d}" for k in items],
                          "run": np.tile(np.arange(r), n_items)})
    return rng, a[items], table


def volume_src():
    """81 grid points, 15 mm apart, in a sphere of 45 mm (no MRI)."""
    return mne.setup_volume_source_space(pos=15.0, sphere=(0, 0, 0, 0.045), verbose=False)


def volume_trials(seed=0, amp=1.0, T=6, **kw):
    """Trials of items as volume source estimates: unit noise, plus ``amp * a * u`` in
    the 16 mm patch around (30, 0, 0) mm during WINDOW."""
    src = volume_src()
    v = src[0]["vertno"]
    rr = src[0]["rr"][v]
    centre = int(np.argmin(np.linalg.norm(rr - [0.03, 0, 0], axis=1)))
    dist = np.linalg.norm(rr - rr[centre], axis=1)
    patch = dist <= 0.016
    rng, a, table = item_table(seed, **kw)
    u = rng.standard_normal(int(patch.sum()))
    u *= np.sqrt(len(u)) / np.linalg.norm(u)
    data = rng.standard_normal((len(table), len(v), T))
    when = [t for t in WINDOW if t < T]
    data[:, np.flatnonzero(patch)[:, None], when] += amp * a[:, None, None] * u[None, :,
                                                                                None]
    stcs = [mne.VolSourceEstimate(x, [v], tmin=0.0, tstep=0.01) for x in data]
    return stcs, table, src, dist


def eeg_trials(seed=0, amp=1.0, T=8, targets=("O1", "Oz", "O2"), **kw):
    """Trials of items as biosemi64 epochs: unit noise, plus ``amp * a * u`` on the
    target channels at samples 3 and 4 (0 and 10 ms)."""
    mont = mne.channels.make_standard_montage("biosemi64")
    info = mne.create_info(mont.ch_names, 100.0, "eeg")
    info.set_montage(mont)
    rng, a, table = item_table(seed, **kw)
    idx = [info["ch_names"].index(c) for c in targets]
    u = rng.standard_normal(len(idx))
    u *= np.sqrt(len(u)) / np.linalg.norm(u)
    data = rng.standard_normal((len(table), 64, T))
    when = [t for t in (3, 4) if t < T]
    data[:, np.array(idx)[:, None], when] += amp * a[:, None, None] * u[None, :, None]
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=-0.03, metadata=table, verbose=False)
    pos = np.array([ch["loc"][:3] for ch in info["chs"]])
    dist = np.linalg.norm(pos[:, None] - pos[None, idx], axis=2).min(axis=1)
    return epochs, idx, dist


def by_hand(data, labels):
    """Items in the order of their first trial, and each item's mean trial."""
    order = list(dict.fromkeys(labels))
    return order, np.stack([data[np.asarray(labels) == k].mean(axis=0) for k in order])


def first_rows(table, order, drop=("item", "run")):
    """One row per item (its first trial's), in ``order``, without identifier columns."""
    first = table.drop_duplicates("item").set_index("item").loc[order].reset_index()
    return first.drop(columns=[c for c in drop if c in first.columns])


def assert_same_fit(a, b):
    for name in ("fold_importance", "fold_score", "fold_weights"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=1e-12,
                                   err_msg=name)
    assert a.terms == b.terms


# -------------------------------------------------------------- equal to by hand
def test_stcs_items_equal_averaging_by_hand():
    stcs, table, src, _ = volume_trials(n_items=12, r=3, T=3)
    table = table.drop(columns="run")
    kw = dict(spatial_radius=0.016, **FAST)
    res = mlem_neuro.mlem_stcs(stcs, table, src, items="item", **kw)
    order, mean = by_hand(np.stack([s.data for s in stcs]), table["item"])
    ref = mlem_neuro.mlem_stcs([mne.VolSourceEstimate(x, stcs[0].vertices, 0.0, 0.01)
                                for x in mean], first_rows(table, order), src, **kw)
    assert_same_fit(res, ref)
    assert res.terms == ["a", "b"]                     # the items column is no feature
    s = res.settings
    assert s["items"] == "item" and s["n_items"] == 12 and s["n_stimuli"] == 12
    assert s["n_estimates"] == 36
    assert s["item_labels"] == order and s["trials_per_item"] == [3] * 12
    held = np.concatenate(s["fold_test_indices"])      # folds split items
    assert sorted(held.tolist()) == list(range(12))
    # one label per estimate gives the same analysis; labels= too
    res2 = mlem_neuro.mlem_stcs(stcs, table.drop(columns="item"), src,
                                items=table["item"].to_numpy(), **kw)
    assert_same_fit(res2, res)
    assert res2.settings["items"] is None and res2.settings["n_items"] == 12


def test_sensor_searchlight_items_equal_averaging_by_hand():
    epochs, _, _ = eeg_trials(n_items=12, r=3, T=3)
    table = epochs.metadata
    kw = dict(spatial_radius=0.045, **FAST)
    picks = epochs.ch_names[:20]
    for scale in (False, True):
        res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], picks=picks, items="item",
                                     scale=scale, **kw)
        data = epochs.get_data(picks=picks)
        # channels are scaled over the trials, then the items averaged
        order, mean = by_hand(_scale_channels(data) if scale else data, table["item"])
        first = first_rows(table, order)
        ref = mlem_neuro.mlem_epochs(
            mne.EpochsArray(mean, mne.pick_info(epochs.info, list(range(20))),
                            tmin=-0.03, metadata=first, verbose=False),
            ["a", "b"], scale=False, **kw)
        assert_same_fit(res, ref)
    s = res.settings
    assert s["n_items"] == 12 and s["n_trials"] == 36 and s["n_epochs"] == 36
    assert s["items"] == "item" and s["trials_per_item"] == [3] * 12
    # groups per trial (here a metadata column), constant within items, reduced per item
    epochs.metadata["block"] = [int(k[1:]) // 3 for k in table["item"]]
    res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], picks=picks, items="item",
                                 groups="block", **kw)
    assert res.settings["n_groups"] == 4
    block = np.array([int(k[1:]) // 3 for k in res.settings["item_labels"]])
    folds = [set(block[np.asarray(te)]) for te in res.settings["fold_test_indices"]]
    assert all(not (f & g) for k, f in enumerate(folds) for g in folds[k + 1:])


def test_cv_euclidean_equals_the_distances_computed_by_hand(monkeypatch):
    """Every (time point, neighbourhood) model's distances are those of
    crossval_sq_distances on that neighbourhood's sources at that time point, whatever
    the blocks of time points; the analysis fits run_cv on exactly those distances."""
    stcs, table, src, _ = volume_trials(n_items=10, r=4, T=3)
    data = np.stack([s.data for s in stcs]).transpose(0, 2, 1)      # (n, T, L)
    v = stcs[0].vertices
    A = src_neighbourhoods(src, v, "volume", 0.016)
    items = check_items(table["item"], len(table))
    d2 = crossval_spacetime_sq_distances(data, A, items, table["run"].to_numpy())
    S = A.shape[0]
    for t, s in [(0, 0), (1, 40), (2, 80), (2, 17)]:
        cols = A[s].indices
        ref = crossval_sq_distances(data[:, t, cols][None], table["item"], table["run"])
        np.testing.assert_allclose(d2[t * S + s], ref[0], rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(crossdist, "CHUNK_BYTES", 1)            # one time point a block
    np.testing.assert_array_equal(
        crossval_spacetime_sq_distances(data, A, items, table["run"].to_numpy()), d2)
    monkeypatch.undo()
    res = mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=0.016, items="item",
                               partitions="run", distance="cv_euclidean", **FAST)
    opts = MLEMOptions(cv=3, n_repeats=1, max_steps=100, n_permutations=2, random_state=0)
    ref = run_cv(CondensedRDMSource(d2), first_rows(table, items.labels_.tolist()), opts)
    np.testing.assert_array_equal(res.fold_score, ref.score)
    np.testing.assert_array_equal(res.fold_importance, ref.importance)
    s = res.settings
    assert res.terms == ["a", "b"]          # items and partitions are no features
    assert s["distance"] == "cv_euclidean" and s["partitions"] == "run"
    assert s["n_partitions"] == 4 and s["n_items"] == 10


def test_sensor_cv_euclidean_equals_the_distances_computed_by_hand():
    epochs, _, _ = eeg_trials(n_items=10, r=4, T=3)
    picks = epochs.ch_names[:16]
    res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], picks=picks, items="item",
                                 partitions="run", distance="cv_euclidean", scale=False,
                                 spatial_radius=0.045, **FAST)
    data = epochs.get_data(picks=picks)                       # (n, C, T)
    A = channel_neighbourhoods(mne.pick_info(epochs.info, list(range(16))), 0.045)
    table = epochs.metadata
    d2 = np.concatenate([
        np.concatenate([crossval_sq_distances(data[:, A[s].indices, t][None],
                                              table["item"], table["run"])
                        for s in range(A.shape[0])]) for t in range(data.shape[2])])
    opts = MLEMOptions(cv=3, n_repeats=1, max_steps=100, n_permutations=2, random_state=0)
    order = list(dict.fromkeys(table["item"]))
    ref = run_cv(CondensedRDMSource(d2), first_rows(table, order), opts)
    np.testing.assert_allclose(res.fold_score, ref.score, atol=1e-12)
    assert res.settings["partitions"] == "run" and res.settings["n_partitions"] == 4
    # default partitions: each item's 4 trials dealt into 4 parts, seeded
    res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], picks=picks, items="item",
                                 distance="cv_euclidean", spatial_radius=0.045, **FAST)
    assert res.settings["n_partitions"] == 4 and res.settings["partitions"] is None


# ------------------------------------------------------------------ ground truth
@pytest.mark.parametrize("distance", ["euclidean", "cv_euclidean"])
def test_stcs_items_find_planted_patch(distance):
    stcs, table, src, dist = volume_trials(seed=0)
    res = mlem_neuro.mlem_stcs(stcs, table.drop(columns="run"), src, spatial_radius=0.016,
                               items="item", distance=distance, cv=3, n_repeats=1, random_state=0,
                               verbose="ERROR")
    imp = res.importance_data("a")
    # measured (seeds 0-7 of this simulation: 24 items x 4 trials, unit trial noise,
    # amp 1, 3 folds, default training): the peak in the window 16/16, at the centre
    # 15/16 (once 15 mm away, cv_euclidean); mean over the planted patch in the window
    # 0.321-0.684 with the item means, 0.264-0.653 cv_euclidean; far (> 35 mm) |mean|
    # <= 0.037, other times <= 0.018, feature b in the window <= 0.034
    loc, t = res.peak("a")
    assert dist[loc] <= 0.016 and round(t * 100) in WINDOW
    near = imp[dist <= 0.016][:, WINDOW].mean()
    assert near > 0.2
    assert abs(imp[dist > 0.035][:, WINDOW].mean()) < 0.06
    assert abs(np.delete(imp, WINDOW, axis=1).mean()) < 0.03
    assert near > 4 * max(abs(res.importance_data("b")[dist <= 0.016][:, WINDOW].mean()),
                          0.01)


@pytest.mark.parametrize("distance", ["euclidean", "cv_euclidean"])
def test_sensor_searchlight_items_find_planted_channels(distance):
    epochs, idx, dist = eeg_trials(seed=0)
    res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], items="item", distance=distance,
                                 spatial_radius=0.045, cv=3, n_repeats=1, random_state=0,
                                 verbose="ERROR")
    imp = res.importance_data("a")
    # measured (seeds 0-7: 24 items x 4 trials, unit trial noise, amp 1 on O1/Oz/O2, 3
    # folds, radius 45 mm): mean at the planted channels in the window 0.311-0.555 with
    # the item means, 0.263-0.501 cv_euclidean; far (> 10 cm) |mean| <= 0.042, other
    # times <= 0.018, feature b <= 0.037; the peak within 45 mm of a planted channel
    # 15/16, but once (cv_euclidean, seed 1) a single noisy model 18 cm away
    assert imp[idx][:, 3:5].mean() > 0.2
    assert abs(imp[dist > 0.1][:, 3:5].mean()) < 0.06
    assert abs(np.delete(imp, [3, 4], axis=1).mean()) < 0.03
    assert abs(res.importance_data("b")[idx][:, 3:5].mean()) < 0.06


# ------------------------------------------------------------ settings on disk
def test_items_settings_round_trip(tmp_path):
    stcs, table, src, _ = volume_trials(n_items=10, r=4, T=2)
    res = mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=0.016, items="item",
                               partitions="run", distance="cv_euclidean", **FAST)
    epochs, _, _ = eeg_trials(n_items=10, r=4, T=2)
    res2 = mlem_neuro.mlem_epochs(epochs, ["a", "b"], picks=epochs.ch_names[:8], items="item",
                                  spatial_radius=0.045, **FAST)
    for r, name in ((res, "stcs_mlem.npz"), (res2, "sensor_mlem.npz")):
        back = mlem_neuro.read_result(r.save(tmp_path / name))
        assert type(back) is type(r)
        for key in ("items", "n_items", "item_labels", "trials_per_item", "partitions",
                    "distance"):
            assert back.settings[key] == r.settings[key], key
        np.testing.assert_array_equal(back.importance, r.importance)
    assert back.settings["n_items"] == 10 and res.settings["n_partitions"] == 4


# ----------------------------------------------------------------------- errors
def test_spatial_items_errors(monkeypatch):
    stcs, table, src, _ = volume_trials(n_items=6, r=2, T=2)
    kw = dict(spatial_radius=0.016, verbose="ERROR")
    with pytest.raises(ValueError, match="pass items="):
        mlem_neuro.mlem_stcs(stcs, table, src, distance="cv_euclidean", **kw)
    with pytest.raises(ValueError, match="partitions= is used by the cross-validated"):
        mlem_neuro.mlem_stcs(stcs, table, src, items="item", partitions="run", **kw)
    with pytest.raises(ValueError, match="names no column"):
        mlem_neuro.mlem_stcs(stcs, table, src, items="stimulus", **kw)
    with pytest.raises(ValueError, match="one label per trial"):
        mlem_neuro.mlem_stcs(stcs, table, src, items=table["item"][:-1], **kw)
    # the run column is a feature unless named by partitions: trials of an item differ
    with pytest.raises(ValueError, match="disagree on the feature 'run'"):
        mlem_neuro.mlem_stcs(stcs, table, src, items="item", **kw)
    with pytest.raises(ValueError, match="disagree on groups"):
        mlem_neuro.mlem_stcs(stcs, table.drop(columns="run"), src, items="item",
                             groups=table["run"].to_numpy(), **kw)
    # memory: the distances of every model are refused above the budget, before any work
    monkeypatch.setenv("MLEM_NEURO_MEMORY", "1KiB")
    with pytest.raises(MemoryError, match="cross-validated distances of 162"):
        mlem_neuro.mlem_stcs(stcs, table, src, items="item", partitions="run",
                             distance="cv_euclidean", **kw)
    monkeypatch.delenv("MLEM_NEURO_MEMORY")
    epochs, _, _ = eeg_trials(n_items=6, r=2, T=2)
    with pytest.raises(ValueError, match="names no column"):
        mlem_neuro.mlem_epochs(epochs, ["a"], items="nope", spatial_radius=0.045)
    with pytest.raises(ValueError, match="has no trial in some partition"):
        mlem_neuro.mlem_epochs(epochs, ["a"], items="item", distance="cv_euclidean",
                               partitions=np.r_[0, 0, np.arange(10) % 2],
                               spatial_radius=0.045)
    # a single trial per item leaves nothing to cross-validate
    single = epochs[::2]
    with pytest.raises(ValueError, match="at least 2 trials of every item"):
        mlem_neuro.mlem_epochs(single, ["a"], items="item", distance="cv_euclidean",
                               spatial_radius=0.045)


def test_one_time_block_holds_the_membership_of_its_time_points():
    """The block-diagonal form: models of time t use only time t's cells."""
    rng = np.random.default_rng(0)
    n_items, r, T, L = 5, 2, 3, 4
    labels = np.repeat(np.arange(n_items), r)
    data = rng.standard_normal((n_items * r, T, L))
    A = sp.csr_matrix(np.eye(L) + np.eye(L, k=1))
    items = check_items(labels, len(labels))
    parts = np.tile([0, 1], n_items)
    d2 = crossval_spacetime_sq_distances(data, A, items, parts)
    changed = data.copy()
    changed[:, 1] += 10 * rng.standard_normal((n_items * r, L))
    d2b = crossval_spacetime_sq_distances(changed, A, items, parts)
    S = A.shape[0]
    np.testing.assert_array_equal(d2b[:S], d2[:S])
    np.testing.assert_array_equal(d2b[2 * S:], d2[2 * S:])
    assert not np.allclose(d2b[S:2 * S], d2[S:2 * S])
