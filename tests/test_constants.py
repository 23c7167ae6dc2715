"""The constants the training paths share are defined once (:mod:`mlem_neuro.core.
constants`); the compiled loop's float32 copies of the AdamW ones are kept equal here.
No other module defines a tuning number, and the vocabulary (the constraints, ...) is
defined once, in :mod:`mlem_neuro.core.checks`."""
import ast
import re
from pathlib import Path

import numpy as np

import mlem_neuro
from mlem_neuro.core import checks, constants
from mlem_neuro.core.kernels import training as kernel_training
from mlem_neuro.core.ranks import spearman
from mlem_neuro.core.training import compiled, reference, torch_loop

ROOT = Path(mlem_neuro.__file__).parent
#: ALL-CAPS numbers that are not tuning numbers, each with what it is
NOT_TUNING = {
    "cli.py:EXIT_USAGE": "the exit status of a usage error (2, argparse's)",
    "searchlight.py:_TEMPLATE_CODES": "NIfTI's codes of template (MNI, Talairach) spaces",
    "results/_base.py:_FORMAT": "the version of the saved result format",
    "results/_base.py:_MAX_ENTRY_BYTES": "the zip format's limit on one entry",
    "core/stimuli/design.py:PAIR_SEED": "a seed (reproducibility, not tuning)",
    "core/memory.py:_UNITS": "the units of a memory size (k, MiB, ...)",
    "core/training/metric.py:_SOFTPLUS_INV_1": "softplus^-1(1), the start of W's diagonal",
    "core/checks.py:TAILS": "the tails of a test (vocabulary: 1, 0, -1)",
    "adapters/nifti.py:SPHERE_ENTRY_BYTES": "the bytes one sphere-membership entry takes "
                                            "(a measured fact, not a choice)",
    "core/kernels/training.py:CONSTRAINT_CODES": "the compiled loop's code of each constraint",
    "core/kernels/training.py:_N_FLOAT_ROWS": "the rows of the compiled loop's workspace (layout)",
    "core/kernels/training.py:_N_INT_ROWS": "the rows of the compiled loop's workspace (layout)",
    "core/kernels/training.py:_N_MATRICES": "the matrices of the compiled loop's workspace "
                                            "(layout)",
    "core/training/reference.py:_ABSENT": "half a pair: a group with no pair in a batch",
}
#: no module is exempt any more (the training loops moved their numbers here too)
PENDING = ()


def _is_number(node):
    """A literal number, or arithmetic / a tuple / a dict of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_is_number(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return bool(node.values) and all(_is_number(v) for v in node.values)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "log":
        return True
    return False


def _module_numbers():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "core/constants.py" or rel.startswith(PENDING):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and _is_number(node.value):
                for target in node.targets:
                    for name in ([target] if isinstance(target, ast.Name) else
                                 getattr(target, "elts", [])):
                        if isinstance(name, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*",
                                                                       name.id):
                            yield f"{rel}:{name.id}"


def test_no_module_but_constants_defines_a_tuning_number():
    found = set(_module_numbers())
    assert found - set(NOT_TUNING) == set(), "move these to mlem_neuro.core.constants"
    assert set(NOT_TUNING) <= found, "stale allow-list entries"


def test_every_tuning_constant_says_what_it_tunes():
    """Each constant of constants.py has a ``#:`` comment right above it."""
    lines = Path(constants.__file__).read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"[A-Z][A-Z0-9_]*(, [A-Z][A-Z0-9_]*)* = ", line):
            assert lines[i - 1].startswith("#:"), line


def test_modules_use_the_shared_constants_under_their_old_names():
    from mlem_neuro import crossval
    from mlem_neuro.core import memory
    from mlem_neuro.core.ranks import grouped
    from mlem_neuro.core.rdms import neural
    from mlem_neuro.core.training import batch_size, quantise

    assert crossval.CHUNK_BYTES is constants.CHUNK_BYTES
    assert neural.CHUNK_BYTES is constants.NEURAL_CHUNK_BYTES
    assert batch_size.THRESHOLD is constants.BATCH_THRESHOLD
    assert memory.DEFAULT_BYTES is constants.MEMORY_BYTES
    assert quantise.MAX_CELLS is constants.MAX_CELLS and grouped.MAX_GROUPS is constants.MAX_GROUPS
    assert grouped._EPS is spearman._EPS is constants.NORM_EPS


def test_the_vocabulary_is_defined_once():
    """The constraints (and the other word lists) are tuples in checks.py only."""
    lists = {checks.CONSTRAINTS, checks.LEVELS, checks.NULLS, checks.BACKENDS,
             checks.HELD_OUT_PAIRS, checks.FEATURE_KINDS}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "core/checks.py" or rel.startswith(PENDING):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant)
                                                   for e in node.elts):
                assert tuple(e.value for e in node.elts) not in lists, (rel, node.lineno)

def test_python_paths_use_the_shared_constants():
    assert torch_loop._BETA1 is constants.ADAM_BETA1
    assert torch_loop._BETA2 is constants.ADAM_BETA2
    assert torch_loop._ADAM_EPS == constants.ADAM_EPS
    assert spearman.SOFT_RANK_STRENGTH == constants.SOFT_RANK_STRENGTH
    assert reference.ADAM_BETA1 is constants.ADAM_BETA1
    assert reference.SOFT_RANK_STRENGTH == constants.SOFT_RANK_STRENGTH


def test_the_compiled_loop_holds_the_same_adamw_constants():
    """Its float32 copies (the loop's AdamW runs in float32, as torch's on float32
    parameters) are the float32 roundings of the shared constants."""
    for name, value in [("_B1", constants.ADAM_BETA1), ("_B2", constants.ADAM_BETA2),
                        ("_ADAM_EPS", constants.ADAM_EPS),
                        ("_ONE_B1", 1.0 - constants.ADAM_BETA1),
                        ("_ONE_B2", 1.0 - constants.ADAM_BETA2)]:
        got = getattr(kernel_training, name)
        assert got.dtype == np.float32 and got == np.float32(value), name
    assert compiled.MAX_FEATURES == constants.COMPILED_MAX_FEATURES
    assert kernel_training._EPS == constants.NORM_EPS
    assert kernel_training._Q_EPS == constants.PREDICT_EPS
