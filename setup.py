"""The package's one compiled part (metadata: pyproject.toml).

``mlem_neuro.core._ctrain``: the training loop of grouped full batches in C
(``mlem_neuro/core/ctrain.py``).  It is optional: where no C compiler is found the
install goes on without it and the numpy loop trains the same models.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("mlem_neuro.core._ctrain", ["mlem_neuro/core/_ctrain.c"],
                             optional=True)])
