"""Spatial searchlights over time: MEG/EEG source space (mlem_stcs) and sensors
(mlem_epochs with spatial_radius).

No MRI is needed: volume source spaces come from ``mne.setup_volume_source_space`` with a
sphere, surface ones are two triangulated spheres (one per hemisphere), and sensors use a
built-in montage.  Ground truth: an effect of feature ``a`` planted in one patch (or a few
channels) during two time points must be found there, and not far away nor at other
times.
"""
import warnings
from pathlib import Path

import mne
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from scipy.spatial import ConvexHull

import mlem_neuro
from mlem_neuro.adapters.sensors import channel_neighbourhoods
from mlem_neuro.adapters.stcs import src_neighbourhoods
from mlem_neuro.core.rdms.sources import SphereRDMSource
from mlem_neuro.core.rdms.spacetime import SpaceTimeRDMSource
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.results import SensorMapResult, SourceMapResult

FAST = dict(cv=3, n_repeats=1, random_state=0)
WINDOW = [2, 3]                     # time points holding the planted effect


# ------------------------------------------------------------------------------ data
def volume_src():
    """81 grid points, 15 mm apart, in a sphere of 45 mm (no MRI)."""
    return mne.setup_volume_source_space(pos=15.0, sphere=(0, 0, 0, 0.045), verbose=False)


def sphere_src(n=200, radius=0.04, gap=0.1):
    """A surface source space without MRI: one triangulated sphere per hemisphere."""
    i = np.arange(n) + 0.5
    phi, th = np.arccos(1 - 2 * i / n), np.pi * (1 + 5 ** 0.5) * i
    unit = np.c_[np.cos(th) * np.sin(phi), np.sin(th) * np.sin(phi), np.cos(phi)]
    tris = ConvexHull(unit).simplices.astype(np.int64)
    hemis = [dict(type="surf", id=101 + h, np=n, ntri=len(tris), coord_frame=5,
                  rr=unit * radius + [x, 0, 0], nn=unit.copy(), tris=tris,
                  inuse=np.ones(n, int), nuse=n, vertno=np.arange(n), nuse_tri=0,
                  use_tris=None, dist=None, dist_limit=None, nearest=None,
                  nearest_dist=None, pinfo=None, patch_inds=None, subject_his_id="sphere")
             for h, x in enumerate((-gap / 2, gap / 2))]
    return mne.SourceSpaces(hemis)


def planted(n_sources, patch, seed=0, n=40, T=6, amp=1.5):
    """Data (n, n_sources, T): noise, plus ``amp * a * u`` on ``patch`` during WINDOW."""
    rng = np.random.default_rng(seed)
    a, b = rng.permutation(np.arange(n) % 2), rng.permutation(np.arange(n) // 2 % 2)
    u = rng.standard_normal(int(np.sum(patch)))
    if len(u):                                      # the same effect size for every seed
        u *= np.sqrt(len(u)) / np.linalg.norm(u)
    data = rng.standard_normal((n, n_sources, T))
    data[:, np.flatnonzero(patch)[:, None], WINDOW] += amp * a[:, None, None] * u[None, :,
                                                                                   None]
    return data, pd.DataFrame({"a": a.astype(bool), "b": b.astype(bool)})


# ------------------------------------------------------------------------ the source
@pytest.mark.parametrize("metric", ["euclidean", "correlation"])
def test_spacetime_source_matches_sphere_source_and_brute_force(metric):
    rng = np.random.default_rng(0)
    n, T, L, S = 7, 4, 6, 5
    data = rng.standard_normal((n, T, L))
    A = sp.random(S, L, density=0.5, random_state=1, format="csr") + sp.eye(S, L)
    A.data[:] = 1
    source = SpaceTimeRDMSource(data, A, metric)
    full = SphereRDMSource(source.X, source.A, metric)        # the explicit block form
    stimuli = [0, 2, 3, 6]
    ref = full.rdm(stimuli)
    assert source.n_models == T * S and source.A.shape == (T * S, T * L)
    assert torch.allclose(source.rdm(stimuli), ref)
    assert torch.allclose(source.subset([3, 17, 8]).rdm(stimuli), ref[[3, 17, 8]])
    assert torch.allclose(source.subset(slice(5, 12)).rdm(stimuli), ref[5:12])
    np.testing.assert_array_equal(source.sizes, full.sizes)
    if metric == "euclidean":           # model 13 = neighbourhood 3 at time point 2
        i, j = pair_indices(len(stimuli))
        s = np.array(stimuli)
        cols = A[3].indices
        d = np.linalg.norm(data[s[i]][:, 2, cols] - data[s[j]][:, 2, cols], axis=1)
        np.testing.assert_allclose(source.rdm(stimuli)[13].numpy(), d)


def test_spacetime_subset_holds_only_its_cells():
    data = np.zeros((5, 50, 30))
    A = sp.eye(30, format="csr")
    sub = SpaceTimeRDMSource(data, A).subset(slice(0, 30))     # time point 0 only
    assert sub.X.shape == (5, 30)


# ---------------------------------------------------------------------- volume space
def test_volume_searchlight_finds_planted_patch():
    src = volume_src()
    v = src[0]["vertno"]
    rr = src[0]["rr"][v]
    centre = int(np.argmin(np.linalg.norm(rr - [0.03, 0, 0], axis=1)))
    dist = np.linalg.norm(rr - rr[centre], axis=1)
    data, table = planted(len(v), dist <= 0.016)
    stcs = [mne.VolSourceEstimate(x, [v], tmin=0.0, tstep=0.01) for x in data]
    res = mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=0.016, **FAST)
    assert isinstance(res, SourceMapResult) and res.n_times == 6
    imp = res.importance_data("a")
    # measured (seeds 0-9 of this simulation, 40 stimuli, 3 folds, 7-point patches): the
    # peak is in the window and at the centre (6 of 10) or a neighbour 21 mm away whose
    # patch overlaps the planted one (4 of 10); mean over the planted patch in the window
    # 0.125-0.374; mean far away |.| <= 0.038, at other times <= 0.012, of the null
    # feature b in the window <= 0.011; single models elsewhere reach 0.26 (noise)
    loc, t = res.peak("a")
    assert dist[loc] <= 2 * 0.016 and round(t * 100) in WINDOW
    near = imp[dist <= 0.016][:, WINDOW].mean()
    assert near > 0.1
    assert abs(imp[dist > 0.035][:, WINDOW].mean()) < 0.05
    assert abs(np.delete(imp, WINDOW, axis=1).mean()) < 0.03
    assert near > 4 * max(abs(res.importance_data("b")[:, WINDOW].mean()), 0.01)
    # valid MNE objects with the right vertices, times and data
    stc = res.importance_stc("a")
    assert isinstance(stc, mne.VolSourceEstimate)
    np.testing.assert_array_equal(stc.vertices[0], v)
    np.testing.assert_allclose(stc.times, stcs[0].times)
    np.testing.assert_allclose(stc.data, imp)
    stcs_out = res.to_stcs()
    assert set(stcs_out) == {"a", "b", "score"}
    np.testing.assert_allclose(stcs_out["score"].data, res.score_data())
    df = res.to_data_frame("a")
    assert len(df) == len(v) * 6 and {"time", "vertex", "importance"} <= set(df.columns)
    row = df[(df.vertex == v[centre]) & np.isclose(df.time, 0.02)]
    assert float(row.importance.iloc[0]) == pytest.approx(imp[centre, 2])


def test_volume_result_save_read(tmp_path):
    src = volume_src()
    v = src[0]["vertno"]
    data, table = planted(len(v), np.zeros(len(v), bool), n=20, T=2)
    stcs = [mne.VolSourceEstimate(x, [v], tmin=0.1, tstep=0.01) for x in data]
    res = mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=0.02, cv=3, n_repeats=1,
                               max_steps=5, random_state=0)
    back = mlem_neuro.read_result(res.save(tmp_path / "r.npz"))
    assert isinstance(back, SourceMapResult) and back.kind == "volume"
    np.testing.assert_array_equal(back.importance, res.importance)
    np.testing.assert_array_equal(back.vertices[0], v)
    np.testing.assert_allclose(back.importance_stc("a").data, res.importance_stc("a").data)


def test_chunks_do_not_change_results():
    src = volume_src()
    v = src[0]["vertno"]
    data, table = planted(len(v), np.zeros(len(v), bool), n=20, T=3)
    stcs = [mne.VolSourceEstimate(x, [v], tmin=0.0, tstep=0.01) for x in data]
    kw = dict(spatial_radius=0.02, cv=3, n_repeats=1, max_steps=20, random_state=0)
    one = mlem_neuro.mlem_stcs(stcs, table, src, **kw)
    many = mlem_neuro.mlem_stcs(stcs, table, src, chunk_size=37, **kw)
    np.testing.assert_allclose(many.importance, one.importance, atol=1e-6)
    np.testing.assert_allclose(many.score, one.score, atol=1e-6)


# --------------------------------------------------------------------- surface space
def test_surface_patches_are_geodesic_and_stay_in_their_hemisphere():
    src = sphere_src()
    vertices = [s["vertno"] for s in src]
    A = src_neighbourhoods(src, vertices, "surface", 0.012)
    assert src[0]["dist"] is None                 # the caller's src is not modified
    n = len(vertices[0])
    assert A[:n, n:].nnz == 0 and A[n:, :n].nnz == 0
    assert (A.diagonal() == 1).all()
    # geodesic >= straight line: every member is within the radius in straight line too,
    # and the patch is what MNE's own distances give
    rr = np.concatenate([s["rr"] for s in src])
    rows, cols = A.nonzero()
    assert np.linalg.norm(rr[rows] - rr[cols], axis=1).max() <= 0.012 + 1e-9
    ref = src.copy()
    mne.add_source_space_distances(ref, dist_limit=0.012, verbose=False)
    D = sp.csr_matrix(ref[0]["dist"])
    members = set(A[5].indices[A[5].indices < n].tolist())
    expect = set(D[5].indices[D[5].data <= 0.012].tolist()) | {5}
    assert members == expect
    # a src that already holds the distances is used as is
    A2 = src_neighbourhoods(ref, vertices, "surface", 0.012)
    assert (A2 != A).nnz == 0


def test_surface_searchlight_and_labels_find_planted_patch():
    src = sphere_src()
    vertices = [s["vertno"] for s in src]
    n = len(vertices[0])
    A = src_neighbourhoods(src, vertices, "surface", 0.012)
    centre = 17                                   # a left-hemisphere vertex
    patch = A[centre].toarray().ravel() > 0
    data, table = planted(2 * n, patch, T=5)
    stcs = [mne.SourceEstimate(x, vertices, tmin=0.0, tstep=0.01, subject="sphere")
            for x in data]
    res = mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=0.012, **FAST)
    # measured (seeds 0-5, 4-vertex patches): peak at the centre (5 of 6) or 10 mm away,
    # in the window; patch mean in the window 0.20-0.46; right hemisphere |mean| <= 0.006;
    # labels (window means): target 0.41-0.54, the others -0.05-0.12
    loc, t = res.peak("a")
    rr = np.concatenate([s["rr"] for s in src])
    assert np.linalg.norm(rr[loc] - rr[centre]) <= 2 * 0.012 and round(t * 100) in WINDOW
    imp = res.importance_data("a")
    assert imp[patch][:, WINDOW].mean() > 0.12
    assert abs(imp[n:].mean()) < 0.03             # the other hemisphere
    stc = res.importance_stc("a")
    assert isinstance(stc, mne.SourceEstimate) and stc.subject == "sphere"
    assert [len(x) for x in stc.vertices] == [n, n]
    # labels: the planted patch, a left label elsewhere, a right one
    left = np.flatnonzero(patch)
    far = np.flatnonzero(np.linalg.norm(rr[:n] - rr[centre], axis=1) > 0.05)[:len(left)]
    labels = [mne.Label(vertices[0][left], hemi="lh", name="target", subject="sphere"),
              mne.Label(vertices[0][far], hemi="lh", name="far", subject="sphere"),
              mne.Label(vertices[1][left], hemi="rh", name="mirror", subject="sphere")]
    res = mlem_neuro.mlem_stcs(stcs, table, labels=labels, **FAST)
    assert res.label_names == ["target", "far", "mirror"] and res.n_locations == 3
    imp = res.importance_data("a")
    assert int(np.argmax(imp[:, WINDOW].mean(axis=1))) == 0
    assert imp[0, WINDOW].mean() > 0.25
    assert imp[0, WINDOW].mean() > 2.5 * np.abs(imp[1:, WINDOW].mean(axis=1)).max()
    stc = res.importance_stc("a")              # each label painted over its vertices
    assert [len(x) for x in stc.vertices] == [2 * len(left), len(left)]
    np.testing.assert_allclose(stc.in_label(labels[0]).data,
                               np.repeat(imp[:1], len(left), axis=0))
    df = res.to_data_frame()
    assert set(df.label) == {"target", "far", "mirror"}


# --------------------------------------------------------------------------- sensors
def eeg_epochs(seed=0, n=40, T=8, amp=1.5, montage="biosemi64", targets=("O1", "Oz", "O2")):
    mont = mne.channels.make_standard_montage(montage)
    info = mne.create_info(mont.ch_names, 100.0, "eeg")
    info.set_montage(mont)
    rng = np.random.default_rng(seed)
    a, b = rng.permutation(np.arange(n) % 2), rng.permutation(np.arange(n) // 2 % 2)
    idx = [info["ch_names"].index(c) for c in targets]
    data = rng.standard_normal((n, len(mont.ch_names), T))
    u = rng.standard_normal(len(idx))
    u *= np.sqrt(len(u)) / np.linalg.norm(u)
    data[:, np.array(idx)[:, None], [3, 4]] += amp * a[:, None, None] * u[None, :, None]
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=-0.03, verbose=False)
    epochs.metadata = pd.DataFrame({"a": a.astype(bool), "b": b.astype(bool)})
    return epochs, idx


def test_sensor_searchlight_finds_planted_channels(tmp_path):
    epochs, idx = eeg_epochs()
    res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], spatial_radius=0.045, **FAST)
    assert isinstance(res, SensorMapResult)
    assert res.ch_names == epochs.ch_names and res.n_times == 8
    pos = np.array([ch["loc"][:3] for ch in epochs.info["chs"]])
    dist = np.linalg.norm(pos[:, None] - pos[None, idx], axis=2).min(axis=1)
    # measured (seeds 0-7 of this simulation, 40 trials, 3 folds, radius 45 mm = 5
    # channels per neighbourhood): the peak is in the window, at a planted channel (6 of
    # 8) or at their neighbour Iz (38 mm); mean at the planted channels in the window
    # 0.165-0.346; far (> 10 cm) |mean| <= 0.012, other times <= 0.009; single models
    # far away reach 0.27 (noise)
    loc, t = res.peak("a")
    assert dist[loc] <= 0.045 and round(t, 3) in (0.0, 0.01)
    imp = res.importance_data("a")
    assert imp[idx][:, 3:5].mean() > 0.12
    assert abs(imp[dist > 0.1][:, 3:5].mean()) < 0.04
    assert abs(np.delete(imp, [3, 4], axis=1).mean()) < 0.03
    evoked = res.to_evoked("a")
    assert isinstance(evoked, mne.EvokedArray)
    np.testing.assert_allclose(evoked.times, epochs.times)
    np.testing.assert_allclose(evoked.data, imp)
    import matplotlib

    matplotlib.use("Agg")
    fig = res.plot_topomap("a", times=[0.0, 0.01], show=False)
    assert len(fig.axes) >= 2
    back = mlem_neuro.read_result(res.save(tmp_path / "s.npz"))
    assert isinstance(back, SensorMapResult) and back.ch_names == res.ch_names
    np.testing.assert_array_equal(back.importance, res.importance)
    np.testing.assert_allclose(back.to_evoked("a").data, evoked.data)


def test_sensor_neighbourhoods_and_decimation():
    epochs, _ = eeg_epochs(n=20, T=8)
    A = channel_neighbourhoods(epochs.info, 0.045)
    assert A.shape == (64, 64) and (A.diagonal() == 1).all() and (A != A.T).nnz == 0
    sizes = np.diff(A.indptr)
    assert 3 <= np.median(sizes) <= 8
    with pytest.warns(RuntimeWarning, match="alias"):
        res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], picks=["O1", "Oz", "O2", "Iz"],
                                     decim=2, spatial_radius=0.045, cv=3, n_repeats=1, max_steps=5,
                                     random_state=0)
    assert res.n_locations == 4 and res.info["sfreq"] == 50.0
    np.testing.assert_allclose(res.to_evoked("a").times, res.times)
    assert set(res.to_data_frame().channel) == {"O1", "Oz", "O2", "Iz"}


def test_sensor_topomap_marks_significant_channels(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    epochs, _ = eeg_epochs(n=24, T=6, amp=3.0)
    res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], picks=["O1", "Oz", "O2", "Fz", "Cz"],
                                 spatial_radius=0.045, cv=3, n_repeats=1, max_steps=30, n_null=19,
                                 random_state=0)
    seen = {}

    def spy(self, **kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(mne.Evoked, "plot_topomap", spy)
    res.plot_topomap("a", times=[0.0], alpha=0.1)
    expect = res._grid(res.pvalues_fwe[:, res.tests.index("a")] < 0.1)
    np.testing.assert_array_equal(seen["mask"], expect)
    # measured (seeds 0-11): 4-6 of the 6 planted (channel, time) models marked, none of
    # the 24 others (Fz, Cz, other times)
    assert expect[:3, 3:5].sum() >= 3 and not expect[3:].any()
    assert not np.delete(expect, [3, 4], axis=1).any()


# ------------------------------------------------------------------------ validation
def _vol_stcs(n=5, T=3, **kw):
    src = volume_src()
    v = src[0]["vertno"]
    rng = np.random.default_rng(0)
    return src, [mne.VolSourceEstimate(rng.standard_normal((len(v), T)), [v], **{
        "tmin": 0.0, "tstep": 0.01, **kw}) for _ in range(n)]


def test_stcs_inputs_are_validated():
    src, stcs = _vol_stcs()
    table = pd.DataFrame({"a": [0, 1, 0, 1, 0]})
    run = mlem_neuro.mlem_stcs
    with pytest.raises(ValueError, match="other vertices"):
        bad = stcs[:4] + [mne.VolSourceEstimate(stcs[0].data[1:], [stcs[0].vertices[0][1:]],
                                                0.0, 0.01)]
        run(bad, table, src, spatial_radius=0.02)
    with pytest.raises(ValueError, match="other times"):
        bad = stcs[:4] + [mne.VolSourceEstimate(stcs[0].data, stcs[0].vertices, 0.05, 0.01)]
        run(bad, table, src, spatial_radius=0.02)
    with pytest.raises(ValueError, match="subject"):
        bad = stcs[:4] + [mne.VolSourceEstimate(stcs[0].data, stcs[0].vertices, 0.0, 0.01,
                                                subject="other")]
        run(bad, table, src, spatial_radius=0.02)
    for radius in (0, -0.01, np.inf):
        with pytest.raises(ValueError, match="positive, finite number of metres"):
            run(stcs, table, src, spatial_radius=radius)
    with pytest.raises(ValueError, match="larger than a head"):
        run(stcs, table, src, spatial_radius=10.0)
    with pytest.raises(TypeError, match="number of metres"):
        run(stcs, table, src, spatial_radius="1cm")
    with pytest.raises(ValueError, match="either spatial_radius"):
        run(stcs, table, src)
    with pytest.raises(ValueError, match="needs src"):
        run(stcs, table, spatial_radius=0.02)
    with pytest.raises(TypeError, match="mne.SourceSpaces"):
        run(stcs, table, "src", spatial_radius=0.02)
    with pytest.raises(ValueError, match="surface source space"):
        run(stcs, table, sphere_src(), spatial_radius=0.02)
    with pytest.raises(ValueError, match="at least 3 source estimates"):
        run(stcs[:2], table[:2], src, spatial_radius=0.02)
    with pytest.raises(TypeError, match="list of source estimates"):
        run(stcs[0], table, src, spatial_radius=0.02)
    with pytest.raises(ValueError, match="4 rows but stcs holds 5"):
        run(stcs, table[:4], src, spatial_radius=0.02)
    with pytest.raises(ValueError, match="surface labels"):
        run(stcs, table, labels=[mne.Label([1, 2], hemi="lh")])
    with pytest.raises(ValueError, match="cv must be >= 2"):     # options checked too
        run(stcs, table, src, spatial_radius=0.02, cv=1, n_repeats=1)


def test_surface_inputs_are_validated():
    src = sphere_src()
    vertices = [s["vertno"] for s in src]
    rng = np.random.default_rng(0)
    stcs = [mne.SourceEstimate(rng.standard_normal((400, 2)), vertices, 0.0, 0.01)
            for _ in range(5)]
    table = pd.DataFrame({"a": [0, 1, 0, 1, 0]})
    with pytest.raises(ValueError, match="labels overlap at 2 vertices"):
        mlem_neuro.mlem_stcs(stcs, table, labels=[mne.Label([1, 2, 3], hemi="lh"),
                                                  mne.Label([2, 3, 4], hemi="lh")])
    with pytest.raises(ValueError, match="holds none of the estimates' vertices"):
        mlem_neuro.mlem_stcs(stcs, table, labels=[mne.Label([900], hemi="lh", name="x")])
    small = mne.SourceSpaces([dict(s, vertno=s["vertno"][:100], nuse=100) for s in src])
    with pytest.raises(ValueError, match="not sources of src"):
        mlem_neuro.mlem_stcs(stcs, table, small, spatial_radius=0.01)


def test_labels_and_src_of_another_subject_refused():
    """Vertex numbers index one subject's surface: labels or a source space of another
    subject would silently pick other places (MNE's stc.in_label refuses it too).  A
    subject that is unknown on either side (None) is not checked."""
    src = sphere_src()                                  # subject_his_id "sphere"
    vertices = [s["vertno"] for s in src]
    rng = np.random.default_rng(0)
    kw = dict(cv=2, n_repeats=1, max_steps=2, n_permutations=1, random_state=0)
    table = pd.DataFrame({"a": [0, 1] * 4})

    def stcs(subject):
        return [mne.SourceEstimate(rng.standard_normal((400, 2)), vertices, 0.0, 0.01,
                                   subject=subject) for _ in range(8)]

    label = mne.Label(np.arange(50), hemi="lh", subject="fsaverage", name="x")
    with pytest.raises(ValueError, match="label 'x' belongs to subject 'fsaverage' but "
                                         "the estimates to 'sample'"):
        mlem_neuro.mlem_stcs(stcs("sample"), table, labels=[label], **kw)
    bi = (mne.Label(np.arange(50), hemi="lh", subject="fsaverage", name="b-lh")
          + mne.Label(np.arange(50), hemi="rh", subject="fsaverage", name="b-rh"))
    with pytest.raises(ValueError, match="label 'b-lh \\+ b-rh' belongs to subject "
                                         "'fsaverage'"):
        mlem_neuro.mlem_stcs(stcs("sample"), table, labels=[bi], **kw)
    with pytest.raises(ValueError, match="src belongs to subject 'sphere' but the "
                                         "estimates to 'sample'"):
        mlem_neuro.mlem_stcs(stcs("sample"), table, src, spatial_radius=0.01, **kw)
    # same subject, or a subject unknown on one side: accepted
    mlem_neuro.mlem_stcs(stcs("fsaverage"), table, labels=[label], **kw)
    mlem_neuro.mlem_stcs(stcs(None), table, labels=[label], **kw)
    mlem_neuro.mlem_stcs(stcs("sphere"), table, src, spatial_radius=0.01, **kw)
    mlem_neuro.mlem_stcs(stcs(None), table, src, spatial_radius=0.01, **kw)


def test_sensor_inputs_are_validated():
    epochs, _ = eeg_epochs(n=6, T=5)
    kw = dict(features=["a", "b"], cv=2, n_repeats=1, max_steps=2)
    with pytest.raises(ValueError, match="positive, finite number of metres"):
        mlem_neuro.mlem_epochs(epochs, spatial_radius=0.0, **kw)
    no_montage = mne.EpochsArray(epochs.get_data(), mne.create_info(epochs.ch_names, 100.0,
                                                                    "eeg"), verbose=False)
    no_montage.metadata = epochs.metadata
    with pytest.raises(ValueError, match="needs a montage"):
        mlem_neuro.mlem_epochs(no_montage, spatial_radius=0.04, **kw)
    info = mne.create_info(["A", "B", "C"], 100.0, ["eeg", "eeg", "misc"])
    info.set_montage(mne.channels.make_dig_montage(
        {"A": [0, 0.08, 0], "B": [0.08, 0, 0]}, coord_frame="head"), on_missing="ignore")
    mixed = mne.EpochsArray(np.random.default_rng(0).standard_normal((6, 3, 3)), info,
                            verbose=False)
    mixed.metadata = epochs.metadata
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="channels with positions"):
            mlem_neuro.mlem_epochs(mixed, picks="all", spatial_radius=0.04, **kw)


SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / \
    "mne_sample_audvis_evoked" / "test-ave.fif.gz"


@pytest.mark.skipif(not SAMPLE.exists(), reason="shared data (../shared/data) absent")
def test_meg_sensor_searchlight_on_real_sensor_positions(tmp_path):
    """Magnetometers and gradiometers of a real Neuromag recording (positions in device
    coordinates), simulated trials: the effect planted under one sensor location is found
    there; grad and mag topomaps draw."""
    import matplotlib

    matplotlib.use("Agg")
    evoked = mne.read_evokeds(SAMPLE, verbose=False)[0]
    info = evoked.copy().pick("meg", exclude="bads").info
    pos = np.array([ch["loc"][:3] for ch in info["chs"]])
    centre = pos[info["ch_names"].index("MEG 2111")]
    dist = np.linalg.norm(pos - centre, axis=1)
    target = np.flatnonzero(dist < 0.005)            # the 3 sensors of one location
    rng = np.random.default_rng(0)
    n = 30
    a, b = rng.permutation(np.arange(n) % 2), rng.permutation(np.arange(n) // 2 % 2)
    data = rng.standard_normal((n, len(pos), 4))
    data[:, target[:, None], [1, 2]] += 2.0 * a[:, None, None] * \
        rng.standard_normal(len(target))[None, :, None]
    epochs = mne.EpochsArray(data * 1e-12, info, tmin=0.0, verbose=False)
    epochs.metadata = pd.DataFrame({"a": a.astype(bool), "b": b.astype(bool)})
    res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], spatial_radius=0.04, cv=3, n_repeats=1,
                                 max_steps=200, random_state=0)
    assert res.n_locations == len(pos)
    # measured (seeds 0-4): the peak is in the window, in a neighbourhood holding the
    # planted sensors (centre 34-39 mm away: smaller neighbourhoods there, so less noise);
    # mean at the planted sensors in the window 0.20-0.35, far away |mean| <= 0.013
    loc, t = res.peak("a")
    assert dist[loc] <= 0.04 and round(t * info["sfreq"]) in (1, 2)
    imp = res.importance_data("a")
    assert imp[target][:, 1:3].mean() > 5 * abs(imp[dist > 0.1][:, 1:3].mean())
    for ch_type in ("grad", "mag"):
        fig = res.plot_topomap("a", times=[t], ch_type=ch_type, show=False)
        assert len(fig.axes) >= 1
    back = mlem_neuro.read_result(res.save(tmp_path / "meg.npz"))   # the info round-trips
    np.testing.assert_allclose([ch["loc"] for ch in back.info["chs"]],
                               [ch["loc"] for ch in info["chs"]])
    assert back.info["dev_head_t"] is not None
    both = evoked.copy().pick(["meg", "eeg"], exclude="bads")
    mixed = mne.EpochsArray(np.zeros((6, both.info["nchan"], 2)), both.info, verbose=False)
    mixed.metadata = pd.DataFrame({"a": [0, 1] * 3})
    with pytest.raises(ValueError, match="one sensor family"):
        mlem_neuro.mlem_epochs(mixed, ["a"], spatial_radius=0.04, cv=2, n_repeats=1)


def test_surface_distances_recomputed_when_too_short():
    src = sphere_src()
    vertices = [s["vertno"] for s in src]
    short = src.copy()
    mne.add_source_space_distances(short, dist_limit=0.006, verbose=False)
    A = src_neighbourhoods(short, vertices, "surface", 0.012)
    B = src_neighbourhoods(src, vertices, "surface", 0.012)
    assert (A != B).nnz == 0 and np.diff(A.indptr).max() > 1
    assert float(short[0]["dist_limit"][0]) == pytest.approx(0.006)   # left as it was


def test_stcs_time_selection_and_tests():
    src = mne.setup_volume_source_space(pos=20.0, sphere=(0, 0, 0, 0.04), verbose=False)
    v = src[0]["vertno"]
    data, table = planted(len(v), np.zeros(len(v), bool), n=18, T=6)
    stcs = [mne.VolSourceEstimate(x, [v], tmin=-0.02, tstep=0.01) for x in data]
    res = mlem_neuro.mlem_stcs(iter(stcs), table, src, spatial_radius=0.025, tmin=0.0,
                               decim=2, window=0.02, cv=3, n_repeats=1, max_steps=10, n_null=3,
                               random_state=0)
    np.testing.assert_allclose(res.times, [0.0, 0.02])
    assert res.importance_stc("a").tstep == pytest.approx(0.02)
    assert res.tests == ["score", "a", "b", "interactions"]
    assert res.pvalues.shape == (2 * len(v), 4)
    assert ((res.pvalues > 0) & (res.pvalues <= 1)).all()
    sig = res.significance_stc("a", alpha=0.5, corrected=False)
    np.testing.assert_array_equal(sig.data, res._grid(res.pvalues[:, 1] < 0.5))
    with pytest.raises(ValueError, match="unknown test"):
        res.significance_stc("c")


def test_stcs_groups_may_name_a_column_of_the_features():
    """groups='run' takes that column's labels and leaves it out of the features."""
    src = mne.setup_volume_source_space(pos=20.0, sphere=(0, 0, 0, 0.04), verbose=False)
    v = src[0]["vertno"]
    data, table = planted(len(v), np.zeros(len(v), bool), n=18, T=2)
    stcs = [mne.VolSourceEstimate(x, [v], tmin=0.0, tstep=0.01) for x in data]
    runs = np.repeat(np.arange(6), 3)
    kw = dict(spatial_radius=0.025, cv=3, n_repeats=1, max_steps=5, random_state=0)
    a = mlem_neuro.mlem_stcs(stcs, table.assign(run=runs), src, groups="run", **kw)
    b = mlem_neuro.mlem_stcs(stcs, table, src, groups=runs, **kw)
    assert a.terms == b.terms and "run" not in a.feature_names
    assert a.settings["n_groups"] == 6
    np.testing.assert_allclose(a.fold_score, b.fold_score)
