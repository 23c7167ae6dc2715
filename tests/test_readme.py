"""Every ```python block of README.md runs as written, and defines every name it uses.

Each block is executed on its own (a fresh namespace, a temporary working directory), so a
reader can copy any one block; the README's own code sets the sizes that keep it fast.
"""
import builtins
import re
import symtable
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _python_blocks():
    """``(heading, code)`` of every ```python block, headed by the section it is in."""
    blocks, heading = [], "(top)"
    for part in re.split(r"(```python\n.*?```)", README.read_text(), flags=re.S):
        if part.startswith("```python\n"):
            blocks.append((heading, part[len("```python\n"):-3]))
            continue
        titles = re.findall(r"^#+ (.+)$", part, flags=re.M)
        heading = titles[-1].strip() if titles else heading
    return blocks


BLOCKS = _python_blocks()
IDS = [f"{k}-{re.sub(r'[^a-z]+', '_', h.lower()).strip('_')[:20]}"
       for k, (h, _) in enumerate(BLOCKS)]


def _block(words):
    """The one block whose code holds all ``words``."""
    found = [code for _, code in BLOCKS if all(w in code for w in words)]
    assert len(found) == 1, f"expected one README block with {words}, found {len(found)}"
    return found[0]


def _undefined_names(code):
    """Names a block reads that neither it nor Python's builtins define."""
    top = symtable.symtable(code, "README.md", "exec")
    defined = {s.get_name() for s in top.get_symbols()
               if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used, stack = set(), [top]
    while stack:
        table = stack.pop()
        stack.extend(table.get_children())
        for s in table.get_symbols():
            at_module = table is top or s.is_global()
            if s.is_referenced() and at_module:
                used.add(s.get_name())
    return sorted(used - defined - set(dir(builtins)))


def _run(code, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(code, str(README), "exec"), namespace)
    finally:
        plt.close("all")
    return namespace


def test_readme_has_the_examples():
    headings = " | ".join(h for h, _ in BLOCKS)
    assert len(BLOCKS) >= 4, headings
    for section in ("Usage", "MEG / EEG", "fMRI"):
        assert section in headings, f"no python block under a {section!r} heading: {headings}"


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=IDS)
def test_readme_block_defines_every_name(code):
    assert _undefined_names(code) == []


def test_undefined_name_check_catches_a_missing_input():
    code = "import mlem_neuro\n\ndef f(x):\n    return x + offset\n\nres = f(epochs)\n"
    assert _undefined_names(code) == ["epochs", "offset"]
    assert _undefined_names("epochs = 1\nprint(len([epochs]))\n") == []


def test_readme_two_commands_are_make_targets():
    text = README.read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in text
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"Makefile has no {target}"


@pytest.mark.slow
def test_readme_usage_block_runs(tmp_path, monkeypatch):
    ns = _run(_block(["MLEM(", "simulate_representations"]), tmp_path, monkeypatch)
    est, W_true, imp = ns["est"], ns["W_true"], ns["imp"]
    assert est.W_.shape == (6, 6)
    assert np.linalg.norm(est.W_) == pytest.approx(1.0)
    assert np.linalg.eigvalsh(est.W_).min() > 0                  # SPD, as documented
    assert np.corrcoef(est.W_.ravel(), W_true.ravel())[0, 1] > 0.5   # recovers W_true
    assert est.score(ns["X"][100:], ns["y"][100:]) > 0.3
    features = [f"f{k}" for k in range(6)]
    pairs = {f"{a}:{b}" for i, a in enumerate(features) for b in features[i + 1:]}
    assert set(features) <= set(imp.index) <= set(features) | pairs


@pytest.mark.slow
def test_readme_epochs_block_runs(tmp_path, monkeypatch):
    import mlem_neuro

    ns = _run(_block(["mlem_epochs", "permutation_cluster_test"]), tmp_path, monkeypatch)
    results = ns["results_per_subject"]
    assert len(results) == 4
    back = mlem_neuro.read_result(tmp_path / "sub-04_mlem.npz")
    np.testing.assert_allclose(back.importance, results[-1].importance)
    assert {"word_class", "number"} <= set(results[0].terms)
    assert ns["stats"].term == "number"
    # the simulated windows come back: each feature peaks (group mean) inside its own
    times = results[0].times
    for term, (start, stop) in (("word_class", (0.0, 0.1)), ("number", (0.06, 0.16))):
        k = results[0].terms.index(term)
        mean = np.mean([r.importance[:, k] for r in results], axis=0)
        assert start - 1e-9 <= times[np.argmax(mean)] <= stop + 1e-9, (term, mean)


@pytest.mark.slow
def test_readme_array_block_runs(tmp_path, monkeypatch):
    ns = _run(_block(["mlem_array"]), tmp_path, monkeypatch)
    res = ns["res_ecog"]
    assert res.importance.shape == (40, len(res.terms))
    assert {"A", "B", "C"} <= set(res.terms)
    np.testing.assert_allclose(res.times, ns["times"])
    # the block's comment: A encoded 0.1-0.3 s, B 0.4-0.6 s (peaks measured over
    # simulation seeds 0-3: A at 0.16-0.20 s, B at 0.48-0.52 s)
    peak = {t: res.times[np.argmax(res.importance[:, k])] for k, t in enumerate(res.terms)}
    assert 0.1 <= peak["A"] <= 0.3 and 0.4 <= peak["B"] <= 0.6


@pytest.mark.slow
def test_readme_fmri_block_runs(tmp_path, monkeypatch):
    import nibabel as nib

    ns = _run(_block(["mlem_searchlight", "trial_images"]), tmp_path, monkeypatch)
    res, roi = ns["res"], ns["roi"]
    assert ns["betas"].shape == (6, 4, 4, 32)                   # 2 runs x 16 trials
    assert {"category", "animacy"} <= set(res.terms)
    assert nib.load(tmp_path / "importance.nii.gz").shape[-1] == len(res.terms)
    # category information sits where it was simulated (x < 12 mm)
    category = res.importance_img("category").get_fdata()
    assert category[:3].mean() > category[3:].mean()
    assert len(roi.score) == 2                                   # one model per region
    assert roi.score[0] > roi.score[1]


def test_make_demo_can_run_twice_and_says_how_long_it_took(tmp_path, capsys):
    """``make demo`` replaces its own output folder (--overwrite) and reports its time."""
    from mlem_neuro.cli import main

    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"mlem-neuro demo --out mlem_demo --overwrite", makefile)
    argv = ["demo", "--out", str(tmp_path / "demo"), "--seeds", "1", "--overwrite"]
    for _ in range(2):
        assert main(argv) == 0
        assert re.search(r"Done in \d+ s on \d+ CPU core", capsys.readouterr().out)
    html = (tmp_path / "demo" / "report.html").read_text()
    # the report leads with its takeaway, then the case where MLEM and RSA disagree
    assert html.index("What this demo shows") < html.index("Simulation: MLEM vs FR-RSA-I")
    assert "Where MLEM and RSA disagree: A XOR B" in html and "<details>" in html


def test_the_demo_case_where_mlem_and_rsa_disagree():
    """Ground truth: A XOR B coded; each feature's own model RDM predicts nothing.  Over
    seeds 0-2 (measured): Mantel p 0.32-0.96, MLEM p 0.01 for both features and for the
    interactions, with the defaults as with 2 x 20 before them (validation/why_mlem.py: Mantel
    1-3 %, MLEM 2x20 99-100 % of datasets)."""
    from mlem_neuro.demo import xor_comparison

    out = xor_comparison(0)
    assert (out.loc[["A", "B"], "Mantel"] > 0.1).all()
    assert (out["MLEM"] < 0.05).all()
