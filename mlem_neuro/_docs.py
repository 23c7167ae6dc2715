"""Shared parameter documentation: one text per parameter, filled into docstrings.

The analyses (:func:`mlem_neuro.mlem_array`, :func:`mlem_neuro.mlem_epochs`,
:func:`mlem_neuro.mlem_searchlight`, :func:`mlem_neuro.mlem_roi`) and the estimator
:class:`mlem_neuro.MLEM` take the same options; their descriptions live once, in
:data:`docdict`, and a docstring names them with a placeholder on a line of its own::

    Parameters
    ----------
    data : array (n_trials, n_channels, n_times)
        One trial per stimulus.
    %(window)s
    %(cv_trials)s

:func:`fill_doc` replaces each placeholder with the entry, indented like the placeholder
(MNE-Python's ``docdict`` / ``fill_doc`` convention).  Keys name the parameter; a text that
depends on the context gets a suffix (``cv_trials`` for the time-resolved analyses,
``cv_images`` for the fMRI ones).  Keep the keys in alphabetical order.
"""
from __future__ import annotations

import difflib
import itertools
import math
import re

from .core import constants as _c
from .core.constants import STAGED_GATE

docdict: dict[str, str] = {}


def _numbers(text, **values):
    """``text`` with each ``<NAME>`` replaced by ``values[NAME]``.

    The numbers an entry states that live in :mod:`mlem_neuro.core.constants` (block
    sizes, grid sizes, caps) are filled in from there, so the text follows a constant
    that changes (``tests/test_docdict_numbers.py``).  Every name given must occur, and
    no ``<NAME>`` may be left.
    """
    for name, value in values.items():
        token = f"<{name}>"
        if token not in text:
            raise ValueError(f"{token} is not in the docdict text")
        text = text.replace(token, str(value))
    left = re.search(r"<[A-Z][A-Z0-9_]*>", text)
    if left:
        raise ValueError(f"{left.group(0)} in the docdict text has no value")
    return text


def _count(n):
    """A count as the docs write it: ``2**18`` for a power of two above 2**10, else
    ``1,000``."""
    n = int(n)
    if n > 2**10 and n & (n - 1) == 0:
        return f"2**{n.bit_length() - 1}"
    return f"{n:,}"

# --------------------------------------------------------------------------------- B
docdict["backend"] = _numbers("""
backend : "auto" | "compiled" | "torch" | "reference"
    Which training path trains the models.  ``"auto"`` (default) picks the compiled loop
    (numba) where it applies (categorical features, or numeric ones on the grid, on the
    CPU, at most <COMPILED_MAX_FEATURES> features), else torch (any design and device).
    ``"reference"`` is the training written for clarity (torch autograd,
    :func:`torchsort.soft_rank`, :class:`torch.optim.AdamW`, one model at a time) that the
    others are tested against: slow, for checks.  A named backend that cannot train the
    design raises an error.
    The paths used are recorded in ``res.provenance["training"]`` (those of the null
    models and of the test of interactions included).
""", COMPILED_MAX_FEATURES=_c.COMPILED_MAX_FEATURES)

docdict["batch_size"] = _numbers("""
batch_size : "auto" | "full" | int
    Pairs per training step.  ``"auto"`` uses every pair when the pairs fall into groups
    of identical term rows (categorical features: a step then costs the same for any
    number of pairs) and number at most <FULL_BATCH_PAIRS>, otherwise it runs the batch-size
    selection of the MLEM paper (correlation stability of feature distances across
    <BATCH_DRAWS> batches); numeric features trained on a grid (see ``numeric_levels``), up
    to <FULL_BATCH_PAIRS> pairs, take mini-batches as exact training does, drawn as unions of
    <N_BLOCKS> fixed random blocks of pairs (as many blocks as the selection's rule keeps).
    ``"full"`` always uses every pair.
""", FULL_BATCH_PAIRS=_count(_c.FULL_BATCH_PAIRS), BATCH_DRAWS=_c.BATCH_DRAWS,
    N_BLOCKS=_c.N_BLOCKS)

# --------------------------------------------------------------------------------- C
docdict["bids_root"] = """
bids_root : path-like
    The top folder of a BIDS dataset (raw data: ``dataset_description.json``,
    ``sub-<label>/`` folders, ``events.tsv`` files).
"""

docdict["chunk_size_spheres"] = _numbers("""
chunk_size : int | None
    Spheres (or regions) per engine call (default: at most <MAX_CHUNK_MODELS>, bounded by
    memory, and split over ``n_jobs``).  Results do not depend on it (on the CPU: equal to
    1e-16; on a GPU: not measured, float32 rounding may differ).
""", MAX_CHUNK_MODELS=_count(_c.MAX_CHUNK_MODELS))

docdict["chunk_size_time"] = """
chunk_size : int | None
    Time points per engine call (default: as many as fit a memory budget, split over
    ``n_jobs``).  Results do not depend on it (on the CPU: equal to 1e-16; on a GPU: not
    measured, float32 rounding may differ).
"""

docdict["compiled"] = """
compiled : bool | None
    Whether the analysis ran the compiled kernels (its runtime's switch,
    :attr:`mlem_neuro.crossval.CVOutput.compiled`); recorded in :attr:`provenance`
    (``"compiled_training"``).  ``None``: whether numba is installed.
"""

docdict["constraint"] = """
constraint : {"spd", "diagonal", "none"}
    Form of the metric ``W``: ``"spd"`` symmetric positive definite (MLEM),
    ``"diagonal"`` positive feature weights without interactions (FR-RSA), ``"none"``
    symmetric without the SPD constraint (FR-RSA with interactions, FR-RSA-I).
"""

docdict["cv_images"] = """
cv : None | int | scikit-learn splitter | iterable of (train, test)
    Cross-validation over stimuli (images).  An int (default 2, repeated ``n_repeats``
    times) gives shuffled K-fold splits seeded by ``random_state``
    (:class:`~sklearn.model_selection.GroupKFold` folds with ``groups``; a split with a
    fold that cannot be used, a feature constant over its training images or held-out
    images alike in every feature, is drawn again); a splitter receives ``groups``.
    ``None`` trains and scores on all images: **optimistic** (in-sample).  With
    trial-wise betas from several runs, pass the runs as ``groups`` and an int ``cv``
    smaller than the number of runs (grouped k-fold, several runs held out per fold).
    Not leave-one-run-out when every condition occurs once per run: every held-out
    pair then differs in the condition, whose importance is 0 by construction (a
    warning says so).
"""

docdict["cv_trials"] = """
cv : None | int | scikit-learn splitter | iterable of (train, test)
    Cross-validation over trials: an int gives shuffled K-fold splits (default 2,
    repeated ``n_repeats`` times; a split with a fold that cannot be used, a feature
    constant over its training trials or held-out trials alike in every feature, is
    drawn again); also a scikit-learn
    splitter or ``(train, test)`` index pairs.  Each fold's models
    are trained on pairs of training trials and scored / permuted on pairs of held-out
    trials; results keep every fold (means and spreads on the result).  ``None``
    trains and scores on all trials: **optimistic** (in-sample), for exploration only.
"""

# --------------------------------------------------------------------------------- D
docdict["datatype"] = """
datatype : "auto" | "func" | "eeg" | "meg"
    The recordings analysed: BOLD runs (``func``) or MEG / EEG recordings; ``"auto"``
    (default): the one datatype in which the task is recorded.
"""

docdict["decim"] = """
decim : int
    Keep one sample in ``decim``, on a grid anchored at ``t = 0`` (as MNE; at the
    sample nearest ``t = 0`` for times between sample instants, such as bin centres)
    when the sampling rate is known.  ``window`` averaging is applied on the full-rate data,
    before decimation: e.g. spikes binned at 1 ms with ``window=0.05, decim=25`` give
    50 ms averages every 25 ms.  Low-pass the data first (or use ``window``) to avoid
    aliasing.
"""

docdict["derivatives"] = """
derivatives : path-like | None
    fMRI: the folder of preprocessed runs in fMRIPrep's layout
    (``sub-<label>/func/*_space-<S>_desc-preproc_bold.nii.gz``, brain masks, confounds
    tables); default: ``<bids_root>/derivatives/fmriprep``, else
    ``<bids_root>/derivatives``.
"""

docdict["device"] = """
device : str
    ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` picks a GPU).  Training runs in float32,
    scores in float64.
"""

docdict["distance_bids"] = """
distance : {"euclidean", "correlation", "cosine", "cv_euclidean", "crossnobis"}
    Neural distance between trials (items, with items), as the analysis of the
    datatype computes it: between channel patterns at each time point (MEG / EEG, see
    ``distance`` of :func:`mlem_neuro.mlem_epochs`) or between beta patterns within a
    sphere / region (fMRI, see :func:`mlem_neuro.mlem_searchlight`).
    ``"cv_euclidean"`` and ``"crossnobis"`` are cross-validated over independent
    partitions of each item's trials and need ``items`` (see ``partitions``).
"""

docdict["distance_images"] = """
distance : {"euclidean", "correlation", "cosine", "cv_euclidean", "crossnobis"}
    Neural distance between the images' patterns within a sphere / region
    (``"correlation"``: ``1 - r`` across the sphere's voxels).  ``"cv_euclidean"`` and
    ``"crossnobis"`` need ``items``: the cross-validated squared distance between items,
    from independent partitions of their images (``partitions``), unbiased by the images'
    noise (see ``distance`` of :func:`~mlem_neuro.mlem_array`); crossnobis first whitens
    each sphere / region by its own noise covariance, estimated from the images'
    residuals about their item's mean within their partition and shrunk (Ledoit-Wolf),
    which discounts noise shared by voxels.  See
    :func:`~mlem_neuro.core.rdms.crossdist.crossnobis_membership`.
"""

docdict["distance_rsa_trials"] = """
distance : {"euclidean", "correlation", "cosine"}
    Neural distance between the patterns of two trials (``"correlation"``: ``1 - r``
    across channels), computed as in MLEM's analyses
    (:mod:`mlem_neuro.core.rdms.distances`).
"""

docdict["distance_spatial"] = """
distance : {"euclidean", "correlation", "cosine", "cv_euclidean", "crossnobis"}
    Neural distance between the patterns of a patch (or label) at one time point
    (``"correlation"``: ``1 - r`` across the patch's sources).  ``"cv_euclidean"`` and
    ``"crossnobis"`` need ``items``: the cross-validated squared distance between items,
    from independent partitions of their estimates (``partitions``), unbiased by trial
    noise (see ``distance`` of :func:`~mlem_neuro.mlem_array`); crossnobis first whitens
    each (patch, time point) by its own shrunk noise covariance.
"""

docdict["distance_trials"] = """
distance : {"euclidean", "correlation", "cosine", "crossnobis", "cv_euclidean"}
    Neural distance between trials (items, with ``items``) at a time point, across
    channels.  ``"cv_euclidean"`` and ``"crossnobis"`` need ``items``: the distance
    between two items is the product of their pattern differences measured in two
    independent partitions of their trials (``partitions``), averaged over pairs of
    partitions, so trial noise adds nothing to it on average (unbiased; 0 for identical
    items; it can be negative); crossnobis first whitens the channels by the noise
    covariance, estimated per time point from the trials' residuals and shrunk
    (Ledoit-Wolf).  See :mod:`mlem_neuro.core.rdms.crossdist`.  The sensor searchlight
    (``spatial_radius``) computes both per neighbourhood and time point (crossnobis with
    each neighbourhood's own covariance).
"""

# --------------------------------------------------------------------------------- F
docdict["feature_groups"] = """
feature_groups : dict | None
    Multi-column features ``{name: [columns]}`` compared with the Euclidean distance.
"""

docdict["feature_kinds"] = """
feature_kinds : dict | None
    Override inferred feature kinds, ``{column: "categorical" | "ordinal" | "numeric"}``.
    An ordinal column's levels follow its ordered pandas Categorical, else their sorted
    order (numbers by value; strings alphabetically, with a warning).  The kind is a
    hypothesis: ``"ordinal"`` and ``"numeric"`` say the neural distance grows with
    ``|a - b|`` (more power for a graded, monotonic code, but they weaken or hide an
    effect whose levels are just different), ``"categorical"`` only that levels differ
    (0/1 distance).  When unsure, use categorical, or test both codes in separate
    analyses (options page, ``feature_kinds``).
"""

docdict["feature_names"] = """
feature_names : list of str
    The features, in the order of the rows and columns of ``W`` (group names for
    multi-column features).
"""

docdict["feature_test"] = """
feature_test : {"staged", "combined", "importance", "main_effect"}
    The statistic of each feature's permutation test (with ``n_null``).  Two statistics
    are read on the same null datasets: the feature's in-sample main effect, the partial
    Spearman correlation between its distance and the neural distance with the other
    features' distances held fixed (a partial Mantel statistic, tested by the analysis's
    conditional relabellings), and its held-out permutation importance in the learned
    metric (which sees interactions: a feature that matters only through an
    interaction, as in an XOR code).  ``"staged"`` (default): the main effect alone, and
    in the models (time points, spheres) where the test of interactions finds
    interactions (family-wise p <= GATE over the models) the larger of the two, each
    standardised by
    one mean and standard deviation over all its values (the observed and the null
    datasets of every model for the main effect, of those models for the importance,
    whose null models are fitted there only: the staged tests cost less than the
    combined ones); with one feature or ``interactions=False`` there is no
    interaction to find and the main effect is the test.  ``"combined"``: the larger of
    the two in every model.  ``"importance"``: the held-out importance alone.
    ``"main_effect"``: the main effect alone, blind to a feature that acts only through
    an interaction (the test of interactions still runs).  Where the main effect is a
    feature's whole test (``"main_effect"``, or ``"staged"`` with the gate shut in
    every model) it reads max(``n_null``, MAIN_NULLS) relabellings, the first ``n_null``
    those of the trained tests: it needs no training, and with 99 a p-value steps by
    0.01 (it found a weak feature up to 8 points less often than a partial Mantel test
    with 999 permutations; with 999 as often); ``settings["n_null_used"]`` records each
    test's null datasets.  Measured side by side on the
    method page ("The feature test").  The main effects are in the result's
    ``main_effect``; ``settings["feature_test_used"]`` records what ran (the importance
    alone when the main effects did not fit in memory) and, for ``"staged"``,
    ``settings["feature_test_staged_open"]`` in how many models the importance joined.
""".replace("GATE", f"{STAGED_GATE:g}").replace(
    "MAIN_NULLS", f"{_c.MAIN_EFFECT_NULLS}")

docdict["features_images"] = """
features : DataFrame | array (n_images, n_features)
    The theoretical features, one row per image, in the order of ``imgs`` (see
    :class:`mlem_neuro.MLEM` for how columns are compared).
"""

docdict["fold_importance"] = """
fold_importance : ndarray (n_folds, n_models, n_terms)
    Permutation importance of each term (mean drop of held-out Spearman ρ), per fold
    and model.
"""

docdict["fold_score"] = """
fold_score : ndarray (n_folds, n_models)
    Held-out Spearman ρ, per fold and model.
"""

docdict["fold_weights"] = """
fold_weights : ndarray (n_folds, n_models, n_features, n_features)
    Learnt metric ``W`` of each fold and model.
"""

_GROUPS_NULLS = """\
    With ``n_null``, the groups are also the exchangeability blocks of every permutation
    test: groups whose stimuli differ in their features (runs, sessions) keep every null
    within its group, so whatever the runs do to the data (offsets, drifts, per-run
    z-scoring) is kept by the null datasets; groups of one feature row each (the trials of
    an item) are exchanged whole, with groups of the same size.  Without ``groups`` every
    stimulus is assumed exchangeable with every other: pass the runs whenever the data
    come from several runs.
"""

# --------------------------------------------------------------------------------- G
docdict["gate_open"] = _numbers("""
gate_open : ndarray of bool (n_models,) | None
    With the staged feature test (``feature_test="staged"``, the default), the models
    where its gate was open: the test of interactions was family-wise significant
    (``p_fwe <= <GATE>``), so each feature's test there is the larger of its standardised
    held-out importance and its main effect and rests on the interactions found (open
    in every model when the source cannot take the test of interactions;
    :meth:`significant` warns, :meth:`rests_on_interactions`; method page, "Where the
    gate opens").  ``None`` for another feature test, without tests (``n_null=0``), or
    in a file saved before it was recorded.
""", GATE=f"{STAGED_GATE:g}")

docdict["groups_bids"] = """
groups : str | None
    An events.tsv column (session, block...) whose trials stay in one fold: the folds
    become :class:`~sklearn.model_selection.GroupKFold` over its values (``groups`` of
    :func:`mlem_neuro.mlem_epochs` and :func:`mlem_neuro.mlem_searchlight`).  Every
    recording's ``events.tsv`` must have it (a participant whose file lacks it fails with
    the file named).  Not with ``group_runs``, which groups by run.
"""

docdict["groups_epochs"] = """
groups : array-like | str | None
    One label per epoch (run, session, item...): folds keep each group's epochs
    together (an int ``cv`` then gives :class:`~sklearn.model_selection.GroupKFold`
    folds; a splitter receives ``groups``).  A str names an ``epochs.metadata`` column
    holding the labels (left out of the features when ``features`` is ``None``).  Labels
    of every original event (``len(epochs.drop_log)``) are aligned with
    ``epochs.selection``, as the feature table (epochs dropped on reading keep theirs).
""" + _GROUPS_NULLS

docdict["groups_images"] = """
groups : array-like | None
    One label per image (e.g. the run of each trial): folds keep each group's images
    together (an int ``cv`` then gives :class:`~sklearn.model_selection.GroupKFold`
    folds over the groups; a splitter receives ``groups``).
""" + _GROUPS_NULLS

docdict["groups_trials"] = """
groups : array-like | str | None
    One label per trial (run, session, item...): folds keep each group's trials
    together (an int ``cv`` then gives :class:`~sklearn.model_selection.GroupKFold`
    folds; a splitter receives ``groups``).  A str names a column of the features
    holding the labels (an identifier: it is not a feature).
""" + _GROUPS_NULLS

# --------------------------------------------------------------------------------- H
docdict["held_out_pairs"] = """
held_out_pairs : {"auto", "all", "between_groups"}
    Which pairs of held-out stimuli score each fold (held-out Spearman, importance and
    every test statistic).  ``"all"``: every pair.  ``"between_groups"``: only pairs of
    stimuli from different ``groups`` (runs), so that whatever makes patterns of one run
    alike or apart (per-run z-scoring, a run's drift) cannot pass for a feature's effect:
    with one block per condition per run every same-run pair differs in the condition,
    and on simulated block designs z-scored within run the importance of a feature that
    is not encoded was biased upwards on all pairs and not on pairs between runs (method
    page).  Each held-out fold must then hold two groups or more.  ``"auto"`` (default):
    ``"between_groups"`` when ``groups`` are given, their stimuli differ in the features
    (runs, not items) and every held-out fold holds two groups or more; else ``"all"``.
    The pairs used are recorded in ``settings["held_out_pairs_used"]``.
"""

# --------------------------------------------------------------------------------- I
docdict["imgs"] = """
imgs : 4D image | list of 3D images
    One image per stimulus (trial or condition betas), paths or nibabel images on one
    grid (see :func:`mlem_neuro.fmri.trial_images`).
"""

docdict["interactions"] = """
interactions : bool
    Model (and report) feature interactions ``"f:g"`` (off-diagonal ``W``).  ``False``
    restricts ``W`` to its diagonal; importance then has one row per feature.
"""

docdict["items"] = """
items : None | str | array-like (n_trials,)
    The item (stimulus) of each trial, image or source estimate: a column name of
    ``features``, or one label per row.  The trials of an item are averaged into one
    stimulus before the analysis (per unit and per time point / voxel, or compared
    across ``partitions`` with a cross-validated ``distance``), the feature table keeps
    one row per item (the column named here is an identifier and is dropped from the
    features; a ValueError names the item and the column when trials of an item disagree
    on a feature), folds and pairs are over items, ``groups`` given per trial are
    reduced to one label per item (they must be constant within an item), and explicit
    ``cv`` folds index items (in the order of their first trial).  The result records
    ``n_items``, ``item_labels`` and ``trials_per_item`` in ``settings``.  ``None``:
    every trial is its own stimulus; trials of one stimulus then form pairs at feature
    distance 0 and single-trial noise inflates every neural distance.
"""

docdict["items_bids"] = """
items : str | None
    An events.tsv column naming the item (stimulus) of each trial: the trials of an item
    are averaged into one stimulus (or compared across ``partitions`` with a
    cross-validated ``distance``), and folds and pairs are over items (``items`` of
    :func:`mlem_neuro.mlem_epochs` and :func:`mlem_neuro.mlem_searchlight`; the features
    must be constant within an item).  Every recording's ``events.tsv`` must have it (a
    participant whose file lacks it fails with the file named).  fMRI: with
    ``model="trial"`` only.  ``None``: every trial is a stimulus.
"""

docdict["items_epochs"] = """
items : None | str | array-like (n_epochs,)
    The item (stimulus) of each epoch: a column of the feature table or of
    ``epochs.metadata``, or one label per epoch (or per original event, aligned with
    ``epochs.selection`` as ``groups``).  The epochs of an item are averaged into
    one stimulus before the analysis (per channel and time point), the feature table
    keeps one row per item (the column named here is an identifier and is dropped from
    the features; a ValueError names the item and the column when epochs of an item
    disagree on a feature), folds and pairs are over items, ``groups`` are reduced to one
    label per item (they must be constant within an item), and explicit ``cv`` folds
    index items (in the order of their first epoch).  The result records ``n_items``,
    ``item_labels`` and ``trials_per_item`` in ``settings``.  ``None``: every epoch is
    its own stimulus.
"""

# --------------------------------------------------------------------------------- L
docdict["level"] = """
level : {"feature", "term"}
    What the permutation importance is computed for.  ``"feature"`` (default): permute
    a feature's values across stimuli; measures its total effect, interactions included
    (one row per feature).  It is the same for every metric that ranks pairs alike, so
    it is identifiable.  ``"term"``: permute each term ``P_kk = d_k²`` /
    ``P_kl = 2 d_k d_l`` across pairs (one row per feature and, with interactions, per
    interaction ``"f:g"``).  **Term-level interaction importances are not identifiable
    when every feature distance takes two values** (categorical features, two-valued
    numeric ones): ``W = diag(w) + λ w wᵀ`` ranks every pair alike for all ``λ >= 0``,
    so a fit can move importance between main-effect and interaction terms freely (a
    warning says so).  Evidence for interactions comes from the non-additivity test,
    not from term importances.
"""

docdict["lr"] = _numbers("""
lr : float | "auto"
    AdamW learning rate (no weight decay).  ``"auto"`` (the default) takes ``<GROUPED_LR>``
    for categorical designs (fits on the full batch of exact feature-distance rows) and
    ``<PER_PAIR_LR>`` otherwise (numeric features, mini-batches): with categorical features
    the smaller step left one fit in ten short of its training optimum, while numeric
    designs recover an ill-conditioned metric more precisely with it (options page).
    The rule used is recorded in ``res.provenance["step_rules"]``.
""", GROUPED_LR=_c.GROUPED_STEP_RULE[0], PER_PAIR_LR=_c.PER_PAIR_STEP_RULE[0])

# --------------------------------------------------------------------------------- M
docdict["main_effect"] = """
main_effect : ndarray (n_models, n_features) | None
    Each feature's in-sample main effect at each model: the partial Spearman correlation
    between its distance and the neural distance, the other features' distances held
    fixed (a partial Mantel statistic, on the pairs that scored the folds); ``None``
    when it was not computed.
"""

docdict["mask_img"] = """
mask_img : 3D image
    Voxels whose signal is used (nilearn's ``mask_img``); resampled to the images'
    grid with nearest neighbours when needed.
"""

docdict["max_steps"] = """
max_steps : int
    Maximum training steps (per model).
"""

docdict["missing_distance"] = """
missing_distance : float | dict
    Feature distance of a pair in which either stimulus lacks the value (NaN): ``0``
    by default (the paper's choice); a dict sets it per feature.
"""

# --------------------------------------------------------------------------------- N
docdict["n_iter"] = """
n_iter : ndarray of int (n_folds, n_models)
    Training steps run, per fold and model.
"""

docdict["n_jobs"] = """
n_jobs : int | None
    Chunks of models run in parallel with joblib (``None``: one process; ``-1``: all
    cores).  Inside ``joblib.parallel_config(backend="dask")`` the chunks run on a dask
    cluster.  Each worker runs torch on one intra-op thread (never more than the
    available cores / ``n_jobs``; ``MLEM_NEURO_NUM_THREADS`` overrides), and your torch
    thread setting is restored afterwards.  With ``device="cuda"``, each worker opens its
    own CUDA context on the same GPU; one process (``None``) is the setting the GPU
    checks ran, ``n_jobs > 1`` on a GPU has not been measured.
"""

docdict["n_null"] = _numbers("""
n_null : int
    Null relabellings of the stimuli for single-subject permutation tests (``0``, the
    default: no test).  With ``n_null > 0`` each model (time point, sphere, region) also
    trains ``n_null`` null models per test, in the same stack, and the result gains
    ``tests`` (``"score"``, one per feature, then ``"interactions"``, the test of
    non-additivity of the method page, when interactions are modelled with two or more
    features and the distances come from patterns; its null keeps each feature's main
    effect, a numeric feature's as a polynomial of degree <NUMERIC_DEGREE> in its
    values, so a smooth non-linear effect of one feature is not read as an
    interaction), ``pvalues`` and ``pvalues_fwe``
    ``(n_models, n_tests)``: ``(1 + #{null >= observed}) / (1 + n_null)``, and the same
    against the maximum over models of each null (family-wise error over models).  The
    score's null relabels all stimuli; a feature's null relabels stimuli only among those
    with the same values of every other feature (numeric ones in quantile bins), so it
    holds when other features are encoded (``null``); with ``groups``, only within groups
    (see ``groups``).  A test whose null cannot move what it tests (a feature nested in
    the others, or constant within every group) is not testable: its p-values are NaN and
    a warning says why.  With categorical features (``level="feature"``)
    the null models relabel the feature rows instead of the data and reuse the observed
    ranks, which makes them several times cheaper (same tests, exact either way; see the
    method page).  The cost grows with ``n_null`` times the number of tests (measured
    on 200 trials x 64 channels x 100 time points, three binary features: 200 nulls took
    67 s on one core, 137x the half-second analysis; ``n_jobs=2`` ran them in 37 s; with
    one of the features numeric, whose null models relabel the data, 337 s);
    the smallest p-value is ``1 / (1 + n_null)``, so a test at 0.05 (``p < 0.05``)
    needs ``n_null >= 20`` (99 or more is usual); a feature's test that reads its main
    effect alone (``feature_test``) reads more relabellings at no training cost.
""", NUMERIC_DEGREE=_c.NUMERIC_DEGREE)

docdict["n_null_rsa_trials"] = """
n_null : int
    Null relabellings of the trials (``0``: no test).  The same relabellings serve
    every time point and every feature, so ``pvalues_fwe`` (maximum statistic over
    time points) controls the family-wise error over time points, and
    ``pvalues_fwe_tests`` over time points and features, as in MLEM's results.  The
    smallest p-value is ``1 / (1 + n_null)``.
"""

docdict["n_permutations"] = """
n_permutations : int
    Permutations per term for the permutation importance on held-out pairs (the MLEM
    paper uses 10).
"""

# --------------------------------------------------------------------------------- P
# the repeats with cv=2 (round(folds / 2), as crossval.resolve_n_repeats) at the bounds
# and the reference, and the most stimuli of MODELS time points that reach the upper bound
docdict["n_repeats"] = _numbers("""
n_repeats : "auto" | int
    Repeat an int ``cv`` with new random folds: ``n_repeats × cv`` folds, whose means
    give the importance and the score (repeated K-fold; the result's fold arrays hold
    every fold).  Each repetition costs one more analysis.  It averages out which stimuli
    happen to be held out together, the main source of noise in importance with few
    held-out pairs per fold (measured on the method page).  ``"auto"`` chooses it from
    the number of stimuli ``n`` (items with ``items``) and of models ``M`` (time points,
    spheres, regions): ``<FOLDS> (<STIMULI> / n)**2 (<MODELS> / M)`` folds in all, between
    <LOW> and <HIGH>, so the training costs about what <REFERENCE_REPEATS> repeats of
    ``cv=2`` cost for <STIMULI> stimuli × <MODELS> time points.  With ``cv=2``:
    <HIGH_REPEATS> repeats for one region or a few time points, or for <MODELS> time points
    of <HIGH_STIMULI> stimuli or fewer; <REFERENCE_REPEATS> for <MODELS> time points of
    <STIMULI> stimuli; <LOW_REPEATS> for a whole-brain searchlight.  One repeat when ``cv``
    is not an int.  Repeats are distinct splits, capped at the number of distinct splits
    of the stimuli (of the groups, with ``groups``) into ``cv`` folds: 2 runs into 2
    folds have one, so ``"auto"`` runs it once, and an int above the number warns;
    ``settings["n_repeats_capped"]`` says why.  At most <MAX_REPEATS> (refused above).  The
    number used is recorded in ``settings["n_repeats_used"]``.  With tests (``n_null``)
    and ``"auto"``, the permutation tests read the first <TEST_FOLDS> folds (whole
    repeats), whose null models are most of the cost, and the score and importances
    every fold; with an int every test reads every fold.  ``settings["n_test_folds"]``
    records it (method page, "How many folds the tests read").
""", FOLDS=_c.AUTO_REFERENCE_FOLDS, STIMULI=_c.AUTO_REFERENCE_STIMULI,
    TEST_FOLDS=_c.AUTO_TEST_FOLDS,
    MODELS=_c.AUTO_REFERENCE_MODELS, LOW=_c.AUTO_FOLDS[0], HIGH=_c.AUTO_FOLDS[1],
    REFERENCE_REPEATS=round(_c.AUTO_REFERENCE_FOLDS / 2),
    HIGH_REPEATS=round(_c.AUTO_FOLDS[1] / 2), LOW_REPEATS=round(_c.AUTO_FOLDS[0] / 2),
    HIGH_STIMULI=math.floor(_c.AUTO_REFERENCE_STIMULI
                            * math.sqrt(_c.AUTO_REFERENCE_FOLDS / _c.AUTO_FOLDS[1])),
    MAX_REPEATS=_count(_c.MAX_REPEATS))

docdict["null"] = """
null : {"conditional", "marginal"}
    The question each feature's permutation test asks (with ``n_null``).
    ``"conditional"`` (default): does the feature matter *given the others*? Its null
    relabels stimuli only among those with the same values of every other feature, so a
    feature correlated with an encoded one is not declared significant on the other's
    behalf, but a feature nested in another (animacy within category) cannot be tested
    (NaN p-values) and one strongly correlated with another has little power.
    ``"marginal"``: does the feature matter at all? Its null relabels stimuli ignoring
    the other features (within ``groups``), so a feature is significant when it or any
    feature correlated with it is encoded.  The score's test is the same under both.
"""

# MANY_NUMERIC: the fewest numeric features whose MIN_LEVELS-level grid exceeds MAX_CELLS
docdict["numeric_levels"] = _numbers("""
numeric_levels : "auto" | int | None
    Training grid of numeric feature distances.  Numeric features (pairs rarely repeat)
    otherwise make every training step rank each batch pair by pair; rounding each
    numeric feature's pair distances onto this many equally spaced values (``0`` to the
    largest) lets training work on groups of identical pairs, as with categorical
    features.  Only training is affected: held-out scores and importances always use the
    exact distances.  ``"auto"`` (default) takes the largest grid of at most <MAX_LEVELS>
    levels whose cells (levels to the power of the numeric features, times the
    combinations of the other features) number at most <TARGET_CELLS>, and at least
    <MIN_LEVELS> levels while they number at most <MAX_CELLS>; it trains exactly, pair by
    pair, when <MIN_LEVELS> levels would leave more (<MANY_NUMERIC> or more numeric
    features) or when the cells are not at least 4 times fewer than the training pairs.
    Numeric values that repeat (a few values, or a covariate that is 0 for many stimuli)
    put the pairs into few distinct exact rows: up to <TARGET_CELLS> rows they train on
    those, exactly; beyond, on the grid when it has fewer cells.  ``None`` always trains
    exactly.  Grid training takes mini-batches (see ``batch_size``).  See
    :doc:`/performance` for its speed and measured error.
""", MAX_LEVELS=_c.MAX_LEVELS, TARGET_CELLS=_count(_c.TARGET_CELLS),
    MIN_LEVELS=_c.MIN_LEVELS, MAX_CELLS=_count(_c.MAX_CELLS),
    MANY_NUMERIC=next(m for m in itertools.count(1) if _c.MIN_LEVELS ** m > _c.MAX_CELLS))

docdict["partial_rsa"] = """
partial : bool
    Test each feature's partial Spearman correlation (the ranks of the other
    features' model RDMs removed by least squares from the neural and the model
    RDM ranks) instead of its Spearman correlation.  A feature the others determine
    (identical or nested features) has none: NaN, with a warning.
"""

docdict["participant_label"] = """
participant_label : str | list of str | None
    The participants to analyse (``"01"`` or ``"sub-01"``); default: every participant
    with recordings of the task.
"""

docdict["partitions"] = """
partitions : None | str | array-like
    With ``distance="crossnobis"`` or ``"cv_euclidean"`` (which need ``items``): the
    independent partition of each trial (runs, sessions: a column name or one label per
    trial; every item needs trials in every partition; for epochs, also one per original
    event, aligned with ``epochs.selection``).  ``None`` deals each item's trials
    in turn (shuffled by ``random_state``) into as many parts as the rarest item has
    trials (half as many for crossnobis, which also needs residuals within each part).
"""

docdict["partitions_bids"] = """
partitions : str | None
    With ``distance="cv_euclidean"`` or ``"crossnobis"`` (which need ``items``): an
    events.tsv column giving each trial's independent partition (run, session...;
    every item needs trials in every partition), checked in every recording's
    ``events.tsv`` as ``items``.  ``None``: fMRI uses the runs when there are several
    (as the ``searchlight`` command does); otherwise (MEG / EEG, one run) deals each
    item's trials into parts, as :func:`mlem_neuro.mlem_epochs` does.
"""

docdict["patience"] = _numbers("""
patience : int | "auto"
    Stop when the training (soft) Spearman has not improved by more than ``tol`` for this
    many steps.  The best state seen is restored, even one that improved on the previous
    best by less than ``tol``.  ``"auto"`` (the default): <GROUPED_PATIENCE> for
    categorical designs, <PER_PAIR_PATIENCE> otherwise (with ``lr="auto"``'s steps).
""", GROUPED_PATIENCE=_c.GROUPED_STEP_RULE[1], PER_PAIR_PATIENCE=_c.PER_PAIR_STEP_RULE[1])

docdict["pvalues"] = """
pvalues : ndarray (n_models, n_tests) | None
    Permutation p-value of each test at each model, ``(1 + #{null >= observed}) / (1 +
    n_null)``.
"""

docdict["pvalues_fwe"] = """
pvalues_fwe : ndarray (n_models, n_tests) | None
    The same, family-wise corrected over models (maximum statistic over models), for
    each test on its own: with several tests, the chance of a false positive in *some*
    test is higher (see ``pvalues_fwe_tests``).
"""

docdict["pvalues_fwe_tests"] = """
pvalues_fwe_tests : ndarray (n_models, n_tests) | None
    The same, corrected over models and tests (Holm's step-down over the tests on top of
    ``pvalues_fwe``; see :func:`mlem_neuro.stats.familywise_over_tests`): the chance of
    any false positive, at any model in any test, stays at the level.  Computed from
    ``pvalues_fwe`` when read.
"""

# --------------------------------------------------------------------------------- R
docdict["radius"] = """
radius : float
    Sphere radius in mm (world coordinates); a sphere holds every in-mask voxel
    within ``radius`` of its centre (nilearn's searchlight neighbourhoods).  Images take
    ``radius`` in millimetres, as nilearn; sensors and source spaces take
    ``spatial_radius`` in metres, as MNE (one name per unit).
"""

docdict["random_state"] = """
random_state : None | int | numpy Generator
    Seeds the folds, batches and permutations (results do not depend on ``n_jobs``).
"""

# --------------------------------------------------------------------------------- S
docdict["scale"] = """
scale : bool
    Standardise each channel (zero mean, unit variance over all trials and time
    samples analysed; with ``items``, before the trials of each item are averaged)
    before distances.  On by default, so that channels of different
    types and units (MEG T and T/m, EEG V) weigh alike in the Euclidean distance; the
    transform ignores the features, so it leaks nothing across folds.  ``False`` keeps
    the data's own units (channels with larger variance then dominate).
"""

docdict["settings"] = """
settings : dict | None
    JSON-serialisable analysis settings (constraint, cv, n_permutations, ...), as
    recorded by the analysis.
"""

docdict["space"] = """
space : str | None
    fMRI: the space of the preprocessed runs (fMRIPrep's ``space-<label>``, e.g.
    ``"MNI152NLin2009cAsym"``); needed when the runs are in several spaces.  A template
    space shared by every participant is what the group level needs.
"""

docdict["spatial_radius_sensors"] = """
spatial_radius : float | None
    A sensor searchlight: radius in metres (e.g. ``0.04``; MNE's unit, unlike the images'
    ``radius`` in mm) of the neighbourhood centred
    on every analysed channel, from MNE's channel positions (a montage for EEG).  One
    model per (time point, neighbourhood), and the result is a
    :class:`~mlem_neuro.results.SensorMapResult` (importance topographies over time)
    instead of a :class:`~mlem_neuro.results.TimeCourseResult`.  Pick one sensor family
    (``picks="eeg"`` or ``"meg"``); ``chunk_size`` then counts (time point,
    neighbourhood) models.  ``None`` (default): one model per time point over all
    channels.
"""

docdict["spatial_radius_src"] = """
spatial_radius : float | None
    Searchlight patch radius in metres (e.g. ``0.01``; MNE's unit, unlike the images'
    ``radius`` in mm): a patch holds every source
    within ``spatial_radius`` of its centre, along the cortical surface for surface
    source spaces (MNE's geodesic distances ``src[h]["dist"]``, computed with
    :func:`mne.add_source_space_distances` when ``src`` lacks them up to the radius;
    patches stay in their hemisphere) and in straight line between the grid points of
    a volume source space.  Every source of the estimates is a centre.
"""

docdict["standardize_images"] = """
standardize : "run" | None
    ``"run"``: z-score each voxel across the images of each run (mean 0, standard
    deviation 1 with ``ddof=1``; a voxel constant over a run becomes 0) before the
    distances are computed.  The run of each image is the ``run`` level of the features'
    index (the ``(run, trial)`` index that :func:`~mlem_neuro.fmri.trial_images`
    returns) or, without it, ``groups``; each run needs at least two images.  ``groups``
    also groups the folds by run; to z-score within run without that (e.g. ``items``
    presented in every run), name the index: ``features.set_index(pd.Index(runs,
    name="run"))``.  Recommended for trial or condition betas estimated per run, whose
    run-to-run differences (drift, global signal, position) otherwise dominate the
    distances: on the Haxby data a whole-brain region's held-out Spearman goes from
    about 0 (raw betas) to about 0.09 (:doc:`/options`).
    :func:`~mlem_neuro.fmri.trial_images` already z-scores its trial betas within run by
    default (z-scoring them again changes nothing).  ``None`` (default): the images as
    given.  The transform uses no feature values, so it carries no feature information
    across folds; with folds grouped by run, each run's mean and standard deviation come
    from one side of the fold only.
"""

# --------------------------------------------------------------------------------- T
docdict["task"] = """
task : str
    The task analysed (the label of ``task-<label>`` in the file names).
"""

docdict["terms"] = """
terms : list of str
    The importance terms, one per importance column: ``"f"`` per feature, ``"f:g"`` per
    interaction.
"""

docdict["tests"] = """
tests : list of str | None
    Names of the single-subject permutation tests (``"score"``, then one per feature,
    then ``"interactions"`` when it ran), ``None`` when none was run (``n_null=0``).
"""

docdict["tmax"] = """
tmax : float | None
    End of the time window analysed, in seconds (inclusive); ``None``: up to the last
    sample.
"""

docdict["tmin"] = """
tmin : float | None
    Start of the time window analysed, in seconds (inclusive); ``None``: from the first
    sample.
"""

docdict["tol"] = """
tol : float
    Minimum improvement of the training Spearman that resets ``patience`` (default
    ``1e-4``).  When all training pairs fit in one batch (up to ~90 training stimuli with
    ``batch_size="auto"``) training is deterministic full-batch and the soft Spearman
    keeps creeping up by tiny amounts: with ``tol=0`` training then nearly always runs
    ``max_steps`` (measured on searchlight spheres: median 1000 steps vs ~250 with the
    default).
"""

docdict["training"] = """
training : list of (str, float, int) | None
    What trained the models, the tests' null models and the test of interactions' fits
    included: the ``(backend, lr, patience)`` of each fit, as the analysis gathered them
    (:attr:`mlem_neuro.crossval.CVOutput.training`); recorded in :attr:`provenance`
    (``"training"``: the backends, ``"step_rules"``: the step rules, ``lr="auto"`` and
    ``patience="auto"`` resolved).  ``None``: not recorded.
"""

# --------------------------------------------------------------------------------- V
docdict["verbose"] = """
verbose : bool | str | int | None
    Logging level for this call (``"INFO"`` or ``True`` shows progress, with a progress
    bar over chunks of models in the analyses); ``None`` keeps the level set with
    :func:`mlem_neuro.set_log_level`.
"""

# --------------------------------------------------------------------------------- W
docdict["window"] = """
window : float | None
    Average the samples within ``±window / 2`` seconds of each time point before
    computing distances (a moving average; samples near the edges average the
    neighbours that exist).  ``None`` uses single samples.
"""

#: a placeholder: ``%(key)s`` alone on its line (after the indentation).
_PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)%\((?P<key>\w+)\)s[ \t]*$", re.MULTILINE)
_ANY_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _entry(key, where):
    """The text of ``docdict[key]``, or a ValueError that names the docstring and key."""
    try:
        return docdict[key]
    except KeyError:
        close = difflib.get_close_matches(key, docdict, n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"the docstring of {where} uses %({key})s but docdict has no entry "
                         f"{key!r}.{hint} Add it to mlem_neuro/_docs.py (keys sorted) or fix "
                         "the placeholder.") from None


def fill_docstring(doc, where="a docstring"):
    """Replace every ``%(key)s`` line of ``doc`` with ``docdict[key]``, indented alike.

    Parameters
    ----------
    doc : str
        The docstring.  A placeholder stands alone on its line; its indentation is given
        to every line of the entry.
    where : str
        Name of the documented object, for error messages.

    Returns
    -------
    doc : str
        The filled docstring (text other than the placeholders is left as it is, ``%``
        signs included).
    """
    def replace(match):
        indent = match.group("indent")
        lines = _entry(match.group("key"), where).strip("\n").splitlines()
        return "\n".join(indent + line if line.strip() else "" for line in lines)

    filled = _PLACEHOLDER.sub(replace, doc)
    left = _ANY_PLACEHOLDER.search(filled)
    if left is not None:
        _entry(left.group(1), where)     # an unknown key names itself first
        raise ValueError(f"the docstring of {where} has the placeholder {left.group(0)} "
                         "inside a line; a placeholder must stand alone on its line.")
    return filled


def fill_doc(obj):
    """Fill the ``%(key)s`` placeholders of a function's or class's docstring.

    Use it below ``@verbose`` (inner), so that the wrapper copies the filled docstring;
    applied to a wrapper, it also fills the wrapped function's docstring.

    Parameters
    ----------
    obj : callable | type
        The function or class whose ``__doc__`` is filled in place.

    Returns
    -------
    obj : callable | type
        The same object.

    Raises
    ------
    ValueError
        At import time, when a placeholder names no :data:`docdict` entry.
    """
    doc = obj.__doc__
    if not doc:
        return obj
    where = getattr(obj, "__qualname__", repr(obj))
    obj.__doc__ = fill_docstring(doc, where)
    inner = getattr(obj, "__wrapped__", None)
    if inner is not None and inner.__doc__ == doc:
        inner.__doc__ = obj.__doc__
    return obj


_ROLE = re.compile(r":[\w:]+:`(~?)([^`]+)`")
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.(?=\s|$)")


def short_doc(key):
    """First sentence of the description of ``docdict[key]``, as plain one-line text.

    Meant for command-line help (``argparse``'s ``help=``): reST markup is dropped
    (````x```` → ``x``, ``:class:`~a.B``` → ``B``) and the text is joined on one line.

    Parameters
    ----------
    key : str
        A key of :data:`docdict`, e.g. ``"lr"`` or ``"cv_trials"``.

    Returns
    -------
    text : str
        The first sentence, ending with a period.

    Examples
    --------
    >>> short_doc("lr")
    'AdamW learning rate (no weight decay).'
    """
    lines = _entry(key, "short_doc").strip("\n").splitlines()[1:]
    text = " ".join(line.strip() for line in lines)
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2),
                     text)
    text = text.replace("``", "").replace("**", "")
    end = _SENTENCE_END.search(text)
    return text if end is None else text[: end.end()]
