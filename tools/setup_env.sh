#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment with everything the tests need.
#
#   bash tools/setup_env.sh [VENV_DIR]
#
# * torch: reused when the base interpreter already has one (the venv then sees the
#   system site-packages); otherwise installed from $MLEM_TORCH_SPEC (default torch==2.13.0,
#   the CPU build on these machines).  For a CUDA build, install torch first, or set
#   MLEM_TORCH_SPEC and pip's index options yourself.
# * torchsort: compiled against that torch with --no-build-isolation.  Its setup.py
#   builds the CUDA kernel whenever `nvcc` is on PATH, which fails against a CPU torch, so
#   nvcc is hidden from PATH for that build when torch has no CUDA.
# * numpy before torch: torch warns "Failed to initialize NumPy" on import without one.
# * the package itself, editable, with every optional extra (MEG/EEG, fMRI, figures) and
#   the test and doc tools; torch is pinned to the version found above, so pip can never
#   swap it for another build while resolving the extras.
# The torch probes below send their stderr to /dev/null: a probe that fails is an answer.
set -euo pipefail

VENV=${1:-.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${MLEM_TORCH_SPEC:-torch==2.13.0}
TORCHSORT_SPEC=${MLEM_TORCHSORT_SPEC:-torchsort==0.1.10}

if [ ! -x "$VENV/bin/python" ]; then
    if "$PY" -c "import torch" >/dev/null 2>&1; then
        echo "setup: reusing the torch installed for $PY"
        "$PY" -m venv --system-site-packages "$VENV"
    else
        "$PY" -m venv "$VENV"
    fi
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade "pip>=23" "setuptools>=77" wheel

if ! "$VPY" -c "import numpy" >/dev/null 2>&1; then
    "$VPY" -m pip install -q "numpy>=1.24"
fi

if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing $TORCH_SPEC"
    "$VPY" -m pip install "$TORCH_SPEC"
fi

if ! "$VPY" -c "import torch, torchsort" >/dev/null 2>&1; then
    build_path="$PATH"
    if [ "$("$VPY" -c 'import torch; print(torch.version.cuda is None)' 2>/dev/null)" = "True" ]; then
        # CPU torch: drop every PATH entry that holds an nvcc.
        build_path=$(printf '%s' "$PATH" | tr ':' '\n' | while read -r d; do
            [ -n "$d" ] && [ ! -x "$d/nvcc" ] && printf '%s:' "$d"; done)
        build_path=${build_path%:}
    fi
    echo "setup: building $TORCHSORT_SPEC against the installed torch (about a minute)"
    PATH="$build_path" "$VPY" -m pip install --no-build-isolation --no-cache-dir "$TORCHSORT_SPEC"
fi

TORCH_VERSION=$("$VPY" -c "import torch; print(torch.__version__)" 2>/dev/null)
# (setuptools' "Editable installation ... be careful with folders" notice is informational)
PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
    "$VPY" -m pip install -q -e ".[all,test,doc]" "torch==$TORCH_VERSION"
"$VPY" -c "import torch, torchsort, mlem_neuro; print('setup: torch', torch.__version__, '| torchsort ok | mlem_neuro', mlem_neuro.__version__)"
