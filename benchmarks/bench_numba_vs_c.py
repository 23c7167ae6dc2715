"""The numba kernels (``core/compiled.py``) against the C library they replace
(``core/_ctrain.c`` through ctypes, ``core/ctrain.py``), side by side in one run.

Each case runs with each implementation in turn, alternating for ``--rounds`` rounds, in
this process (one torch thread); the script prints the median CPU time of each, their
ratio, and the largest difference of the fitted metrics and importances (the kernels do
the same operations in the same order: 0 expected).  Cases: ``time``, ``nulls``,
``spheres`` and ``grid`` of ``bench_train_loops.py`` (a time-resolved analysis, the same
with ``n_null=20``, a small searchlight and a numeric design trained on the grid), and
``wholebrain``: ``bench_wholebrain.py``'s searchlight (MNI152 grey matter at 3 mm, 96
images, 8 features) on ``--spheres`` random centres.  Before the cases, the first call
of each numba kernel in a fresh cache directory is timed (the compile time a first
analysis pays once).

This script needs the C library, which the numba kernels replace: it ran once, before
the library was removed; its output is recorded on the performance page.

    OMP_NUM_THREADS=1 python benchmarks/bench_numba_vs_c.py [--rounds 3] [--spheres 2000]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import types
import warnings

import numpy as np
import torch
from bench_train_loops import cases  # this folder
from bench_wholebrain import centres_img, make_data

import mlem_neuro
import mlem_neuro.core
from mlem_neuro.core import (
    compiled,
    ctrain,
    engine,
    fastnull,
    importance,
    neural,
    quantise,
    spearman,
)

CONSUMERS = (engine, fastnull, importance, neural, quantise, spearman)
#: the C library through ctypes, under the names the callers use
C_LIBRARY = types.SimpleNamespace(
    USE_COMPILED=True, MAX_FEATURES=64, built=ctrain.built, available=ctrain.available,
    train=ctrain.train, sorted_scores=ctrain.sorted_scores,
    feature_scores=ctrain.feature_scores, rank_walk=ctrain.rank_walk,
    condensed=ctrain.condensed, subset_ranks=ctrain.subset_ranks,
    block_tables=ctrain.block_tables)


def use(impl):
    """Route every caller to ``impl`` (``importance`` and ``spearman`` import the module
    inside their functions: through the package's attribute)."""
    for mod in CONSUMERS:
        mod.compiled = impl
    mlem_neuro.core.compiled = impl


def compile_time():
    """Seconds of a fresh interpreter's first small analysis with an empty numba cache,
    and with the cache filled (a later process)."""
    code = ("import time, numpy as np, pandas as pd, mlem_neuro; "
            "rng = np.random.default_rng(0); "
            "X = rng.standard_normal((40, 10, 2)); "
            "t = pd.DataFrame({'a': rng.integers(0, 2, 40), 'b': rng.integers(0, 2, 40)})"
            ".astype(str); t0 = time.perf_counter(); "
            "mlem_neuro.mlem_array(X, t, cv=2, n_repeats=1, verbose='WARNING'); "
            "print(time.perf_counter() - t0)")
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, OMP_NUM_THREADS="1")
        for _ in range(2):
            run = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                 capture_output=True, text=True)
            out.append(float(run.stdout.split()[-1]))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="+",
                        default=["time", "nulls", "spheres", "grid", "wholebrain"])
    parser.add_argument("--spheres", type=int, default=2000)
    parser.add_argument("--skip-compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"numba {compiled.numba_version()}, torch {torch.__version__}, 1 thread, "
          f"{args.rounds} rounds, CPU times", flush=True)
    if not args.skip_compile:
        cold, warm = compile_time()
        print(f"first analysis in a fresh process: {cold:.1f} s with an empty numba cache "
              f"(compiling), {warm:.1f} s with the cache filled", flush=True)
    runs = cases()
    if "wholebrain" in args.cases:
        imgs, table, mask_img, region = make_data(96, 0.5, 0)
        process = centres_img(mask_img, region, args.spheres, np.random.default_rng(3))

        def wholebrain():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return mlem_neuro.mlem_searchlight(imgs, table, mask_img,
                                                   process_mask_img=process, radius=6.0,
                                                   cv=5, n_repeats=1, n_permutations=10,
                                                   random_state=0, verbose="WARNING")
        runs["wholebrain"] = wholebrain
    impls = {"c": C_LIBRARY, "numba": compiled}
    for name in args.cases:
        run = runs[name]
        use(compiled)
        run()                                     # compile every kernel the case uses
        times, res = {k: [] for k in impls}, {}
        for _ in range(args.rounds):
            for k, impl in impls.items():
                use(impl)
                c0 = time.process_time()
                res[k] = run()
                times[k].append(time.process_time() - c0)
        use(compiled)
        med = {k: np.median(v) for k, v in times.items()}
        W = {k: getattr(r, "fold_weights", None) for k, r in res.items()}
        imp = {k: np.asarray(r.importance) for k, r in res.items()}
        dW = (np.nanmax(np.abs(W["numba"] - W["c"])) if W["c"] is not None else np.nan)
        print(f"{name:10s} c {med['c']:7.2f} s  numba {med['numba']:7.2f} s  numba/c "
              f"{med['numba'] / med['c']:4.2f}x  (rounds: c "
              + " ".join(f"{t:.2f}" for t in times["c"]) + ", numba "
              + " ".join(f"{t:.2f}" for t in times["numba"])
              + f"); max |W diff| {dW:.1e}, max |importance diff| "
              f"{np.nanmax(np.abs(imp['numba'] - imp['c'])):.1e}", flush=True)


if __name__ == "__main__":
    main()
