"""Per-pair training's quadratic forms: term by term (the package) against one matrix product.

On the CPU, torch training of per-pair term rows (numeric features off the grid, level
"term" of such designs, mini-batches of sampled pairs) computes each model's forms
``q = tw @ Pt.T`` and their gradient term by term
(:func:`mlem_neuro.core.training.metric.quadratic_forms`), so that a model's bits do not depend on
how many models share its chunk; a matrix product picks its kernel, and so its rounding,
by the shape.  This script times the two side by side in one process (the product put
back in the engine for its runs), alternating, one torch thread, and prints for each the
largest difference of the results between ``chunk_size=1`` and one chunk.

Designs (``mlem_array``, 5 folds unless said, default options otherwise,
``numeric_levels=None``: exact per-pair training):

* ``small``: 40 trials x 16 channels x 20 time points, two binary features and a numeric
  one, ``cv=2`` (the setting advised below 100 stimuli);
* ``medium``: 200 trials x 32 channels x 20 time points, three numeric features;
* ``term``: the medium design at ``level="term"`` with mini-batches of 2,000 pairs.

    OMP_NUM_THREADS=1 python benchmarks/bench_forms.py [--repeats 3]
"""
import argparse
import time

import numpy as np
import pandas as pd
import torch
from _common import describe, warm_up

import mlem_neuro
from mlem_neuro.core.training import engine


def design(n, channels, times, binary, numeric, seed=0):
    rng = np.random.default_rng(seed)
    cols = {f"b{k}": np.arange(n) // (2 ** k) % 2 for k in range(binary)}
    cols.update({f"x{k}": rng.uniform(size=n) for k in range(numeric)})
    table = pd.DataFrame(cols)
    codes = table.to_numpy(float) @ rng.standard_normal((table.shape[1], channels))
    data = rng.standard_normal((n, channels, times))
    data[:, :, times // 2:] += 0.5 * codes[:, :, None]
    return data, table


DESIGNS = {
    "small": (design(40, 16, 20, 2, 1), dict(cv=2)),
    "medium": (design(200, 32, 20, 0, 3), dict(cv=5)),
    "term": (design(200, 32, 20, 0, 3), dict(cv=5, level="term", batch_size=2000)),
}


def product(tw, Pt):
    return tw @ Pt.T


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=list(DESIGNS), default=list(DESIGNS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    warm_up("cpu")
    print(describe("cpu"))
    forms = {"term by term": engine.quadratic_forms, "matrix product": product}
    for name in args.only:
        (data, table), kw = DESIGNS[name]
        kw = dict(kw, numeric_levels=None, random_state=0)
        times = {k: [] for k in forms}
        chunked = {}
        for r in range(args.repeats):
            order = list(forms) if r % 2 == 0 else list(forms)[::-1]
            for label in order:
                engine.quadratic_forms = forms[label]
                t0 = time.process_time()
                res = mlem_neuro.mlem_array(data, table, **kw)
                times[label].append(time.process_time() - t0)
                if r == 0:
                    one = mlem_neuro.mlem_array(data, table, chunk_size=1, **kw)
                    chunked[label] = float(np.abs(one.fold_importance
                                                  - res.fold_importance).max())
        engine.quadratic_forms = forms["term by term"]
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(f"{name} ({data.shape[0]} trials, {list(table.columns)}, {kw}):")
        for label in forms:
            print(f"  {label:>14}: {med[label]:.2f} s CPU (runs "
                  f"{', '.join(f'{t:.2f}' for t in times[label])}); chunk_size=1 vs one "
                  f"chunk: max |importance diff| {chunked[label]:.1e}")
        print(f"  ratio term by term / product: "
              f"{med['term by term'] / med['matrix product']:.2f}")


if __name__ == "__main__":
    main()
