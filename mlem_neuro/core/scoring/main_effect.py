"""Each feature's main effect, in sample: the partial rank correlation of its distance with
the neural distance, the other features' distances held fixed.

For feature ``f`` and one model (time point, sphere), over the pairs of stimuli::

    r_f = corr(e_y, e_f),   e_* = the ranks of * minus their projection on the ranks of
                                  the other features' distances (and a constant)

a partial Spearman correlation (the statistic of a partial Mantel test; with one feature
the Spearman correlation of a representational similarity analysis).  It sees what an
additive metric sees, with one number per feature and no training, and none of what
only an interaction of features carries (an XOR code).

Its null datasets are the analysis's own (:mod:`~mlem_neuro.core.scoring.nulls`): the
relabellings of feature ``f``'s test move the neural data within strata of the other
features, so the same relabellings give the null distribution of ``r_f`` and of the
held-out importance of ``f``, null dataset by null dataset.  :func:`combine` turns the two
into one statistic per null dataset (``feature_test="combined"``); :func:`staged` does so
only where the test of interactions finds interactions, and leaves the main effect alone
elsewhere (``feature_test="staged"``, the default).

A relabelling permutes the pairs, so the neural ranks of a null dataset are the observed
ranks moved to other pairs: the ranks are computed once per model, and a null dataset's
statistic is one matrix product with the feature's residual moved to the relabelled pairs
(``y[lin] . e == y . scatter(e, lin)``).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from ..constants import CHUNK_BYTES
from ..constants import MAIN_EFFECT_TOL as _TOL
from ..ranks.partial import partial_residuals
from ..ranks.spearman import rankdata
from ..stimuli.pairs import pair_indices
from .nulls import permuted_pairs


def pair_columns(n, groups=None):
    """Columns of :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` ``(n)`` that the main
    effects use: every pair, or with ``groups`` the pairs of stimuli of different groups
    (the held-out pairs' choice, ``"between_groups"``)."""
    if groups is None:
        return None
    groups = np.asarray(groups)
    i, j = pair_indices(n)
    return np.flatnonzero(groups[i] != groups[j])


class MainEffects:
    """The residual of every feature's distance ranks on the other features' ranks.

    Parameters
    ----------
    enc : EncodedFeatures
        Every stimulus's encoded features (:meth:`FeatureSpace.transform`).
    columns : ndarray | None
        The pairs used (:func:`pair_columns`); ``None`` for all.
    """

    def __init__(self, enc, columns=None):
        n = enc.values.shape[0]
        i, j = pair_indices(n)
        self.n, self.columns = n, columns
        D = torch.as_tensor(enc.pair_distances(i, j), dtype=torch.float64)
        if columns is not None:
            D = D[torch.as_tensor(columns)]
        R = rankdata(D.T.contiguous())
        R = R - R.mean(dim=1, keepdim=True)
        #: per feature, the unit residual ``e_f (P,)`` (NaN when the feature's distance is
        #: a function of the others': no main effect of its own) and the orthonormal basis
        #: ``(P, q)`` of the other features' centred ranks
        self.residual, self.basis = [], []
        for Q, e in partial_residuals(R.T.numpy(), _TOL):
            self.basis.append(torch.as_tensor(np.ascontiguousarray(Q)))
            self.residual.append(torch.full((R.shape[1],), float("nan"), dtype=torch.float64)
                                 if e is None else torch.as_tensor(e))

    @property
    def n_features(self):
        return len(self.residual)

    def _ranks(self, rdm):
        """Centred ranks ``(B, P)`` of the used pairs of each row of ``rdm`` and their
        squared norms."""
        if self.columns is not None:
            rdm = rdm[:, torch.as_tensor(self.columns, device=rdm.device)]
        y = rankdata(rdm.to(torch.float64))
        y = y - y.mean(dim=1, keepdim=True)
        return y, (y * y).sum(dim=1)

    @staticmethod
    def _partial(num, proj_sq, total):
        """``num / sqrt(total - proj_sq)``, NaN where the remainder is not positive (a
        constant RDM, or one the other features explain entirely)."""
        rest = total - proj_sq
        ok = rest > _TOL * torch.clamp(total, min=1e-300)
        out = torch.full_like(num, float("nan"))
        out[ok] = num[ok] / torch.sqrt(rest[ok])
        return out

    def observed(self, rdm):
        """Each feature's partial rank correlation ``(B, m)`` in each row of ``rdm (B,
        n_pairs(n))`` (distances of the pairs of all stimuli)."""
        y, total = self._ranks(rdm)
        out = []
        for e, Q in zip(self.residual, self.basis):
            proj = y @ Q.to(y.device)
            out.append(self._partial(y @ e.to(y.device), (proj * proj).sum(dim=1), total))
        return torch.stack(out, dim=1)

    def _moved(self, lin, device):
        """Per relabelling, where each used pair's distance goes: positions ``(R, P)`` in
        the used pairs (a relabelling keeps the stimuli of a pair in different groups when
        it keeps every stimulus in its group, as the analyses' relabellings do)."""
        if self.columns is None:
            return torch.as_tensor(lin, device=device)
        where = np.full(self.n * (self.n - 1) // 2, -1, dtype=np.int64)
        where[self.columns] = np.arange(len(self.columns))
        moved = where[lin[:, self.columns]]
        if (moved < 0).any():
            raise ValueError("a relabelling moved a pair of stimuli from different groups "
                             "onto a pair of the same group: relabel within groups.")
        return torch.as_tensor(moved, device=device)

    def null_operator(self, perms, feature):
        """The matrix ``(R * (1 + q), P)`` that gives feature ``feature``'s null
        statistics under each relabelling of ``perms (R, n)``: per relabelling, the
        feature's residual and the other features' basis moved to the relabelled pairs
        (``y[moved] . v == y . scatter(v, moved)``), shared by every model."""
        e, Q = self.residual[feature], self.basis[feature]
        lin = permuted_pairs(perms, np.arange(self.n), self.n)
        moved = self._moved(lin, e.device)                   # (R, P), on the features' device
        R, P = moved.shape
        q = Q.shape[1]
        V = e.new_zeros((R, 1 + q, P))
        V[:, 0].scatter_(1, moved, e.expand(R, P))
        if q:
            V[:, 1:].scatter_(2, moved[:, None, :].expand(R, q, P), Q.T.expand(R, q, P))
        return V.reshape(R * (1 + q), P)

    def null(self, rdm, perms, feature, operator=None):
        """Feature ``feature``'s partial rank correlation ``(B, R)`` in each row of ``rdm``
        relabelled by each of ``perms (R, n)`` (stimulus ``a`` takes the data of ``π(a)``,
        :func:`~mlem_neuro.core.scoring.nulls.permuted_pairs`); ``operator`` is
        :meth:`null_operator` of the same arguments, when already built (else it is built
        in blocks of relabellings of at most :data:`CHUNK_BYTES`)."""
        y, total = self._ranks(rdm)
        q = self.basis[feature].shape[1]
        if operator is None:
            per = max(1, int(CHUNK_BYTES // (8 * y.shape[1] * (1 + q))))
            blocks = [(perms[s:s + per], None) for s in range(0, len(perms), per)]
        else:
            blocks = [(perms, operator)]
        out = []
        for block, V in blocks:
            if V is None:
                V = self.null_operator(block, feature)
            R = len(block)
            prod = (y @ V.to(y.device).T).reshape(-1, R, 1 + q)
            proj_sq = (prod[..., 1:] ** 2).sum(dim=-1)
            out.append(self._partial(prod[..., 0], proj_sq, total[:, None].expand(-1, R)))
        return torch.cat(out, dim=1)


def main_effect_tests(source, enc, null, columns=None, device="cpu", chunk_bytes=None):
    """Observed ``(M, m)`` and null ``(M, m, n_null)`` partial rank correlations of every
    feature of ``enc`` in every model of ``source``, the null of feature ``f`` under the
    relabellings ``null[1 + f]`` of its test (``null (1 + m, n_null, n)``, the score's
    first, :func:`~mlem_neuro.core.scoring.nulls.null_permutations`); ``null=None``: the
    observed ones only (null ``None``).  Models go in chunks of RDMs of all stimuli of at
    most ``chunk_bytes`` (:data:`~mlem_neuro.core.constants.CHUNK_BYTES`)."""
    effects = MainEffects(enc, columns)
    n, M, m = source.n_stimuli, source.n_models, effects.n_features
    P = n * (n - 1) // 2
    budget = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    # a chunk holds its models' distances and centred ranks (and their products with a
    # block of relabellings, (1 + q) columns each: small beside them)
    per = max(1, int(budget // (8 * 3 * P)))
    obs = np.empty((M, m))
    nul = None if null is None else np.empty((M, m, null.shape[1]))
    everything = np.arange(n)
    # the relabelled residuals are the same for every model: built once when they fit
    # in the budget (a whole-brain searchlight has thousands of chunks), else per chunk
    operators = [None] * m
    if null is not None:
        size = sum(8 * null.shape[1] * (1 + Q.shape[1]) * P for Q in effects.basis)
        if size <= budget:
            operators = [effects.null_operator(null[1 + f], f) for f in range(m)]
    for s in range(0, M, per):
        sl = slice(s, min(s + per, M))
        rdm = source.subset(sl).rdm(everything, device)
        obs[sl] = effects.observed(rdm).cpu().numpy()
        if null is not None:
            for f in range(m):
                nul[sl, f] = effects.null(rdm, null[1 + f], f,
                                          operators[f]).cpu().numpy()
    return obs, nul


def combine(observed, null, use=None):
    """One statistic from several on the same null datasets: each standardised by the
    mean and standard deviation of all its values (every model, the observed and every
    null dataset together), then their maximum.

    ``observed`` is a list of ``(M,)`` arrays, ``null`` of ``(n_null, M)`` arrays (one
    pair per statistic); returns ``(M,)`` and ``(n_null, M)``.  The standardisation is
    one affine map per statistic, a symmetric function of the datasets, so the combined
    statistic is a permutation test as each part is (a nonparametric combination), and
    the same map for every model keeps the family-wise maximum over models what it is
    for each part: a strong model stays strong (standardising model by model would cap
    every model's observed value near ``sqrt(n_null)`` and let any model's extreme null
    reach it).  A part that is NaN for a model (undefined) leaves the others; all NaN
    gives NaN.  ``use``: per statistic, ``None`` (every model) or a boolean ``(M,)``
    saying in which models it joins the maximum (:func:`staged`); it is standardised over
    those models only (the others' values, which a staged analysis does not compute for
    the importance, are not read) and where it does not join, the model's statistic is
    the others'.
    """
    use = [None] * len(observed) if use is None else use
    z_obs, z_null = [], []
    for o, nl, keep in zip(observed, null, use):
        allv = np.concatenate([np.asarray(o, float)[None], np.asarray(nl, float)], axis=0)
        if keep is not None:
            allv[:, ~np.asarray(keep, bool)] = np.nan
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # all NaN: NaN
            mu = np.nanmean(allv)
            sd = np.nanstd(allv)
            z = (allv - mu) / (sd if sd > 0 else np.nan)
        z_obs.append(z[0])
        z_null.append(z[1:])
    with np.errstate(invalid="ignore"):
        obs = np.fmax.reduce(np.stack(z_obs), axis=0)
        nul = np.fmax.reduce(np.stack(z_null), axis=0)
    return obs, nul


def staged(importance, main_effect, gate_open):
    """The staged feature test (``feature_test="staged"``, the default): in each model
    the feature's main effect alone, and where the test of interactions finds
    interactions (``gate_open (M,)``: the analysis opens it where the test's family-wise
    p-value over the models is at most :data:`~mlem_neuro.core.constants.STAGED_GATE`)
    the :func:`combine` of its held-out importance and its main effect.

    ``importance`` and ``main_effect`` are ``(observed (M,), null (n_null, M))`` on the
    same null datasets; returns the same.  Where the gate is shut the p-value is the main
    effect's own, as powerful as a partial Mantel test (an analysis whose gate is shut in
    every model reads it on more relabellings, ``MAIN_EFFECT_NULLS``: its p-values are
    then the main effect's, not these); where it is open the importance
    (which sees what a feature does through an interaction, an XOR code) joins it.  The
    gate is read once per model on the observed data and holds for every null dataset of
    that model; the family-wise maximum over models compares each model's own statistic.
    Each of the two tests is a permutation test; choosing between them on the observed
    data is not exact by construction (a feature without any effect is rejected at most
    at ``alpha`` plus the chance that the gate opens and the combined test rejects), so
    its rates were measured on null data (method page, "The feature test").
    """
    gate_open = np.asarray(gate_open, bool)
    return combine([importance[0], main_effect[0]], [importance[1], main_effect[1]],
                   use=[gate_open, None])
