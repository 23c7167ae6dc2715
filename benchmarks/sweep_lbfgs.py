"""Adam (the engine's training) against L-BFGS on the same smoothed objective: evaluations,
CPU time, training optimum, W and held-out scores.

Measurement only: nothing here changes the package.  Every optimiser maximises the same
objective, the full-batch soft Spearman of :mod:`mlem_neuro.core.training.reference` (its
:func:`~mlem_neuro.core.training.reference.soft_spearman`: predictions ``sqrt(dᵀ W d)`` over
every training pair, :func:`torchsort.soft_rank` at the package's strength, correlated with
the standardised exact ranks of the neural distances), with ``W`` from
:func:`~mlem_neuro.core.training.metric.make_W` (``"spd"``, interactions, Frobenius norm 1)
and the start of :func:`~mlem_neuro.core.training.metric.init_params` (``W ∝ I``), in float64
on one torch thread.  Optimisers (one label each in the table):

* ``adam .03/50``: the engine's rule as the reference backend writes it: AdamW (lr 0.03,
  the package's betas and eps, no weight decay), one evaluation per step, the best state
  seen kept, stop when the score has not risen by more than ``tol=1e-4`` for 50 steps, at
  most 1,000 steps.  Every other row is compared with this one ("the Adam fit").
* ``adam .03/50 ±sd``: the same from starts perturbed by ``N(0, sd²)`` on the entries of
  ``A`` that matter (lower triangle; ``--perturb-sd``, two draws): full-batch Adam is
  deterministic, so these give Adam's own spread, the yardstick of ``||W - W_adam||``.
* ``adam .1/20``: the step size and patience that ``doc/options.rst`` measured on
  categorical designs (for reference).
* ``lbfgs <label>``: :class:`torch.optim.LBFGS` (``history_size=10``,
  ``line_search_fn="strong_wolfe"``, ``lr=1``, full batch) run once to its own stop, with
  the settings of :data:`LBFGS_SETTINGS` (``tolerance_grad``, ``tolerance_change``,
  ``max_iter``; ``max_eval = 2 max_iter``).  Evaluations are closure calls, line-search
  evaluations included; the best state seen is kept (as Adam's).
* ``adam .1 x20 + lbfgs``: 20 Adam steps at lr 0.1 (no stopping rule), then L-BFGS
  (``g1e-5/c1e-6/200``) from Adam's last state: momentum carries Adam across the flat
  stretches of the objective where L-BFGS stops (see below).
* ``engine``: :class:`mlem_neuro.MLEM` itself (default options, ``random_state`` 0; float32,
  the compiled loop on categorical designs, mini-batches on the numeric case) as a check
  that ``adam .03/50`` is the engine's training; ``engine rs=1``: numeric case only,
  another seed of the engine's mini-batches (the engine's own spread there).  Its
  evaluations are its steps; its training score is re-evaluated on the full-batch objective.
* null models (data relabelled by a random permutation of the training stimuli):
  the same optimisers from the isotropic start, and ``adam warm`` / ``lbfgs warm``
  started from the observed fit's Adam state (same fold).

Per fit and optimiser: (a) evaluations of objective + gradient and CPU seconds
(``time.process_time``); ``to 1e-3``: evaluations until the run first came within 1e-3 of
the best training score of that fit (what an ideal stopping rule would need); (b) the
training soft Spearman of the kept ``W`` and its gap to the best any run reached on that
fit; (c) ``||W - W_adam||_F`` (both of norm 1), and ``||W - W_engine||_F`` where the
engine ran (numeric cases: the engine's own seed-to-seed spread is ``engine rs=1``'s);
(d) exact held-out Spearman on held-out stimuli, and its difference to the Adam fit's;
(e) ``||W - W_true||_F`` on the realisable cases; and failures: NaN objective values, a
``W`` with smallest eigenvalue below 1e-8 (the parametrisation keeps it PSD; this flags a
collapsed direction), runs that hit ``max_iter`` / ``max_eval``; ``flat stops``: runs
whose kept state has a gradient below 1e-9 (soft ranks equal to hard ranks: a flat stretch
of the objective) more than 1e-3 below the best, over all runs whose kept state is that
flat.

Cases (``--cases``):

* ``binary3``: :func:`mlem_neuro.simulation.simulate_codes`, three binary features
  (weights 1 / 0.7 / 0.4, interaction 0.5 of the first two), 96 stimuli, 64 units,
  noise 2 (moderate effect); ``binary3-strong``: 200 stimuli, noise 0.7 (strong effect,
  where lr 0.03 stops short, ``doc/options.rst``).  Euclidean distances; each dataset
  split into two halves of stimuli, each half trained and scored on the other half;
  one null model per fold.
* ``cat7x3``: a 7-level x 3-level categorical design, 42 stimuli (each cell twice, one
  in each half), 24 units, weak additive codes (simplex level codes, weights 0.5 / 0.35,
  noise 1 as in ``simulate_codes``); two folds, one null per fold.
* ``numeric``, ``numeric-paperW`` and ``binary``: ``sweep_optimiser.py``'s realisable
  noiseless cases (128 stimuli, 8 features, the same data for the same seed), trained on
  all 128; held-out stimuli: 128 fresh ones drawn from the same ``W_true`` (noiseless).

The null models' permutations come from a stream seeded by ``--seed`` and the case name.

Run from the repository root, one thread, serially (about 3 CPU minutes with the
defaults on a busy machine):

    OMP_NUM_THREADS=1 python benchmarks/sweep_lbfgs.py [--cases binary3 cat7x3 ...]
        [--datasets 3] [--csv out.csv]
"""
import argparse
import math
import time
import warnings
import zlib

import numpy as np
import pandas as pd
import torch
from scipy.spatial.distance import pdist, squareform
from scipy.stats import rankdata, spearmanr
from sweep_optimiser import make_case

from mlem_neuro import MLEM
from mlem_neuro.core.constants import ADAM_BETA1, ADAM_BETA2, ADAM_EPS
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.core.training.metric import init_params, make_W, predict, term_index, term_matrix
from mlem_neuro.core.training.reference import soft_spearman
from mlem_neuro.simulation import simulate_codes

DT = torch.float64
#: label -> (tolerance_grad, tolerance_change, max_iter)
LBFGS_SETTINGS = {
    "g1e-7/c1e-9/500": (1e-7, 1e-9, 500),     # torch's default tolerances, a large cap
    "g1e-5/c1e-6/200": (1e-5, 1e-6, 200),
    "g1e-4/c1e-4/100": (1e-4, 1e-4, 100),     # change tolerance = Adam's tol
    "g1e-5/c1e-6/20": (1e-5, 1e-6, 20),       # an iteration cap
}
WARM_LBFGS = "g1e-5/c1e-6/200"
NEAR = 1e-3


# ---------------------------------------------------------------- the objective
class Objective:
    """Full-batch soft Spearman (the reference backend's) of ``W = make_W(A)`` on training
    pairs with feature distances ``D (P, m)`` and neural distances ``target (P,)``."""

    def __init__(self, D, target):
        self.m = D.shape[1]
        self.k, self.l = term_index(self.m, True)
        self.P = term_matrix(torch.as_tensor(D, dtype=DT), self.k, self.l)
        tz = rankdata(target)
        tz = tz - tz.mean()
        self.tz = torch.as_tensor(tz / np.linalg.norm(tz), dtype=DT)
        self.evals = 0

    def of_W(self, W):
        q = self.P @ W[self.k, self.l]
        return soft_spearman(predict(q, "spd"), self.tz)

    def __call__(self, A):
        self.evals += 1
        return self.of_W(make_W(A[None], "spd")[0])

    def score_W(self, W):
        with torch.no_grad():
            return float(self.of_W(torch.as_tensor(W, dtype=DT)))


class Run:
    def __init__(self, A, hist, evals, sec, nan=0, capped=False, n_iter=None, last=None):
        self.A, self.hist, self.evals, self.sec = A, np.asarray(hist), evals, sec
        self.last = last
        self.nan, self.capped, self.n_iter = nan, capped, n_iter
        with torch.no_grad():
            self.W = make_W(A[None], "spd")[0].numpy() if A is not None else None


def adam(obj, A0, lr=0.03, patience=50, tol=1e-4, max_steps=1000):
    """The reference backend's loop for one model (full batch)."""
    c0, e0 = time.process_time(), obj.evals
    A = A0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([A], lr=lr, betas=(ADAM_BETA1, ADAM_BETA2), eps=ADAM_EPS,
                            weight_decay=0.0, foreach=False)
    best, ref, since, best_A, hist, nan = -math.inf, -math.inf, 0, A0.clone(), [], 0
    for _ in range(max_steps):
        rho = obj(A)
        s = float(rho.detach())
        hist.append(s)
        if not math.isfinite(s):
            nan += 1
            break
        if s > best:
            best, best_A = s, A.detach().clone()
        if s > ref + tol:
            ref, since = s, 0
        else:
            since += 1
        opt.zero_grad()
        (-rho).backward()
        opt.step()
        if since >= patience:
            break
    return Run(best_A, hist, obj.evals - e0, time.process_time() - c0, nan,
               capped=since < patience, last=A.detach().clone())


def lbfgs(obj, A0, tol_grad, tol_change, max_iter, history=10):
    """One call of torch's L-BFGS (strong Wolfe line search) on ``-soft Spearman``."""
    c0, e0 = time.process_time(), obj.evals
    A = A0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([A], lr=1.0, max_iter=max_iter, max_eval=2 * max_iter,
                            tolerance_grad=tol_grad, tolerance_change=tol_change,
                            history_size=history, line_search_fn="strong_wolfe")
    rec = {"best": -math.inf, "A": A0.clone(), "hist": [], "nan": 0}

    def closure():
        opt.zero_grad()
        rho = obj(A)
        s = float(rho.detach())
        rec["hist"].append(s)
        if not math.isfinite(s):          # make the line search step back
            rec["nan"] += 1
            A.grad = torch.zeros_like(A)
            return torch.tensor(2.0, dtype=DT)
        if s > rec["best"]:
            rec["best"], rec["A"] = s, A.detach().clone()
        (-rho).backward()
        return -rho.detach()

    opt.step(closure)
    n_iter = opt.state[opt.param_groups[0]["params"][0]].get("n_iter", 0)
    evals = obj.evals - e0
    return Run(rec["A"], rec["hist"], evals, time.process_time() - c0, rec["nan"],
               capped=n_iter >= max_iter or evals >= 2 * max_iter, n_iter=n_iter)


def hybrid(obj, A0, steps=20, lr=0.1, setting=WARM_LBFGS):
    """``steps`` Adam steps (lr ``lr``, no stopping), then L-BFGS from Adam's last state;
    the best state of either phase is kept."""
    a = adam(obj, A0, lr=lr, patience=steps + 1, tol=0.0, max_steps=steps)
    tg, tc, mi = LBFGS_SETTINGS[setting]
    b = lbfgs(obj, a.last, tg, tc, mi)
    A = a.A if a.hist.max() > (b.hist.max() if b.hist.size else -math.inf) else b.A
    return Run(A, np.concatenate([a.hist, b.hist]), a.evals + b.evals, a.sec + b.sec,
               a.nan + b.nan, capped=b.capped)


# ---------------------------------------------------------------- data
def pairs_of(F, idx, kinds):
    """Feature distances ``(P, m)`` of the pairs of stimuli ``idx``."""
    i, j = pair_indices(len(idx))
    a, b = F[idx[i]], F[idx[j]]
    return np.where(np.array(kinds) == "num", np.abs(a - b), (a != b).astype(float))


def codes_table(table):
    return np.column_stack([table[c].cat.codes.to_numpy() for c in table.columns])


def case_codes(case, s):
    """(X units, table, feature codes, folds) of the simulated-codes cases."""
    rng = np.random.default_rng(1000 + s)
    if case.startswith("binary3"):
        strong = case.endswith("strong")
        n = 200 if strong else 96
        X, table = simulate_codes(n, ("binary",) * 3, n_units=64,
                                  noise=0.7 if strong else 2.0, interaction=0.5,
                                  weights=(1.0, 0.7, 0.4), random_state=s)
        perm = rng.permutation(n)
        folds = [np.sort(perm[: n // 2]), np.sort(perm[n // 2:])]
        return X, table, folds
    # cat7x3: every cell twice, one stimulus of each cell in each half
    a, b = np.repeat(np.arange(7), 3), np.tile(np.arange(3), 7)
    a, b = np.concatenate([a, a]), np.concatenate([b, b])
    n, units, w = 42, 24, (0.5, 0.35)
    code = np.concatenate([w[0] * np.eye(7)[a] / np.sqrt(2), w[1] * np.eye(3)[b] / np.sqrt(2)],
                          axis=1)
    X = np.zeros((n, units))
    X[:, : code.shape[1]] = code
    X += 1.0 / np.sqrt(units) * rng.standard_normal(X.shape)
    table = pd.DataFrame({"f0": pd.Categorical([f"L{v}" for v in a]),
                          "f1": pd.Categorical([f"L{v}" for v in b])})
    first = rng.integers(0, 2, 21).astype(bool)         # which copy goes to half 0
    half0 = np.where(first, np.arange(21), np.arange(21) + 21)
    half1 = np.where(first, np.arange(21) + 21, np.arange(21))
    return X, table, [np.sort(half0), np.sort(half1)]


def fits(case, n_datasets, null_rng):
    """Yield fit problems: dict(name, kind, D_train, y_train, D_test, y_test, W_true,
    engine (X, table) or None, observed (name of the observed fit, for nulls))."""
    if case.split("-")[0] in ("numeric", "binary"):
        for s in range(n_datasets):
            Dm, y, W = make_case(case, 128, 8, s)
            i, j = pair_indices(128)
            num = case.startswith("numeric")
            kinds = ["num" if num else "cat"] * 8
            F = y.to_numpy() if num else (y.to_numpy() == "B").astype(float)
            rng = np.random.default_rng(500 + s)        # 128 held-out stimuli, same W_true
            Ft = rng.random((128, 8)) if num else rng.integers(0, 2, (128, 8))
            Dt = pairs_of(Ft.astype(float), np.arange(128), kinds)
            yt = np.sqrt(np.einsum("pa,ab,pb->p", Dt, W, Dt))
            yield dict(name=f"{case}/s{s}", kind="obs",
                       D_train=pairs_of(F.astype(float), np.arange(128), kinds),
                       y_train=Dm[i, j], D_test=Dt, y_test=yt, W_true=W, engine=(Dm, y),
                       observed=None)
        return
    for s in range(n_datasets):
        X, table, folds = case_codes(case, s)
        F = codes_table(table)
        kinds = ["cat"] * F.shape[1]
        for f, (tr, te) in enumerate([(folds[0], folds[1]), (folds[1], folds[0])]):
            Dn = squareform(pdist(X[tr]))
            i, j = pair_indices(len(tr))
            it, jt = pair_indices(len(te))
            test = dict(D_test=pairs_of(F, te, kinds), y_test=squareform(pdist(X[te]))[it, jt],
                        W_true=None)
            name = f"{case}/s{s}f{f}"
            yield dict(name=name, kind="obs", D_train=pairs_of(F, tr, kinds),
                       y_train=Dn[i, j], engine=(Dn, table.iloc[tr].reset_index(drop=True)),
                       observed=None, **test)
            p = null_rng.permutation(len(tr))           # relabel the training stimuli
            Dp = Dn[np.ix_(p, p)]
            yield dict(name=name + "/null", kind="null-fit", D_train=pairs_of(F, tr, kinds),
                       y_train=Dp[i, j], engine=None, observed=name, **test)


def heldout(W, D, y):
    pred = np.sqrt(np.clip(np.einsum("pa,ab,pb->p", D, W, D), 0, None))
    if np.ptp(pred) == 0:
        return float("nan")
    return float(spearmanr(pred, y).statistic)


def engine_fit(Dm, table, rs):
    c0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = MLEM(distance="precomputed", random_state=rs).fit(Dm, table)
    return est, time.process_time() - c0


# ---------------------------------------------------------------- the sweep
def run_fit(prob, args, observed_A):
    obj = Objective(prob["D_train"], prob["y_train"])
    m = obj.m
    A0 = init_params(1, m, "spd", "cpu", DT)[0]
    runs = {"adam .03/50": adam(obj, A0)}
    g = torch.Generator().manual_seed(int(args.seed))
    mask = torch.tril(torch.ones(m, m, dtype=DT))
    for r in range(2):
        dA = torch.randn(m, m, generator=g, dtype=DT) * args.perturb_sd * mask
        runs[f"adam .03/50 ±{args.perturb_sd:g} #{r}"] = adam(obj, A0 + dA)
    runs["adam .1/20"] = adam(obj, A0, lr=0.1, patience=20)
    for label, (tg, tc, mi) in LBFGS_SETTINGS.items():
        runs[f"lbfgs {label}"] = lbfgs(obj, A0, tg, tc, mi)
    runs["adam .1 x20 + lbfgs"] = hybrid(obj, A0)
    if prob["kind"] == "null-fit" and observed_A is not None:
        runs["adam warm"] = adam(obj, observed_A)
        tg, tc, mi = LBFGS_SETTINGS[WARM_LBFGS]
        runs[f"lbfgs warm {WARM_LBFGS}"] = lbfgs(obj, observed_A, tg, tc, mi)
    engines = {}
    if prob["engine"] is not None:
        seeds = [0, 1] if prob["name"].startswith("numeric") else [0]
        for rs in seeds:
            est, sec = engine_fit(*prob["engine"], rs)
            engines["engine" if rs == 0 else f"engine rs={rs}"] = (est, sec)
    rows = []
    W_adam = runs["adam .03/50"].W
    e0 = obj.evals
    ho_adam = heldout(W_adam, prob["D_test"], prob["y_test"])
    for label, r in runs.items():
        rows.append(dict(optimiser=label, evals=r.evals, sec=r.sec, W=r.W,
                         train=obj.score_W(r.W), hist=r.hist, nan=r.nan, capped=r.capped,
                         grad=max_grad(obj, r.A)))
    for label, (est, sec) in engines.items():
        rows.append(dict(optimiser=label, evals=est.n_iter_, sec=sec, W=est.W_,
                         train=obj.score_W(est.W_), hist=None, nan=0,
                         capped=not est.converged_, grad=np.nan))
    obj.evals = e0                                  # the diagnostics are not counted
    top = max(r["train"] for r in rows)
    W_engine = next((r["W"] for r in rows if r["optimiser"] == "engine"), None)
    for r in rows:
        W = r.pop("W")
        r["dW_engine"] = (float(np.linalg.norm(W - W_engine)) if W_engine is not None
                          else np.nan)
        hist = r.pop("hist")
        r.update(case=prob["name"].split("/")[0], fit=prob["name"], kind=prob["kind"],
                 gap=top - r["train"], dW=float(np.linalg.norm(W - W_adam)),
                 heldout=heldout(W, prob["D_test"], prob["y_test"]),
                 min_eig=float(np.linalg.eigvalsh(W)[0]),
                 W_err=(float(np.linalg.norm(W - prob["W_true"]))
                        if prob["W_true"] is not None else np.nan))
        r["d_heldout"] = r["heldout"] - ho_adam
        if hist is not None:
            near = np.flatnonzero(hist >= top - NEAR)
            r["to_near"] = int(near[0]) + 1 if near.size else np.nan
        else:
            r["to_near"] = np.nan
    return rows, runs["adam .03/50"].A


def max_grad(obj, A):
    """Largest gradient entry of the objective at ``A`` (a diagnostic, not counted)."""
    A = A.clone().requires_grad_(True)
    obj(A).backward()
    return float(A.grad.abs().max())


def summarise(df):
    def agg(g):
        return pd.Series({
            "fits": len(g),
            "evals med": g.evals.median(), "evals mean": g.evals.mean(),
            "to 1e-3 med": g.to_near.median(), "CPU s": g.sec.mean(),
            "gap mean": g.gap.mean(), "gap max": g.gap.max(),
            ">0.01": (g.gap > 0.01).mean(),
            "|W-Wadam| med": g.dW.median(), "|W-Wadam| max": g.dW.max(),
            "|W-Weng| med": g.dW_engine.median(),
            "d held-out mean": g.d_heldout.mean(), "|d held-out| max": g.d_heldout.abs().max(),
            "W err": g.W_err.mean(),
            "flat stops": f"{int(((g.grad < 1e-9) & (g.gap > 1e-3)).sum())}"
                          f"/{int((g.grad < 1e-9).sum())}",
            "fail nan/lowrank/cap": f"{int((g.nan > 0).sum())}/{int((g.min_eig < 1e-8).sum())}"
                                    f"/{int(g.capped.sum())}",
        })
    return df.groupby(["case", "kind", "optimiser"], sort=False).apply(agg, include_groups=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+",
                   default=["binary3", "binary3-strong", "cat7x3", "numeric", "numeric-paperW",
                            "binary"])
    p.add_argument("--datasets", type=int, nargs="+", default=None,
                   help="datasets per case (one number, or one per case; default 3 for "
                        "binary3, 3 binary3-strong, 8 cat7x3, 6 numeric and binary, 4 "
                        "numeric-paperW)")
    p.add_argument("--perturb-sd", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", default=None, help="write every run's row there")
    args = p.parse_args()
    torch.set_num_threads(1)
    default = {"binary3": 5, "binary3-strong": 3, "cat7x3": 8, "numeric": 6,
               "numeric-paperW": 4, "binary": 6}
    if args.datasets is None:
        counts = [default[c] for c in args.cases]
    elif len(args.datasets) == 1:
        counts = args.datasets * len(args.cases)
    else:
        counts = args.datasets
    rows = []
    t0 = time.process_time()
    for case, n_data in zip(args.cases, counts):
        observed = {}
        null_rng = np.random.default_rng([args.seed, zlib.crc32(case.encode())])
        for prob in fits(case, n_data, null_rng):
            out, A_adam = run_fit(prob, args, observed.get(prob["observed"]))
            if prob["kind"] == "obs":
                observed[prob["name"]] = A_adam
            rows += out
            d = {r["optimiser"]: r for r in out}
            a = d["adam .03/50"]
            best_l = min((r for r in out if r["optimiser"].startswith("lbfgs")
                          and "warm" not in r["optimiser"]), key=lambda r: r["gap"])
            print(f"{prob['name']:>24}: adam {a['evals']:4d} ev, train {a['train']:.4f} "
                  f"(gap {a['gap']:.4f}), held-out {a['heldout']:.4f}; best lbfgs "
                  f"{best_l['optimiser']} {best_l['evals']} ev, gap {best_l['gap']:.4f}, "
                  f"|dW| {best_l['dW']:.3f}  [{time.process_time() - t0:.0f} s]", flush=True)
    df = pd.DataFrame(rows)
    if args.csv:
        df.to_csv(args.csv, index=False)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    print("\nper case, kind (obs: observed fit; null-fit: relabelled) and optimiser; gap: best "
          "training soft Spearman of any run on the fit minus this run's; |W-Wadam|: "
          "Frobenius distance to the 'adam .03/50' fit (its ±sd rows: Adam's own spread); "
          "d held-out: exact held-out Spearman minus Adam's; W err: ||W - W_true||; "
          "fail: runs with a NaN value / smallest eigenvalue < 1e-8 / stopped by a cap; "
          "flat stops: kept state with gradient < 1e-9 and gap > 1e-3 / gradient < 1e-9")
    print(summarise(df).to_string(float_format=lambda v: f"{v:.4g}"))
    print(f"\ntotal CPU {time.process_time() - t0:.0f} s")


if __name__ == "__main__":
    main()
