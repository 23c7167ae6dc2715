"""The training engine: fit a stack of ``M`` independent MLEM models.

All models share the stimuli, hence the pair feature distances; each has its own neural
distances (one row of an ``(M, n_pairs)`` block) and its own parameters ``A[m]``.  The
engine prepares what each step trains against (the batch objects :class:`_StepTargets`
and :class:`GroupedTargets`), resolves the step rule (:func:`step_rule`) and hands the
stack to the backend :func:`~mlem_neuro.core.training.backends.choose_backend` picks from
the table of backends (:mod:`mlem_neuro.core.training.backends`); the fit it returns
names that backend and the step rule.

When the pairs' term rows take few distinct values (categorical designs), soft ranks are
computed on groups of identical pairs (:mod:`mlem_neuro.core.ranks.grouped`), and mini-batch target
ranks come from one sort of all pairs per model (:class:`~mlem_neuro.core.ranks.spearman.
SubsetRanks`): no step sorts the batch.  Both give the same numbers as the per-pair path.
On the CPU the steps of such grouped designs (full batches and the grid's mini-batches
of blocks) run compiled with the gradient by hand, each model to its own stop
(:mod:`mlem_neuro.core.training.compiled`, numba): the torch steps to float32 rounding at a
fraction of their fixed cost.  On a GPU, and for per-pair designs, the steps run in torch
(:mod:`mlem_neuro.core.training.torch_loop`).  Every backend is tested against
:mod:`mlem_neuro.core.training.reference`, the training written for clarity (torch autograd,
:func:`torchsort.soft_rank`, :class:`torch.optim.AdamW`).

A batch object's public interface, all that the backends read: ``M``, ``k``, ``l`` (the
terms), ``b`` (pairs per step), ``full``, ``grouped``; ``next_batch(idx)`` (draw the step's
batch for the active models ``idx``), ``drop(keep)`` (stopped models leave),
``soft_spearman(tw, constraint)`` (the torch loop's score), ``model_batch(j)`` (one
model's rows, counts and target sums: the reference's), ``numpy_batch()`` and
``block_tables()`` (the compiled loop's), ``describe()``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..constants import (
    FULL_BATCH_PAIRS,
    GROUPED_STEP_RULE,
    MAX_RANKER_ELEMENTS,
    MAX_TERM_ELEMENTS,
    MEMORY_BYTES,
    PER_PAIR_STEP_RULE,
)
from ..options import MLEMOptions
from ..ranks import grouped
from ..ranks.spearman import (
    SOFT_RANK_STRENGTH,
    SubsetRanks,
    rankdata,
    soft_spearman,
    standardize,
)
from ..runtime import Runtime
from ..stimuli.pairs import linear_to_pair, n_pairs, pair_indices, sample_pairs
from ..utils import check_device, check_random_state, logger
from . import quantise
from .backends import BACKENDS, choose_backend
from .batch_size import select_batch_size
from .metric import predict, quadratic_forms, term_index, term_matrix
from .stackfit import StackFit

__all__ = ["fit_stack", "fit_grouped", "step_rule", "choose_backend", "PairSetup",
           "GroupedTargets", "StackFit", "BACKEND_NAMES"]


class PairTerms:
    """Term matrices ``P`` (rows: pairs, columns: terms) of the training pairs.

    Built once for all pairs when it fits in memory (mini-batches then gather rows),
    otherwise computed per batch from the encoded features.  ``build=False`` defers it to
    :meth:`build` (the grouped path needs only the distinct rows, :meth:`codes`).
    ``memory_bytes``: the memory budget (the runtime's; ``None``: the default,
    :data:`~mlem_neuro.core.constants.MEMORY_BYTES`).
    """

    def __init__(self, enc_t, n, k, l, build=True, memory_bytes=None):
        self.enc_t, self.n, self.k, self.l = enc_t, n, k, l
        self.memory_bytes = MEMORY_BYTES if memory_bytes is None else int(memory_bytes)
        self.all = self.distances = None
        if build:
            self.build()

    def build(self, keep_distances=False):
        """Compute every pair's row when they fit in memory (else leave :attr:`all` None);
        ``keep_distances``: keep their feature distances too (:attr:`distances`)."""
        if self.all is None and \
                n_pairs(self.n) * len(self.k) <= min(MAX_TERM_ELEMENTS,
                                                     self.memory_bytes // 32):
            i, j = pair_indices(self.n)
            self.all = self._compute(i, j, keep=keep_distances)

    def _compute(self, i, j, keep=False):
        D = self.enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
        if keep:                                   # every pair's distances (for the grid)
            self.distances = D
        return term_matrix(D, self.k, self.l)

    def codes(self):
        """The rows of all pairs as a function of stimulus codes (:class:`grouped.PairCodes`)."""
        return grouped.PairCodes.from_values(self.enc_t.values, self.enc_t.missing,
                                             self._compute, memory_bytes=self.memory_bytes)

    def take(self, lin, i=None, j=None):
        """Rows for linear pair indices ``lin`` (``i, j`` computed when not given)."""
        if self.all is not None:
            return self.all[torch.as_tensor(lin, device=self.all.device)]
        if i is None:
            i, j = linear_to_pair(lin, self.n)
        return self._compute(i, j)




def resolve_batch_size(batch_size, terms, n, rng, groups=None):
    """Pairs per step: ``"auto"``, ``"full"`` or an int.

    ``"auto"`` trains on all pairs when they fall into groups of identical term rows
    (categorical designs) and are at most :data:`FULL_BATCH_PAIRS`: a step then costs
    ``O(groups)`` per model whatever the number of pairs, less than a mini-batch step
    (whose target ranks need a pass over every pair), and the full batch is what the
    paper's selection converges to.  Otherwise (numeric features, or more pairs, where
    ranking every pair of every model once costs more than the steps save) it runs the
    paper's selection (:func:`select_batch_size`).
    """
    total = n_pairs(n)
    if batch_size == "auto":
        if groups is not None and total <= FULL_BATCH_PAIRS:
            return total
        return select_batch_size(terms.take, n, rng, groups=groups)
    if batch_size == "full":
        return total
    return min(int(batch_size), total)


class PairSetup:
    """What training on a set of stimuli needs before any model is seen: the term rows,
    their groups (categorical designs) and the batch size, with the random stream as the
    batch-size selection left it.

    It depends on the stimuli, the features, the options and the seed only, so chunks of
    models of one fold share one (:func:`mlem_neuro.crossval.run_cv` computes it once per
    fold and passes it to :func:`fit_stack`); each fit continues from a copy of the stream.

    Parameters
    ----------
    enc : EncodedFeatures
    fit_kw : dict
        :meth:`MLEMOptions.fit_kwargs`.
    rng : numpy Generator
        Draws the batch-size selection (advanced by it).
    dev, dtype
        Where and in which precision the term rows live.
    memory_bytes : int | None
        The memory budget (the runtime's,
        :attr:`~mlem_neuro.core.runtime.Runtime.memory_bytes`; ``None``: the default).
    """

    def __init__(self, enc, fit_kw, rng, dev, dtype, memory_bytes=None):
        self.n = enc.n_stimuli
        self.k, self.l = term_index(enc.n_features, fit_kw["interactions"])
        self.terms = PairTerms(enc.to_torch(dev, dtype), self.n, self.k, self.l, build=False,
                               memory_bytes=memory_bytes)
        # few distinct term rows (categorical designs): work on groups of identical pairs,
        # found from the stimuli's codes when that pays (no row of every pair is built)
        codes = self.terms.codes()
        if codes.pays():
            groups = grouped.distinct_rows(None, codes)
        else:
            self.terms.build(keep_distances=True)           # the grid's cells need them
            groups = grouped.distinct_rows(self.terms.all) if self.terms.all is not None else None
        if groups is None:
            self.terms.build()
        self.levels = None
        if groups is not None and quantise.prefers_grid(groups[0].shape[0],
                                                        fit_kw["numeric_levels"]):
            # many exact rows (a numeric feature whose values repeat): the grid, when it
            # has fewer cells
            self.terms.build(keep_distances=True)
            if self.terms.all is not None:
                grid, levels = quantise.training_groups(
                    enc.to_torch(dev, dtype), self.n, self.k, self.l,
                    fit_kw["numeric_levels"], D=self.terms.distances, P=self.terms.all)
                if grid is not None and grid[0].shape[0] < groups[0].shape[0]:
                    groups, self.levels = grid, levels
        if groups is None and self.terms.all is not None:
            # numeric features: group pairs on a grid of distances (training only)
            groups, self.levels = quantise.training_groups(
                enc.to_torch(dev, dtype), self.n, self.k, self.l, fit_kw["numeric_levels"],
                D=self.terms.distances, P=self.terms.all)
        self.terms.distances = None
        self.groups = groups
        self.blocks = None
        if (self.levels is not None and fit_kw["batch_size"] == "auto"
                and n_pairs(self.n) <= FULL_BATCH_PAIRS):
            # grid training takes mini-batches as exact training does, unions of blocks of
            # pairs (whose tables cost what the full batch's ranks did); above the cap, as
            # any design, the paper's selection on pairs
            self.blocks = quantise.GridBlocks(groups[1], groups[0].shape[0], rng)
            self.b = self.blocks.select(groups[0], rng)
        else:
            self.b = resolve_batch_size(fit_kw["batch_size"], self.terms, self.n, rng,
                                        groups)
        self.rng_state = rng.bit_generator.state

    def stream(self):
        """A fresh generator at the state the batch-size selection left."""
        rng = np.random.default_rng()
        rng.bit_generator.state = self.rng_state
        return rng


class _StepTargets:
    """What each step trains against: term rows (or groups of them) and target ranks.

    Full batch: fixed for the whole fit (rows of stopped models are dropped).  Mini-batch:
    a fresh batch of distinct pairs per step, whose exact within-batch target ranks come
    from one global sort per model (:class:`SubsetRanks`) when it pays, else from a sort.
    With few distinct term rows (categorical designs) pairs are handled as groups.
    ``runtime`` (:class:`~mlem_neuro.core.runtime.Runtime`; ``None``: ``Runtime()``) says
    whether the compiled kernels are on (:attr:`compiled`, which the backends read) and
    the memory budget of the batches' tables.
    """

    def __init__(self, enc, targets, fit_kw, rng, dev, dtype, setup=None, runtime=None):
        runtime = Runtime() if runtime is None else runtime
        self.compiled, budget = runtime.compiled, runtime.memory_bytes
        self.n, self.M = enc.n_stimuli, targets.n_models
        self.total = n_pairs(self.n)
        if setup is None:
            setup = PairSetup(enc, fit_kw, rng, dev, dtype, memory_bytes=budget)
        else:
            rng = setup.stream()
        self.rng, self.dev, self.dtype, self.targets = rng, dev, dtype, targets
        self.k, self.l, self.terms = setup.k, setup.l, setup.terms
        groups = setup.groups
        self.levels = setup.levels
        self.grouped = groups is not None
        self.b = setup.b
        self.full = self.b >= self.total
        if self.grouped:
            P_uniq, self.uid = groups
            self.P_uniq = P_uniq.double()
            self.n_groups = P_uniq.shape[0]
        self.ranker = self.blocks = None
        # grid mini-batches: per-block tables (M, cells, blocks), within an eighth of the
        # memory budget (else batches of pairs, ranked within the batch)
        if (setup.blocks is not None and not self.full and targets.full is not None
                and self.M * self.n_groups * quantise.N_BLOCKS * 8 <= budget // 8):
            self.blocks = setup.blocks.targets(targets.full.to(dev), rng, targets.ranked,
                                               compiled=self.compiled)
        # one sort per model pays while the pairs are at most ~8 batches
        if (self.blocks is None and not self.full and targets.full is not None
                and self.M * self.total <= MAX_RANKER_ELEMENTS and self.total <= 8 * self.b):
            self.ranker = SubsetRanks(targets.full.to(dev), self.uid if self.grouped else None,
                                      compiled=self.compiled)
            self.ranker_rows = torch.arange(self.M, device=dev)
        if self.full:
            self._init_full()

    def _init_full(self):
        i, j = pair_indices(self.n)
        # every pair in pair order: the full rows themselves when they are held
        values = (self.targets.full if self.targets.full is not None
                  else self.targets.take(np.arange(self.total), i, j)).to(self.dev)
        tz = standardize(values if self.targets.ranked else rankdata(values))
        if self.grouped:
            self.counts = torch.bincount(self.uid, minlength=self.n_groups)
            self.all_present = bool((self.counts > 0).all())
            self.t_active = torch.zeros(self.M, self.n_groups, dtype=torch.float64,
                                        device=self.dev).scatter_add_(
                1, self.uid.expand(self.M, self.total), tz.double())
        else:
            self.Pt = self.terms.take(np.arange(self.total), i, j)
            self.t_active = tz.to(self.dtype)     # rows follow the models still training

    def describe(self):
        return (f"{'full' if self.full else 'mini'} batches of {self.b} pairs"
                + (" (unions of blocks), " if self.blocks is not None else ", ")
                + (f"{self.n_groups} distinct term rows" if self.grouped else "expanded")
                + (f" (numeric distances on {self.levels} levels)" if self.levels else ""))

    def next_batch(self, idx):
        """Draw the step's batch (mini-batch mode) for the active models ``idx``."""
        if self.full:
            return
        if self.blocks is not None:
            self.counts, self.t_active = self.blocks.draw()
            return
        lin = sample_pairs(self.rng, self.total, self.b)
        lin_t = torch.as_tensor(lin, device=self.dev)
        if self.grouped:
            u = self.uid[lin_t]
            self.counts = torch.bincount(u, minlength=self.n_groups)
            if self.ranker is not None:
                self.t_active = self.ranker.group_sums(lin_t, self.counts)[self.ranker_rows]
                return
        if self.ranker is not None:
            tz = standardize(self.ranker.ranks(lin_t)[self.ranker_rows])
        else:
            i, j = (None, None) if self.targets.full is not None else linear_to_pair(lin,
                                                                                    self.n)
            tz = standardize(rankdata(self.targets.take(lin, i, j, models=idx).to(self.dev)))
        if self.grouped:
            self.t_active = torch.zeros(len(idx), self.n_groups, dtype=torch.float64,
                                        device=self.dev).scatter_add_(
                1, u.expand(len(idx), self.b), tz)
        else:
            self.Pt = self.terms.take(lin)
            self.t_active = tz.to(self.dtype)

    def soft_spearman(self, tw, constraint):
        """Soft Spearman of the active models with term weights ``tw`` on this batch."""
        if not self.grouped:
            return soft_spearman(predict(quadratic_forms(tw, self.Pt), constraint),
                                 self.t_active)
        P, counts, t = self._grouped_batch()
        q = quadratic_forms(tw.double(), P)
        return grouped.grouped_soft_spearman(predict(q, constraint), counts, t,
                                             SOFT_RANK_STRENGTH,
                                             self.total if self.full else None).to(self.dtype)

    def _grouped_batch(self):
        """Term rows, counts and target sums of the groups present in this step's batch."""
        if self.full and self.all_present:     # read once: no host read per step
            return self.P_uniq, self.counts, self.t_active
        present = self.counts > 0
        if bool(present.all()):
            return self.P_uniq, self.counts, self.t_active
        return self.P_uniq[present], self.counts[present], self.t_active[:, present]

    def numpy_batch(self):
        """:meth:`_grouped_batch` in numpy float64 (for :mod:`compiled`)."""
        P, counts, t = self._grouped_batch()
        return P.numpy(), counts.double().numpy(), t.double().numpy()

    def block_tables(self):
        """The grid's mini-batches of blocks (for :mod:`compiled`): ``(P, blocks)``, the
        distinct term rows ``(U, T)`` in numpy float64 and the models' block targets
        (:meth:`quantise.GridBlocks.targets`); ``None`` when this design trains
        otherwise."""
        if self.blocks is None:
            return None
        return self.P_uniq.numpy(), self.blocks

    def model_batch(self, j):
        """The ``j``-th active model's current batch (for :mod:`reference`): ``(P,
        counts, sums)``, term rows ``(G, T)``, pairs per row ``(G,)`` and sums of the
        standardised exact target ranks over each row's pairs ``(G,)``; per-pair designs
        give each pair its own row and ``counts=None``."""
        if not self.grouped:
            return self.Pt, None, self.t_active[j]
        counts = self.counts[j] if self.counts.dim() == 2 else self.counts
        return self.P_uniq, counts, self.t_active[j]

    def drop(self, keep):
        """Stopped models (``~keep`` among the active ones) leave the computation."""
        if self.full:
            self.t_active = self.t_active[keep]
        if self.blocks is not None:
            self.blocks.keep(keep)
        if self.ranker is not None:
            # stopped rows are dropped from the ranker in bulk, not at every stop
            self.ranker_rows = self.ranker_rows[keep]
            if len(self.ranker_rows) < 0.75 * self.ranker.n_rows:
                self.ranker.keep(self.ranker_rows)
                self.ranker_rows = torch.arange(len(self.ranker_rows), device=self.dev)


def fit_stack(enc, targets, options=None, *, random_state=None, dtype=torch.float32,
              setup=None, runtime=None):
    """Fit ``M`` MLEM models sharing stimuli and features.

    Parameters
    ----------
    enc : EncodedFeatures
        Encoded features of the ``n`` training stimuli.
    targets : NeuralTargets
        Neural distances of the ``M`` models on the same stimuli.
    options : MLEMOptions | None
        Training options (``constraint``, ``interactions``, ``max_steps``, ``patience``,
        ``lr``, ``tol``, ``batch_size``, ``device``); ``None`` uses the defaults.
    random_state : None | int | numpy Generator
        Seeds the batch-size selection and the mini-batches.
    dtype : torch dtype
        Training precision.
    setup : PairSetup | None
        The model-independent setup of these stimuli, options and ``random_state``, when
        already computed (e.g. for another chunk of models of the same fold; the fit then
        continues its random stream and ``random_state`` is not used); ``None`` computes it.
    runtime : Runtime | None
        The analysis's :class:`~mlem_neuro.core.runtime.Runtime` (the compiled kernels on
        or off, the compiled loop's threads, the memory budget); ``None``: ``Runtime()``,
        one thread.

    Returns
    -------
    StackFit
    """
    opts = MLEMOptions() if options is None else options
    fit_kw = opts.fit_kwargs()
    dev = check_device(opts.device)
    rng = check_random_state(random_state)
    runtime = Runtime() if runtime is None else runtime
    data = _StepTargets(enc, targets, fit_kw, rng, dev, dtype, setup, runtime)
    logger.debug("fit_stack: %d models, %d stimuli, %d features, %d terms, %s", data.M,
                 data.n, enc.n_features, len(data.k), data.describe())
    return _train(data, enc.n_features, fit_kw, dev, dtype, runtime=runtime)


class GroupedTargets:
    """Full-batch targets of models that each group the pairs their own way.

    For models trained on the same neural distances but different feature rows (null
    models with relabelled features, :mod:`mlem_neuro.core.scoring.fastnull`): the distinct
    feature-distance rows ``D_uniq`` are shared, each model has its own pairs per row
    (``counts``) and its own sums of standardised target ranks per row.  The steps are
    those of the grouped full batch of :func:`fit_stack` (:func:`grouped.grouped_soft_spearman`
    with a row of counts per model).

    Parameters
    ----------
    D_uniq : tensor (U, m)
        Distinct feature-distance rows.
    counts : tensor (M, U)
        Pairs of each model in each row (a row a model lacks gets the negligible count
        :data:`ABSENT_COUNT`: its prediction then weighs nothing).
    target_sums : tensor (M, U)
        Sums of each model's standardised exact target ranks over each row's pairs.
    fit_kw : dict
        :meth:`MLEMOptions.fit_kwargs`.
    compiled : bool
        Whether the compiled loop may train them (the runtime's
        :attr:`~mlem_neuro.core.runtime.Runtime.compiled`).
    """

    #: count given to a row a model lacks (the soft rank needs positive weights).
    ABSENT_COUNT = 1e-9
    grouped = True

    def __init__(self, D_uniq, counts, target_sums, fit_kw, *, compiled=True):
        self.compiled = bool(compiled)
        m = D_uniq.shape[1]
        self.k, self.l = term_index(m, fit_kw["interactions"])
        self.P_uniq = term_matrix(D_uniq.double(), self.k, self.l)
        self.c_active = counts.double().clamp_min(self.ABSENT_COUNT)
        self.t_active = target_sums.double()
        self.M = counts.shape[0]
        self.b = int(round(float(counts[0].sum()))) if counts.shape[0] else 0
        self.full = True

    def describe(self):
        return f"full batches of {self.b} pairs, {self.P_uniq.shape[0]} rows, own groups"

    def next_batch(self, idx):
        return

    def soft_spearman(self, tw, constraint):
        q = quadratic_forms(tw.double(), self.P_uniq)
        return grouped.grouped_soft_spearman(predict(q, constraint), self.c_active,
                                          self.t_active, SOFT_RANK_STRENGTH).to(tw.dtype)

    def numpy_batch(self):
        return self.P_uniq.numpy(), self.c_active.numpy(), self.t_active.numpy()

    def block_tables(self):
        return None

    def model_batch(self, j):
        """As :meth:`_StepTargets.model_batch`: the rows, the ``j``-th active model's own
        counts and its target sums."""
        return self.P_uniq, self.c_active[j], self.t_active[j]

    def drop(self, keep):
        self.c_active = self.c_active[keep]
        self.t_active = self.t_active[keep]


def fit_grouped(D_uniq, counts, target_sums, options=None, *, dtype=torch.float32,
                runtime=None):
    """Fit ``M`` models on grouped full batches, each with its own groups (see
    :class:`GroupedTargets`); the training of :func:`fit_stack` otherwise (``runtime``
    as there).

    Returns
    -------
    StackFit
    """
    opts = MLEMOptions() if options is None else options
    fit_kw = opts.fit_kwargs()
    dev = check_device(opts.device)
    runtime = Runtime() if runtime is None else runtime
    data = GroupedTargets(D_uniq.to(dev), counts.to(dev), target_sums.to(dev), fit_kw,
                          compiled=runtime.compiled)
    logger.debug("fit_grouped: %d models, %s", data.M, data.describe())
    return _train(data, D_uniq.shape[1], fit_kw, dev, dtype, history=False,
                  runtime=runtime)


#: what each backend is, as results record it (``result.provenance["training"]``; the
#: recorded names of :data:`~mlem_neuro.core.training.backends.BACKENDS`); torch's carries
#: the device's type, e.g. ``"torch (cuda)"``.
BACKEND_NAMES = {name: b.recorded for name, b in BACKENDS.items()}


def step_rule(data, fit_kw):
    """``{"lr": ..., "patience": ...}`` of the fits of ``data`` (a :class:`_StepTargets`
    or :class:`GroupedTargets`): the options' values, where ``"auto"``
    :data:`~mlem_neuro.core.constants.GROUPED_STEP_RULE` for full batches of exact
    feature-distance rows (categorical designs), else
    :data:`~mlem_neuro.core.constants.PER_PAIR_STEP_RULE` (numeric features per pair or on
    the grid, mini-batches).  Observed and null models of one test train on the same kind
    of batch, so they follow the same rule."""
    exact_rows = (getattr(data, "grouped", False) and data.full
                  and getattr(data, "levels", None) is None)
    lr, patience = GROUPED_STEP_RULE if exact_rows else PER_PAIR_STEP_RULE
    return {"lr": lr if fit_kw["lr"] == "auto" else fit_kw["lr"],
            "patience": patience if fit_kw["patience"] == "auto" else fit_kw["patience"]}


def _train(data, m, fit_kw, dev, dtype, history=True, runtime=None):
    """The training of :func:`fit_stack` and :func:`fit_grouped` on ``data`` (a
    :class:`_StepTargets` or :class:`GroupedTargets`) for models of ``m`` features: the
    step rule resolved (:func:`step_rule`), then the backend :func:`choose_backend` picks
    trains; its :class:`StackFit` names the backend and the step rule.  The backends read
    the threads of ``runtime`` (``None``: ``Runtime()``) in ``fit_kw["threads"]``."""
    runtime = Runtime() if runtime is None else runtime
    fit_kw = dict(fit_kw, **step_rule(data, fit_kw), threads=runtime.compiled_threads)
    backend = choose_backend(data, m, dev, dtype, fit_kw.get("backend", "auto"))
    return backend.train(data, m, fit_kw, dev, dtype, history)
