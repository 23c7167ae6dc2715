"""The constants the training paths share are defined once (:mod:`mlem_neuro.core.
constants`); the compiled loop spells the AdamW ones as C literals, kept equal here."""
import re
from pathlib import Path

from mlem_neuro.core import constants, engine, numpy_train, spearman

C_SOURCE = Path(constants.__file__).with_name("_ctrain.c").read_text()


def test_python_paths_use_the_shared_constants():
    assert engine._BETA1 is constants.ADAM_BETA1 and numpy_train._BETA2 is constants.ADAM_BETA2
    assert engine._ADAM_EPS == numpy_train._ADAM_EPS == constants.ADAM_EPS
    assert spearman.SOFT_RANK_STRENGTH == constants.SOFT_RANK_STRENGTH


def test_the_compiled_loop_spells_the_same_adamw_constants():
    b1, b2 = (float(v) for v in re.search(
        r"const float b1 = ([0-9.e-]+)f, b2 = ([0-9.e-]+)f", C_SOURCE).groups())
    eps = float(re.search(r"adam_eps = ([0-9.e-]+)f", C_SOURCE).group(1))
    assert (b1, b2, eps) == (constants.ADAM_BETA1, constants.ADAM_BETA2, constants.ADAM_EPS)
    # the bias corrections use the same decays
    assert f"pow({constants.ADAM_BETA2}," in C_SOURCE and f"pow({constants.ADAM_BETA1},"\
        in C_SOURCE
