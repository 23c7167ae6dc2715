"""Numerical constants that several training paths share: defined here once.

The compiled loop (``_ctrain.c``) still spells the AdamW constants as literals (until
it is ported to numba); ``tests/test_constants.py`` checks they equal these.
"""

#: strength of torchsort's soft rank in the soft Spearman that training maximises
#: (regularisation of the isotonic projection; 1.0, the MLEM paper's setting)
SOFT_RANK_STRENGTH = 1.0

#: AdamW's moment decays and denominator offset (torch's defaults; no weight decay)
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8
