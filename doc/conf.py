"""Sphinx configuration (sphinx + sphinx-gallery + numpydoc; built offline)."""
import glob
import os
import sys

import mlem_neuro

# autosummary writes a stub per listed name into generated/ and never removes one: a stub
# of a name that moved (a module renamed) would fail the build.  Start from none.
for _stub in glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "generated", "mlem_neuro.*.rst")):
    os.remove(_stub)

# doc/sphinxext: validation_page writes generated/validation_scripts.txt from validation/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "sphinxext"))

project = "mlem_neuro"
release = version = mlem_neuro.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.mathjax",
              "numpydoc", "sphinx_gallery.gen_gallery", "validation_page"]
autosummary_generate = True
numpydoc_show_class_members = False
sphinx_gallery_conf = {
    "examples_dirs": "../tutorials",
    "gallery_dirs": "auto_tutorials",
    "filename_pattern": r"/plot_",
    "abort_on_example_error": True,      # a broken tutorial fails the build (and CI)
    "download_all_examples": False,
    # sphinx-gallery skips a tutorial whose source is unchanged since its last run, so a
    # change in the package would leave its output stale; the test suite's build sets
    # MLEM_DOC_RUN_ALL=1 to run every tutorial each time, as on a fresh checkout.
    "run_stale_examples": os.environ.get("MLEM_DOC_RUN_ALL") == "1",
}
nitpicky = False
html_theme = "pydata_sphinx_theme"
exclude_patterns = ["_build"]
