"""CUDA graphs of the torch loop's full-batch steps (opt-in, awaiting their GPU check).

A full-batch step on a GPU is many small kernels (about 130 operations besides the
backward pass's, counted on the emulated GPU for a grouped design), whose launches may
cost more than their work (the H200 run of 2026-11-27 measured 16 ms per step for chunks
of 4,000 spheres and called it launch- and synchronisation-bound).  Between two checks
of which models still train (:func:`~mlem_neuro.core.training.torch_loop.check_every`) a
full-batch step reads and writes the same tensors with the same shapes, so it can be
captured once in a CUDA graph and replayed: one launch per step.  The captured step is
the eager one (the same functions), with the step count a device tensor and every row's
state written back into fixed buffers.

Set ``MLEM_NEURO_CUDA_GRAPHS=1`` to use it.  It is off by default until a GPU run checks
the replayed fits against the eager ones and measures the gain (``tools/gpu_check.sh
issue41``; no GPU has been lent since it was written).  A step that cannot be captured
(an operation that reads a value back to the host, a kernel outside the capturing stream)
falls back to the eager steps with a warning naming the reason; the fits are then the
eager ones.
"""
from __future__ import annotations

import contextlib

import torch

from ..constants import CUDA_GRAPH_WARMUP_STEPS as WARMUP_STEPS
from ..kernels._numba import env_flag
from ..utils import logger

#: the environment variable that turns the graphs on (``1``, ``true``, ``yes``, ``on``)
ENV = "MLEM_NEURO_CUDA_GRAPHS"


def enabled():
    """Whether :data:`ENV` asks for CUDA graphs (a yes/no word, read at each fit; a word
    that is neither raises)."""
    return env_flag(ENV)


@contextlib.contextmanager
def side_stream(dev):
    """Run the block on a side stream of ``dev`` (CUDA graph warm-up), then join it."""
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream(dev).wait_stream(side)


def capture(fn, dev):
    """Capture ``fn()`` (its kernels are recorded, not run) in a CUDA graph on ``dev``;
    return the graph's replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def runner(data, scores_and_grads, lr, dev):
    """A :class:`GraphRunner` for this fit, or ``None`` (not asked for, not a GPU, not a
    full batch, or no CUDA graphs in this torch).  ``scores_and_grads(A)``: the rows'
    scores on the batch of ``data`` and the gradient of the loss (the torch loop's)."""
    if (torch.device(dev).type != "cuda" or not data.full
            or not hasattr(torch.cuda, "CUDAGraph") or not enabled()):
        return None
    return GraphRunner(scores_and_grads, lr, dev)


class GraphRunner:
    """Runs a fit's full-batch steps by replaying one captured step per set of rows."""

    def __init__(self, scores_and_grads, lr, dev):
        self.scores_and_grads, self.lr, self.dev = scores_and_grads, lr, dev
        self.graph = self.rows = self.t = self.rho = self.live = None
        self.failed = None
        self.captures = self.replays = 0

    def step(self, rows, t):
        """One step of ``rows`` written back into their own tensors (``t``: the step
        count, an int or a device tensor); returns the scores and the rows that
        trained."""
        rho, grad = self.scores_and_grads(rows.A)
        buffers = {name: getattr(rows, name) for name in rows.FIELDS}
        live = rows.update(rho, grad, self.lr, t)
        for name, buf in buffers.items():
            buf.copy_(getattr(rows, name))
            setattr(rows, name, buf)
        return rho, live

    def run(self, rows, records, step, n):
        """Steps ``step + 1 ... step + n`` of ``rows`` (in place)."""
        with torch.no_grad():
            done = 0
            if self.graph is None or self.rows is not rows:
                done = self._capture(rows, records, step, n)
            if self.graph is not None and done < n:
                self.t.fill_(float(step + done))
            for s in range(step + done, step + n):
                if self.graph is None:
                    with torch.enable_grad():
                        rho, live = self.step(rows, s + 1)
                else:
                    self.graph()
                    self.replays += 1
                    rho, live = self.rho.clone(), self.live.clone()
                records.step(rows, rho, live)

    def _capture(self, rows, records, step, n):
        """Warm up on a side stream, then capture one step of ``rows``; the warm-up
        steps are real steps: their number is returned."""
        self.graph = None
        k = min(WARMUP_STEPS, n)
        with side_stream(self.dev), torch.enable_grad():
            for s in range(step, step + k):
                rho, live = self.step(rows, s + 1)
                records.step(rows, rho, live)
        if k == n:
            return k
        buffers = {name: getattr(rows, name) for name in rows.FIELDS}
        self.t = torch.zeros((), dtype=torch.float64, device=self.dev)

        def one_step():
            with torch.enable_grad():
                self.t.add_(1.0)
                self.rho, self.live = self.step(rows, self.t)
        try:
            self.graph = capture(one_step, self.dev)
        except Exception as exc:      # noqa: BLE001  (any failure: the eager steps instead)
            for name, buf in buffers.items():     # the rows as they were (nothing ran)
                setattr(rows, name, buf)
            self.graph = None
            self.failed = f"{type(exc).__name__}: {exc}"
            logger.warning("CUDA graphs off for this fit (%s): the steps run eagerly",
                           self.failed)
            torch.cuda.synchronize(self.dev)
            return k
        self.rows = rows
        self.captures += 1
        return k

    def report(self):
        """Log what ran: captures, replays, or why the graphs were off."""
        logger.debug("CUDA graphs: %d capture(s), %d replayed step(s)%s", self.captures,
                     self.replays, f"; off: {self.failed}" if self.failed else "")
