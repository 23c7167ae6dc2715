"""The ``mlem-neuro`` command line.

* ``mlem-neuro demo``: the main job on built-in simulated data (no download): MLEM vs
  FR-RSA-I on the paper's simulation, plus a time-resolved analysis of simulated epochs;
  figures, a CSV table and an HTML report go to ``--out``.
* ``mlem-neuro epochs FILE-epo.fif --features a,b --out DIR``: time-resolved MLEM.
* ``mlem-neuro searchlight --imgs RUN... --events TSV... --t-r 2.5 --mask MASK --out DIR``:
  per-trial beta maps with nilearn's GLM, then a searchlight; ``--group-runs`` keeps each
  run's trials in one fold.

Bad paths and options end with a one-line error and a non-zero exit code.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np

EXIT_USAGE = 2


class CLIError(Exception):
    """An error reported to the user in one line."""


# ------------------------------------------------------------------------------ demo
def _simulation_table(n_stimuli, n_features, n_units, noise_levels, seeds, log):
    """MLEM vs FR-RSA-I on the paper's simulation: one row per noise level, seed and model."""
    import pandas as pd

    from . import MLEM
    from .simulation import simulate_representations

    rows = []
    for noise in noise_levels:
        for seed in seeds:
            X, y, W = simulate_representations(n_stimuli, n_features, n_units, noise=noise,
                                               random_state=seed)
            rng = np.random.default_rng(seed)
            test = rng.permutation(n_stimuli)[: n_stimuli // 5]
            train = np.setdiff1d(np.arange(n_stimuli), test)
            for label, constraint in (("MLEM", "spd"), ("FR-RSA-I", "none")):
                t0 = time.perf_counter()
                est = MLEM(constraint=constraint, random_state=seed).fit(X[train],
                                                                         y.iloc[train])
                rows.append(dict(noise=noise, seed=seed, model=label,
                                 frobenius_error=np.linalg.norm(est.W_ - W),
                                 steps=est.n_iter_,
                                 test_spearman=est.score(X[test], y.iloc[test]),
                                 seconds=time.perf_counter() - t0))
        table = pd.DataFrame(rows)
        for label in ("MLEM", "FR-RSA-I"):
            sub = table[(table["noise"] == noise) & (table["model"] == label)]
            log(f"  noise {noise:4.2f} {label:>9}: |W - W_true|_F = "
                f"{sub['frobenius_error'].mean():.3f} ± {sub['frobenius_error'].std(ddof=0):.3f}"
                f", {sub['steps'].median():.0f} steps (median), held-out rho = "
                f"{sub['test_spearman'].mean():.3f}  ({len(sub)} seeds)")
    table = pd.DataFrame(rows)
    wide = table.pivot_table(index=["noise", "seed"], columns="model",
                             values=["frobenius_error", "steps"])
    closer = int((wide["frobenius_error"]["MLEM"] < wide["frobenius_error"]["FR-RSA-I"]).sum())
    fewer = int((wide["steps"]["MLEM"] < wide["steps"]["FR-RSA-I"]).sum())
    log(f"  MLEM closer to W_true than FR-RSA-I in {closer} of {len(wide)} runs; fewer steps "
        f"in {fewer} of {len(wide)}")
    return table


def _simulation_figure(table):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    stats = table.groupby(["model", "noise"], sort=False)[
        ["frobenius_error", "steps", "test_spearman"]].agg(["mean", "std"])
    for label in table["model"].unique():
        sub = stats.loc[label]
        for ax, col in zip(axes, ("frobenius_error", "steps", "test_spearman")):
            ax.errorbar(sub.index, sub[(col, "mean")], yerr=sub[(col, "std")].fillna(0),
                        fmt="o-", capsize=3, label=label)
    n_seeds = table["seed"].nunique()
    for ax, title in zip(axes, ("distance to ground-truth W (Frobenius)",
                                "training steps to converge", "held-out Spearman")):
        ax.set(xlabel="noise level", title=title)
    axes[0].legend(title=f"mean ± sd, {n_seeds} seeds")
    fig.tight_layout()
    return fig


def run_demo(out, paper=False, seed=0, n_seeds=5, log=print):
    """Run the demo and write its outputs to ``out``; return the report path."""
    import matplotlib

    matplotlib.use("Agg")
    import mne

    from .simulation import simulate_epochs
    from .time_resolved import mlem_array

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = (256, 16, 768) if paper else (128, 8, 256)
    log(f"1/2 MLEM vs FR-RSA-I on the paper's simulation ({size[0]} stimuli, {size[1]} "
        f"binary features, {size[2]} units; seeds {seed}-{seed + n_seeds - 1})")
    table = _simulation_table(*size, noise_levels=(0.1, 0.5, 1.0, 2.0),
                              seeds=range(seed, seed + n_seeds), log=log)
    table.to_csv(out / "simulation.csv", index=False)
    fig_sim = _simulation_figure(table)
    fig_sim.savefig(out / "simulation.png", dpi=110)

    log("2/2 time-resolved MLEM on simulated epochs (A encoded 0.1-0.3 s, B 0.4-0.6 s, "
        "C never)")
    data, features, times = simulate_epochs(n_trials=80, n_channels=20, n_times=45,
                                            sfreq=50.0, random_state=seed)
    res = mlem_array(data, features, times=times, cv=5, random_state=seed)
    res.save(out / "time_resolved_mlem.npz", overwrite=True)
    fig_time = res.plot(show=False)
    fig_time.savefig(out / "time_resolved.png", dpi=110)
    peak = {t: float(times[np.argmax(res.importance[:, k])]) for k, t in enumerate(res.terms)
            if ":" not in t}
    log("  importance peaks: " + ", ".join(f"{t} at {p:.2f} s" for t, p in peak.items()))

    report = mne.Report(title="mlem_neuro demo", verbose=False)
    report.add_figure(fig_sim, title="Paper simulation: MLEM vs FR-RSA-I",
                      caption="Distance of the learnt W to the ground truth, steps to "
                              "converge and held-out Spearman across noise levels.")
    report.add_html(table.round(4).to_html(index=False), title="Simulation table")
    report.add_figure(fig_time, title="Time-resolved importance (simulated epochs)",
                      caption="Fold mean ± spread of permutation importance per term.")
    path = out / "report.html"
    report.save(path, open_browser=False, overwrite=True, verbose=False)
    log(f"Wrote {out / 'simulation.png'}, {out / 'time_resolved.png'}, "
        f"{out / 'simulation.csv'}, {out / 'time_resolved_mlem.npz'}")
    log(f"Report: {path}")
    return path


# ---------------------------------------------------------------------------- epochs
def _existing(path, what):
    p = Path(path)
    if not p.exists():
        raise CLIError(f"{what} not found: {path}")
    return p


def _analysis_kwargs(args):
    return dict(cv=None if args.cv == 0 else args.cv, n_permutations=args.n_permutations,
                constraint=args.constraint, interactions=not args.no_interactions,
                n_jobs=args.n_jobs, device=args.device, random_state=args.seed,
                verbose="INFO")


def run_epochs(args):
    fname = _existing(args.fname, "epochs file")
    import matplotlib

    matplotlib.use("Agg")
    import mne

    from .time_resolved import mlem_epochs

    epochs = mne.read_epochs(fname, preload=True, verbose="ERROR")
    features = args.features.split(",") if args.features else None
    res = mlem_epochs(epochs, features=features, tmin=args.tmin, tmax=args.tmax,
                      decim=args.decim, window=args.window, **_analysis_kwargs(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res.save(out / "mlem.npz", overwrite=True)
    res.to_data_frame().to_csv(out / "importance.csv", index=False)
    res.plot(show=False).savefig(out / "importance.png", dpi=110)
    print(f"Wrote {out / 'mlem.npz'}, {out / 'importance.csv'}, {out / 'importance.png'}")


def _run_folds(table, n_folds):
    """Folds that keep each run's trials together (GroupKFold over the runs)."""
    import pandas as pd
    from sklearn.model_selection import GroupKFold

    runs = table.index.get_level_values("run")
    n_runs = len(set(runs))
    if n_folds is None:
        raise CLIError("--group-runs needs cross-validation: pass --cv 2 or more, not 0")
    if n_runs < n_folds:
        raise CLIError(f"--group-runs with --cv {n_folds} needs at least {n_folds} runs; "
                       f"got {n_runs}. Lower --cv or give more runs.")
    folds = list(GroupKFold(n_splits=n_folds).split(table, groups=runs))
    # A feature whose held-out pairs all have the same distance (e.g. one trial per
    # category per run, one run held out: every pair differs) has importance 0 there by
    # construction (the analysis warns), and when every feature does the fold cannot be
    # scored at all: say so in terms of the command's options.
    for k, (_, test) in enumerate(folds):
        flat = []
        for col in table.columns:
            values = table[col].iloc[test]
            n_unique = values.nunique(dropna=False)
            numeric = pd.api.types.is_numeric_dtype(values) and \
                not pd.api.types.is_bool_dtype(values)
            if n_unique == 1 or (not numeric and n_unique == len(values)):
                flat.append(col)
        if flat:
            msg = (f"with --group-runs --cv {n_folds}, every held-out pair of fold {k + 1} "
                   f"has the same distance on {flat}: importance there is 0 by "
                   "construction. Use fewer folds, so that each holds out more runs.")
            if len(flat) == table.shape[1]:
                raise CLIError(msg)
    return folds


def _brain_map_figure(res, bg_img):
    """One row per term (importance) and a last row with the held-out score."""
    import matplotlib.pyplot as plt

    rows = [*res.terms, None]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 2.6 * len(rows)), squeeze=False)
    for ax, term in zip(axes[:, 0], rows):
        with warnings.catch_warnings():   # an all-zero map is a result, not a problem
            warnings.filterwarnings("ignore", message="(Given img is )?empty")
            res.plot(term, bg_img=bg_img, axes=ax, figure=fig, draw_cross=False,
                     cmap="RdBu_r")
    return fig


def run_searchlight(args):
    imgs = [str(_existing(p, "image")) for p in args.imgs]
    event_files = [_existing(p, "events file") for p in args.events]
    mask = str(_existing(args.mask, "mask image"))
    if len(imgs) != len(event_files):
        raise CLIError(f"give one events file per run: {len(imgs)} images, "
                       f"{len(event_files)} events files")
    if args.group_runs and args.model != "trial":
        raise CLIError("--group-runs needs --model trial (condition images average over "
                       "runs)")
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    from nibabel.filebasedimages import ImageFileError
    from nilearn.image import mean_img

    from .fmri import trial_images
    from .searchlight import mlem_searchlight

    events = [pd.read_csv(p, sep="\t") for p in event_files]
    feature_cols = args.features.split(",") if args.features else None
    kwargs = _analysis_kwargs(args)
    try:
        betas, table = trial_images(imgs, events, t_r=args.t_r, mask_img=mask,
                                    model=args.model, feature_cols=feature_cols)
        if args.group_runs:
            kwargs["cv"] = _run_folds(table, kwargs["cv"])
        res = mlem_searchlight(betas, table, mask, radius=args.radius, **kwargs)
        bg_img = mean_img(imgs[0], copy_header=True)
    except ImageFileError as err:
        raise CLIError(f"{err} (--imgs and --mask take NIfTI images)") from None
    if args.group_runs:   # say how the explicit folds were made (their indices are kept)
        res.settings["cv"] = f"GroupKFold({args.cv}) over runs"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res.save(out / "mlem.npz", overwrite=True)
    res.to_nifti().to_filename(out / "importance.nii.gz")
    res.to_data_frame().to_csv(out / "importance.csv", index=False)
    _brain_map_figure(res, bg_img).savefig(out / "importance.png", dpi=110)
    print(f"Wrote {out / 'mlem.npz'}, {out / 'importance.nii.gz'} (one volume per term: "
          f"{', '.join(res.terms)}), {out / 'importance.csv'}, {out / 'importance.png'}")


# ------------------------------------------------------------------------------ main
def _positive_int(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _add_analysis_options(p):
    p.add_argument("--cv", type=int, default=5, help="folds over stimuli (0: no CV, "
                                                       "optimistic)")
    p.add_argument("--n-permutations", type=_positive_int, default=10)
    p.add_argument("--constraint", choices=("spd", "diagonal", "none"), default="spd")
    p.add_argument("--no-interactions", action="store_true")
    p.add_argument("--n-jobs", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="mlem-neuro", description="Metric Learning Encoding Models for neuroimaging.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="main job on built-in simulated data (no download)")
    d.add_argument("--out", default="mlem_demo", help="output folder (default: mlem_demo)")
    d.add_argument("--paper", action="store_true",
                   help="the paper's full-size simulation (256 stimuli, 16 features, 768 "
                        "units; slower)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--seeds", type=_positive_int, default=5,
                   help="simulations per noise level (seeds --seed, --seed + 1, ...; "
                        "default: 5)")
    e = sub.add_parser("epochs", help="time-resolved MLEM on an MNE epochs file")
    e.add_argument("fname", help="an MNE epochs file (*-epo.fif)")
    e.add_argument("--features", help="comma-separated metadata columns (default: "
                                      "metadata, else event-name tags)")
    e.add_argument("--tmin", type=float)
    e.add_argument("--tmax", type=float)
    e.add_argument("--decim", type=_positive_int, default=1)
    e.add_argument("--window", type=float, default=None,
                   help="average each sample over this many seconds around it (before "
                        "--decim, against aliasing)")
    _add_analysis_options(e)
    s = sub.add_parser("searchlight", help="fMRI searchlight MLEM from BOLD runs + events")
    s.add_argument("--imgs", nargs="+", required=True, help="BOLD runs (4D NIfTI)")
    s.add_argument("--events", nargs="+", required=True, help="BIDS events.tsv, one per run")
    s.add_argument("--mask", required=True, help="brain mask image")
    s.add_argument("--t-r", type=float, required=True, help="repetition time (s)")
    s.add_argument("--radius", type=float, default=6.0, help="sphere radius in mm")
    s.add_argument("--model", choices=("trial", "condition"), default="trial")
    s.add_argument("--features", help="comma-separated events columns")
    s.add_argument("--group-runs", action="store_true",
                   help="with --model trial: cross-validate over runs (GroupKFold with "
                        "--cv folds), so that a run's trials are never split between "
                        "training and test")
    _add_analysis_options(s)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            run_demo(args.out, paper=args.paper, seed=args.seed, n_seeds=args.seeds)
        elif args.command == "epochs":
            run_epochs(args)
        else:
            run_searchlight(args)
    except (CLIError, ValueError, TypeError, FileNotFoundError, OSError) as err:
        msg = " ".join(str(err).split())
        msg = re.sub(r"\b(?:Posix|Windows)?Path\(('[^']*')\)", r"\1", msg)  # MNE's repr()
        print(f"mlem-neuro {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
