"""Writing result sets: the pieces the command line and the BIDS runner share.

:func:`deferred_interrupts` holds Ctrl-C back while a few renames put a complete result
set in place; :func:`brain_map_figure` draws a brain map result's terms and score;
:func:`save_figure` writes and closes a matplotlib figure.
"""
from __future__ import annotations

import contextlib
import signal
import threading

import numpy as np


@contextlib.contextmanager
def deferred_interrupts():
    """Hold Ctrl-C (SIGINT) back for the duration (main thread only): the few renames that
    swap result sets run to their end, then the interrupt is raised.  The Python handler
    is swapped for one that records the signal (blocking the signal in the main thread
    alone would not do: another thread of the process may receive it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def save_figure(fig, fname):
    """Write ``fig`` to ``fname`` (110 dpi) and close it."""
    import matplotlib.pyplot as plt

    fig.savefig(fname, dpi=110)
    plt.close(fig)


def brain_map_figure(res, bg_img):
    """One row per term whose importance map is not 0 everywhere, and a last row with the
    score, all cut through the sphere with the best score; also the terms left out."""
    import matplotlib.pyplot as plt

    empty = [t for k, t in enumerate(res.terms) if not np.any(res.importance[:, k])]
    rows = [t for t in res.terms if t not in empty] + [None]
    score = np.nan_to_num(res.score, nan=-np.inf)
    cut = tuple(float(v) for v in res.model_coords()[int(np.argmax(score))])
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 2.6 * len(rows)), squeeze=False)
    for ax, term in zip(axes[:, 0], rows):
        res.plot(term, bg_img=bg_img, axes=ax, figure=fig, draw_cross=False,
                 cmap="RdBu_r", cut_coords=cut)
    return fig, empty
