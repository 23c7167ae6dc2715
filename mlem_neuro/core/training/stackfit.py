"""What the training paths return (:class:`StackFit`): one small module that every path
imports, so that none of them imports the engine that chooses between them.  A fit says
which backend trained it and with which step rule: the analyses record that from the
fits they return (``result.provenance``), not from a side channel."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StackFit:
    """What :func:`fit_stack` returns (numpy arrays on the CPU).

    Attributes
    ----------
    W : ndarray (M, m, m)
        Frobenius-normalised metric of each model (the best state seen in training).
    n_iter : ndarray of int (M,)
        Training steps each model ran.
    converged : ndarray of bool (M,)
        Whether the model stopped early (no improvement for ``patience`` steps).
    history : ndarray (M, n_steps) | None
        Training soft Spearman at each step (NaN once a model has stopped); ``None`` from
        :func:`fit_grouped`, which does not keep it.
    best_score : ndarray (M,)
        Best training soft Spearman (the state kept in ``W``).
    batch_size : int
        Pairs per step.
    full_batch : bool
        Whether every step used all pairs (deterministic full-batch training).
    backend : str
        The backend that trained the models, as results record it
        (:data:`~mlem_neuro.core.training.backends.BACKENDS`' recorded names, e.g.
        ``"compiled loop (numba)"``, ``"torch (cpu)"``).
    lr : float
        The learning rate the models trained with (``lr="auto"`` resolved by
        :func:`~mlem_neuro.core.training.engine.step_rule`).
    patience : int
        The patience they stopped with (``patience="auto"`` resolved likewise).
    """

    W: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray
    history: np.ndarray
    best_score: np.ndarray
    batch_size: int
    full_batch: bool
    backend: str
    lr: float
    patience: int

    def trained_with(self):
        """``(backend, lr, patience)``: what trained the models, as provenance records it
        (:func:`mlem_neuro._provenance.collect`)."""
        return (str(self.backend), float(self.lr), int(self.patience))
