"""The package's tuning numbers, defined here once, grouped by what they tune.

Each says what it tunes and why it has its value (measured where it says so).  The modules
that use one import it under the name they always used (``crossval.CHUNK_BYTES`` is
:data:`CHUNK_BYTES`), so a test may still set it on that module.  ``tests/test_constants.py``
checks that no other module defines an ALL-CAPS number.

The compiled training kernels (:mod:`mlem_neuro.core.kernels.training`, numba) hold float32
copies of the AdamW constants; ``tests/test_constants.py`` checks they are these.  This module
imports nothing: it is the one module of the package the kernels import.
"""

#: strength of torchsort's soft rank in the soft Spearman that training maximises
#: (regularisation of the isotonic projection; 1.0, the MLEM paper's setting)
SOFT_RANK_STRENGTH = 1.0

#: AdamW's moment decays and denominator offset (torch's defaults; no weight decay)
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8

#: ``lr="auto", patience="auto"`` (the defaults): AdamW's learning rate and the patience of
#: fits on the full batch of exact feature-distance rows (categorical features, grouped:
#: :class:`~mlem_neuro.core.training.engine.GroupedTargets` and grouped full-batch
#: :func:`~mlem_neuro.core.training.engine.fit_stack`).  Measured on the grouped fits of the
#: single-subject tests (``benchmarks/grouped_steps.py``, options page "Categorical
#: designs: the step size"): at ``0.03 / 50`` one fit in ten stopped 0.01-0.04 below the
#: training optimum that larger steps reach (median 159 steps); at ``0.1 / 20`` none did
#: (2026-11-29); on 2026-11-30, 28,000 fits: ``0.1 / 20`` largest shortfall 0.008, median 78
#: steps; ``0.1 / 10`` none more than 0.01 below (largest 0.016), median 51 steps; ``0.1 /
#: 5`` 5.4 % more than 0.01 below (up to 0.05), and on the strong fits its ``W`` moved 0.22
#: from ``0.1 / 20``'s where another seed moves it 0.002 (``0.1 / 10``: 0.003).  So 10:
#: the default tests 0.87x the CPU of patience 20, the same significant time points.
GROUPED_STEP_RULE = (0.1, 10)
#: ... and of every other fit (numeric features per pair or on the grid, mini-batches):
#: there ``0.1`` recovered an ill-conditioned metric less precisely (``sweep_optimiser.py``:
#: W error 0.097-0.123 against 0.078), so those keep ``0.03 / 50``.
PER_PAIR_STEP_RULE = (0.03, 50)
#: steps between the host's checks of which models still train in the torch loop on a GPU
#: (:func:`~mlem_neuro.core.training.torch_loop.check_every`; every step on the CPU, where
#: a check costs nothing): each check waits for the device, and a model that stopped
#: after a check is held (its step computed, not applied) until the next.  Not measured on
#: a GPU yet (no GPU was lent since it was written, 2026-11-30): 10 keeps the held steps
#: under one patience (10) and the checks to a tenth of the steps.  The fits are the same
#: at any value (``tests/test_engine.py``).
GPU_CHECK_EVERY = 10
#: eager steps, on a side stream, before each capture of a CUDA graph of the torch loop's
#: step (:mod:`~mlem_neuro.core.training.graphs`): torch's CUDA graph documentation warms up
#: three iterations before a capture (allocator and library start-up); not measured here
#: (no GPU lent since the graphs were written).
CUDA_GRAPH_WARMUP_STEPS = 3


# ---- Memory: block and chunk sizes (speed and peak memory only; results do not depend on them)
#: memory budget when MLEM_NEURO_MEMORY is not set (4 GiB: a laptop's share, not the machine's)
MEMORY_BYTES = 4 * 2**30
#: bytes of training-pair distances (float64) allowed in one chunk of models (at most a
#: sixteenth of the memory budget: a chunk holds several arrays of that size).
CHUNK_BYTES = 256 * 2**20
#: models per chunk by default: a stack's per-step arrays (models x groups) then stay in
#: the CPU's caches.  Measured on 4,000 whole-brain spheres (one process, 2,926 training
#: pairs, 256 groups): chunks of 1,000 took 80.9 s, of 500 83.2 s, one chunk of 4,000
#: 95.7 s.
MAX_CHUNK_MODELS = 1000
#: the most bytes of relabelled pair columns that the null's chunks keep to share them
NULL_COLUMNS_BYTES = 512 * 2**20
#: float64 arrays of (null models x distance rows) that training the relabelled-feature
#: null models holds at once (counts, rank sums, the soft rank's work arrays).
FAST_NULL_ARRAYS = 32
#: bytes allowed for one chunk of partition means / Gram matrices.
CROSSDIST_CHUNK_BYTES = 256 * 2**20
#: bytes allowed for one chunk of Gram matrices / gathered rows.
NEURAL_CHUNK_BYTES = 512 * 2**20
#: elements (M * n_pairs) above which full neural RDMs are not kept in memory.
MAX_FULL_ELEMENTS = 2 * 10**8
#: bytes of one block of per-pair unit products (units × pairs, float64) in
#: :meth:`mlem_neuro.core.rdms.sources.SphereRDMSource.rdm`.
SPHERE_BLOCK_BYTES = 32 * 2**20
#: elements (models x pairs) of one block of rank_sums' sorted walks.
RANK_WALK_ELEMENTS = 2**22
#: bytes of all-pairs distances (float64) of one block of the interaction test's models.
INTERACTION_BLOCK_BYTES = 256 * 2**20
#: float64 arrays of (models x distance rows) that a training stack holds at once; one
#: stack of the interaction test takes up to a quarter of the memory budget with them.
#: Every fold's models train together, so the steps' fixed cost is paid once per stack
#: (with a stack per fold and block of models it was most of the test's time).
STACK_ARRAYS = 32
#: elements (models × groups²) allowed for the interval table of one call.
MAX_TABLE_ELEMENTS = 3 * 10**7
#: rows solved by one call of scipy's solver (bounds the shift that keeps rows apart,
#: hence its rounding: about 1e-16 x rows x spread).
PAV_ROWS = 1024
#: smallest block of pairs walked at once (keeps tiny test budgets from crawling).
MIN_BLOCK_PAIRS = 64
#: bytes per stimulus pair at the peak of a training step of one model (the estimator
#: refuses a ``batch_size`` beyond the budget with it).  Measured: peak resident memory of
#: 20 full-batch steps on 3,000 stimuli (4.5 million pairs, 2 features): 218 bytes a pair
#: trained pair by pair (``numeric_levels=None``), 85-100 on groups of identical pairs.
TRAIN_PAIR_BYTES = 224
#: bytes per stimulus pair that checking and condensing a precomputed dissimilarity matrix
#: holds at its peak (pair indices, both triangles, their comparison).  Measured with
#: tracemalloc on 3,000 stimuli: 56.0.
PRECOMPUTED_PAIR_BYTES = 56


# ---- Fast paths: when grouping and grids are used (exact paths otherwise)
#: largest number of distinct term rows for which the grouped path is used.
MAX_GROUPS = 4096
#: most distinct feature rows of the stimuli for which a universe is built.
MAX_STIMULUS_CODES = 256
#: most feature rows in the universe (stimuli's rows and the rows importance creates).
MAX_CODES = 2048
#: most grid levels per numeric feature chosen by ``numeric_levels="auto"``.
MAX_LEVELS = 16
#: fewest levels ``"auto"`` accepts; below it training stays pair by pair (exact).
MIN_LEVELS = 4
#: grid cells (distinct term rows) ``"auto"`` aims at: the most levels within it.
TARGET_CELLS = 256
#: most grid cells ``"auto"`` accepts (reached with :data:`MIN_LEVELS` levels only).
MAX_CELLS = 1024
#: blocks of pairs whose unions form the mini-batches of grid training.
N_BLOCKS = 32
#: values of a column looked at first when counting its distinct values up to a cap.
DISTINCT_SAMPLE = 512
#: numeric and ordinal distances (in units of the training range) are rounded to
#: multiples of ``1 / DISTANCE_GRID`` (about 1e-9), so that gaps equal up to rounding tie
#: exactly: ``0.3 - 0.2`` and ``0.2 - 0.1`` differ in their last bits, and exact
#: Spearman ranked such pairs apart by rounding noise.
DISTANCE_GRID = 2.0 ** 30


# ---- Numerical floors
#: floor of a norm or standard deviation below which a vector counts as constant (far
#: below any data's spread, far above float64 rounding of 0)
NORM_EPS = 1e-12
#: floor of the quadratic form under the square root of a prediction (sqrt(q) has an
#: infinite slope at 0; the floor keeps the gradient finite)
PREDICT_EPS = 1e-12
#: floor of the variance of a mini-batch's target ranks (grid blocks)
BLOCK_VAR_EPS = 1e-24
#: the Mantel tests (:func:`mlem_neuro.rsa.mantel_tests`): a feature's model RDM (centred
#: ranks, unit norm) whose residual on the other features' model RDMs is shorter than this
#: is determined by them (its partial test is undefined, NaN); also the relative floor of
#: the singular values spanning the model RDMs and of the neural RDM's residual.  Measured
#: on 48 stimuli: a feature identical to another, its complement, or an affine copy of a
#: numeric one leaves 0 to 2.3e-16; a binary feature that differs from another on 1
#: stimulus of 48 leaves 0.40, a numeric one rounded to 0.1 (values ~N(0, 1)) 0.076.
MANTEL_RESIDUAL_RTOL = 1e-8
#: a permuted correlation counts as at least the observed one from the observed minus
#: this (the permuted and observed statistics come from different products, so equal
#: correlations may differ in their last bits)
MANTEL_TIE_TOL = 1e-12


# ---- Training paths (speed only; every path trains the same models)
#: elements (n_pairs * n_terms) up to which the pair term matrix is built once and gathered.
MAX_TERM_ELEMENTS = 5 * 10**7
#: elements (models * pairs) up to which target ranks come from one global sort per model.
MAX_RANKER_ELEMENTS = 2 * 10**7
#: training pairs up to which ``batch_size="auto"`` trains grouped designs on every pair
#: (the cap of the paper's selection).  Above it, ranking all pairs once per model costs
#: more than the steps save: at 6,400 trials (13 million training pairs per fold) full
#: batches took 134 s (94 s of it ranking) against 49.5 s with the selected mini-batches.
FULL_BATCH_PAIRS = 2**18
#: the most features the compiled loop trains (W at most 64 x 64): the grid's block
#: masks are one 64-bit word, and beyond it torch's batched algebra is as fast
COMPILED_MAX_FEATURES = 64
#: models below which a stack trains on one thread even when the compiled loop may use
#: more: a small stack gains little, and the parallel kernel's first compile costs about
#: 12 s once per installation (a first small analysis: 5 s instead of 17.6 s)
COMPILED_PARALLEL_MODELS = 32
#: float64 values of the grid's per-step counts the compiled loop keeps (64 MiB):
#: computed once per step for all models; beyond it, once per model and step
COMPILED_COUNT_CACHE = 2**23


# ---- Statistics, training and design checks (these change results; each was measured)
#: batch size selection (paper appendix): the first batch size tried
BATCH_START = 4096
#: ... the batches drawn per size (64, the paper's)
BATCH_DRAWS = 64
#: ... the std of feature-distance correlations across batches below which a size is
#: kept (0.01, the paper's)
BATCH_THRESHOLD = 0.01
#: ... the factor by which a size grows when it is not (1.2, the paper's)
BATCH_GROWTH = 1.2
#: ... the largest size tried (2**18 pairs: the memory of one step stays small)
BATCH_CAP = 2**18
#: random K-fold splits drawn at most per repeat until every fold can be used
#: (:func:`mlem_neuro.crossval.check_cv`'s ``usable``); past it the first draw is kept,
#: and its folds' own errors say what is wrong.
MAX_SPLIT_DRAWS = 100
#: ``n_repeats="auto"``: the least and the most folds (``cv x n_repeats``) it gives
AUTO_FOLDS = (12, 100)
#: ... and its reference: :data:`AUTO_REFERENCE_FOLDS` folds for an analysis of
#: ``AUTO_REFERENCE_STIMULI`` stimuli and ``AUTO_REFERENCE_MODELS`` models (time points,
#: spheres); the training cost, about ``folds x stimuli**2 x models``, is kept at the
#: reference's (measured: ``validation/power_defaults.py``, ``bench_defaults_cost.py``)
AUTO_REFERENCE_FOLDS, AUTO_REFERENCE_STIMULI, AUTO_REFERENCE_MODELS = 20, 200, 100
#: ``n_repeats="auto"`` with tests: the permutation tests (score, features, interactions)
#: read the first repeats of the analysis's folds, at most this many folds (whole
#: repeats: 10 of ``cv=2``); the scores and importances it reports use every fold.  Their
#: null models are most of an analysis's cost, and ``"auto"`` gives up to 100 folds to
#: small designs.  Measured side by side on the same datasets (``validation/test_folds.py``,
#: 2026-11-29; method page, "How many folds the tests read"): on 70 XOR datasets the
#: power of A / B / interactions 0.629 / 0.657 / 0.657 with 20 folds against 0.643 / 0.671
#: / 0.657 with 100 (no difference significant), for five times fewer null fits.
AUTO_TEST_FOLDS = 20
#: the most repetitions of an int cv accepted (``n_repeats``), refused up front above it:
#: twenty times the most that ``"auto"`` gives (50 repeats of ``cv=2``, 100 folds).  The
#: spread due to the split falls as ``1 / sqrt(n_repeats)`` (0.46-0.55 of one split's
#: with 4 repeats, ``tests/test_repeats.py``): at 1000 it is 3 % of one split's, while
#: the training costs 1000 analyses.  Drawing the folds took 4.2 s per 10**5 repeats (40
#: stimuli, ``cv=2``), so ``n_repeats=10**7`` ran for minutes before any training.
MAX_REPEATS = 1000
#: the distinct splits of the stimuli (or groups) into folds are listed, and repeats drawn
#: from the list without replacement, when there are fewer than this many times the
#: repeats asked for; with more, random splits are drawn and one already drawn is drawn
#: again (on average at most this many draws per repeat).
SPLITS_PER_REPEAT = 2
#: level of the test of interactions from which the staged feature test
#: (``feature_test="staged"``, :func:`~mlem_neuro.core.scoring.main_effect.staged`) adds
#: the held-out importance to a feature's main effect in a model.  Gates of 0.01, 0.02,
#: 0.05, 0.1, 0.2, 0.5 and "always" (the combined test) measured side by side on the same
#: datasets (``validation/feature_statistic.py``, 2026-11-29, 100 datasets per cell, 300
#: null datasets; method page "The feature test"): a stricter gate loses the XOR code
#: (found in 0.42 of datasets at 0.01, 0.54 at 0.05, 0.55 always), a looser one main
#: effects (IT-like ``position`` 0.43 at 0.05, 0.33 always); null rate 0.057 at 0.05
#: (0.050 at 0.01, 0.063 always, the main effect alone 0.043).  Those datasets have one
#: model; with more (time points, spheres) the gate reads the test's family-wise p-value
#: over them (:func:`mlem_neuro.inference.run_analysis`): read per model it opened by
#: chance somewhere in 0.23 of null analyses of 10 time points and in every emulated
#: analysis of 200, family-wise in 0.09 and none (``validation/staged_gate.py``,
#: 2026-11-29; method page, "Where the gate opens").
STAGED_GATE = 0.05
#: relabellings of each feature's main-effect test where it is the feature's whole test
#: (``feature_test="staged"`` with the gate shut in every model, or ``"main_effect"``):
#: ``max(n_null, MAIN_EFFECT_NULLS)``, the first ``n_null`` those of the trained tests.
#: The main effect needs no training (a partial rank correlation per relabelling), so its
#: resolution need not be the trained tests'.  Measured side by side on the same datasets
#: (``validation/feature_statistic.py --main-only``, 100 datasets per cell, 2026-11-29):
#: with 99 relabellings it found a weak feature 0-8 points less often than a partial
#: Mantel test with 999 permutations (binary 0.66 vs 0.72, IT-like ``position`` 0.42 vs
#: 0.47, unbalanced 0.46 vs 0.54 at the next amplitude), with 999 as often (0.73 vs
#: 0.72, 0.46 vs 0.47; unbalanced 0.11 vs 0.15): a p-value of ``1 / (1 + n)`` steps, and
#: p < 0.05 means p <= 0.04 with 99.
MAIN_EFFECT_NULLS = 999
#: ... when their null statistics (models x features x relabellings, float64) fit in this
#: share of the memory budget (else the trained tests' ``n_null``: a whole-brain
#: searchlight's 64,292 spheres x 8 features x 999 would hold 4.1 GB).
MAIN_EFFECT_NULLS_SHARE = 8
#: quantile bins of a numeric feature when it defines the strata of another feature's null.
NULL_BINS = 5
#: relative size under which a feature's main-effect residual (its distance ranks once the
#: other features' are removed) or a basis direction counts as zero
#: (:mod:`~mlem_neuro.core.scoring.main_effect`): a duplicated feature left residuals of
#: 3.8e-16 and 6.1e-16 of its norm (float64 rounding; 66 and 1,128 pairs, the design of
#: tests/test_main_effect.py), a feature of its own 0.96-1.0; 1e-9 sits far from both,
#: leaving room for the rounding of 10**6 pairs.
MAIN_EFFECT_TOL = 1e-9
#: degree of the polynomial by which a numeric or ordinal feature enters the null's main
#: effects (capped at its number of distinct values − 1, so that a feature of 4 values or
#: fewer enters with one free effect per value).  Degree 1 (the linear code the model
#: sees) put a numeric feature's non-linear main effect into the shuffled residuals: 0.111
#: of pure-main-effect datasets rejected at 0.05 with a saturating code beside a correlated
#: categorical feature; degree 3: 0.045 (``validation/calib_null.py --only
#: levels-numeric``, 300 datasets; method page).
NUMERIC_DEGREE = 3
#: absolute Spearman correlation of two features' pair distances from which they are
#: reported as ``"correlated"`` (measured, see the module notes: from 0.6 on every
#: simulated design had lost power, 13-72 % of it).
CORRELATION_THRESHOLD = 0.6
#: pairs used for the correlations: all of them up to this many, else this many drawn
#: with :data:`mlem_neuro.core.stimuli.design.PAIR_SEED`.
DESIGN_MAX_PAIRS = 50_000
#: a regressor whose largest |value| is below this fraction of the run's largest regressor
#: of interest is refused (measured: a 0 s event beside a 30 s block is at 0.008)
NULL_REGRESSOR = 1e-4
#: correlation above which two regressors of interest cannot be told apart
TWIN_REGRESSORS = 0.999


# ---- Running: threads and warnings about long runs
#: projected run times (s) above which an analysis with tests warns before going on.
LONG_RUN_SECONDS = 600
#: model fits (folds x (1 + n_null x tests) x models, plus the test of interactions')
#: from which an analysis is projected before it runs (:mod:`mlem_neuro._projection`);
#: below, it is trivial: fits cost 0.1-0.5 ms each (the defaults' 2,000 fits took 1.05 s,
#: with 99 nulls 0.99 million fits 70.6 s on 2 workers: performance page), so 20,000 fits
#: take seconds.
PROJECTION_MIN_FITS = 20_000
#: rows (models x (1 + null rows)) trained by the calibration chunk, the first chunk cut
#: small to time it: enough that a step's fixed cost is shared as in a full chunk (chunks
#: of 500 and 1,000 models cost the same per model, 83.2 and 80.9 s: see
#: :data:`MAX_CHUNK_MODELS`), a few models of one fold in all (one with 99 nulls).
CALIBRATION_ROWS = 256
#: the projected time is said as a range, from the projection divided by this to it
#: multiplied by this.  Measured on the 2-core reference machine under load (load 5-6.5;
#: 60 trials x 16 channels x 20 time points, 3 features, 100 folds, ``n_null=99``): the
#: fold loop projected about 4 min after 1.2 s, took 295 s; the test of interactions
#: projected roughly 2 min, took 146 s (actual / projected about 1.2; one run).
PROJECTION_SPREAD = 2
#: speed-up per worker of ``n_jobs`` workers on as many cores (measured: 1.80x with 2
#: workers on 2 cores, ``bench_null.py --n-jobs 2``).
PARALLEL_EFFICIENCY = 0.9
#: time of numeric features trained pair by pair (``numeric_levels=None``) over that on
#: the grid (``"auto"``): 10.7-40x (``bench_numeric.py``, 200-800 trials; the least kept).
PER_PAIR_TIME_RATIO = 10
#: time on one GPU over that on the CPU for stacks of hundreds of models or more
#: (measured, H100 against its 16 cores: 0.21 per step at 256 categorical models, 0.09
#: for the whole brain; smaller stacks gain nothing, 1.16-1.64)
GPU_TIME_RATIO = 0.2
#: least fraction of the projected time an option must save to be named as cheaper.
CHEAPER_MIN_SAVING = 0.3
#: intra-op threads per worker when ``MLEM_NEURO_NUM_THREADS`` is not set (measured: see
#: the performance page).
DEFAULT_THREADS = 1
