#!/usr/bin/env bash
# CUDA checks of mlem_neuro on a GPU machine: install, tests, benchmarks; logs into $OUT.
#
#   bash tools/gpu_check.sh PHASE...     (from the repository root; OUT defaults to ./gpu_out)
#
# PHASE:
#   setup       install the carried wheels (WHL, default ../../.whl: mne, nilearn, nibabel...)
#               into /tmp/site, build the compiled loop in place (gcc), and torchsort
#               into /tmp/site2: from a prebuilt wheel in
#               $WHL/ts/ when there is one, else built from $WHL/torchsort-0.1.10.tar.gz with
#               its CUDA extension (TORCH_CUDA_ARCH_LIST, default 9.0 = H100/H200); the
#               built wheel is copied to $OUT/ts/ for later runs.
#   tests       tests/test_cuda.py (-s: prints every measured CPU/GPU difference) and the
#               CUDA-marked tests of the other files.
#   suite       the whole test suite (dask-backed tests deselected when dask is missing).
#   smoke       every benchmark at tiny sizes on CUDA (does it run at all).
#   bench       every benchmark on CUDA then on the CPU, at the sizes given by BENCH_*
#               below (each run stopped after BENCH_TIMEOUT seconds).
#   scaling     benchmarks/bench_device.py: engine ms per step against M on both devices.
#   wb          the whole-brain part of bench_searchlight.py with chunks of 4,000 spheres,
#               on CUDA then on the CPU.
#   nulls       bench_null.py at the size of issue 10's target (100 time points, n_null
#               0, 20, 200) on CUDA then on the CPU: the cost of the permutation tests.
#   issue41     issue 41 in one go (after setup): tests/test_cuda.py (-s), then
#               benchmarks/bench_gpu_chunks.py --profile on 4,000 centres of the whole
#               brain: the torch loop checking its stops every step, every GPU_CHECK_EVERY
#               steps, with the soft ranks by the interval table at any size, and with
#               CUDA graphs (MLEM_NEURO_CUDA_GRAPHS=1), side by side, the
#               whole brain extrapolated, the maps compared, one chunk's training profiled.
#               About 5 minutes on an H200 (estimated from the 2026-11-27 figures).
# Source this script's environment in other commands with: source tools/gpu_check.sh env
set -uo pipefail

OUT=${OUT:-$PWD/gpu_out}
WHL=${WHL:-../../.whl}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:/tmp/site2:$PWD
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=python3

BENCH_ENGINE=${BENCH_ENGINE:---seq-models 8}
BENCH_TIME=${BENCH_TIME:---slow-times 4}
BENCH_SL=${BENCH_SL:---nilearn-spheres 4}
BENCH_SOFT=${BENCH_SOFT:-}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}

setup() {
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        "$WHL"/*.whl || return 1
    local wheel
    wheel=$(ls "$WHL"/ts/torchsort-*.whl 2>/dev/null | head -1)
    if [ -z "$wheel" ]; then
        echo "building torchsort with its CUDA extension (arch ${TORCH_CUDA_ARCH_LIST:-9.0})"
        local t0=$SECONDS
        TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=8 $PY -m pip wheel -q \
            --no-build-isolation --no-deps --no-index -w /tmp/tswheel \
            "$WHL"/torchsort-0.1.10.tar.gz || return 1
        echo "torchsort built in $((SECONDS - t0)) s"
        wheel=$(ls /tmp/tswheel/torchsort-*.whl | head -1)
        mkdir -p "$OUT/ts" && cp "$wheel" "$OUT/ts/"
    fi
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 \
        "$wheel" || return 1
    check_compiled
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY - <<'EOF'
import torch, torchsort, mlem_neuro
from torchsort import isotonic_cuda  # noqa: F401  (fails if the CUDA kernel was not built)
from mlem_neuro.core.ranks import grouped as tied
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), torchsort "
      f"{getattr(torchsort, '__version__', '0.1.10')} with CUDA kernel, "
      f"{torch.cuda.get_device_name(0)}, {torch.get_num_threads()} CPU threads, "
      f"mlem_neuro from {mlem_neuro.__file__}")
assert tied._pav_kernel("cuda") is not None
EOF
}

# the compiled CPU kernels (mlem_neuro/core/training/compiled.py) are numba's; its wheels
# (llvmlite alone is 60 MB) do not fit the 64 MiB carried with the others, and the GPU
# never uses them: without numba the CPU comparisons train with torch (a warning says so)
check_compiled() {
    $PY -c 'from mlem_neuro.core.training import compiled; print("numba", compiled.numba_version(), "| compiled kernels on:", compiled.built())'
}

tests() {
    $PY -m pytest -q -s -p no:cacheprovider tests/test_cuda.py 2>&1
    $PY -m pytest -q -rs -p no:cacheprovider tests/test_validation.py \
        tests/test_time_resolved.py -k "cuda" 2>&1
    # what the old float32 average ranks gave on the GPU (positions summed in float32)
    $PY - <<'EOF'
import torch
from mlem_neuro.core.ranks.spearman import rankdata
g = torch.Generator().manual_seed(0)
x = torch.randint(0, 5, (2, 200_000), generator=g).double().cuda()
s, order = torch.sort(x, dim=-1)
new = torch.ones_like(s, dtype=torch.bool)
new[:, 1:] = s[:, 1:] != s[:, :-1]
gid = torch.cumsum(new, dim=-1) - 1
pos = torch.arange(1, x.shape[1] + 1, device="cuda", dtype=torch.float32).expand_as(s)
sums = torch.zeros_like(pos).scatter_add_(1, gid, pos)
cnt = torch.zeros_like(pos).scatter_add_(1, gid, torch.ones_like(pos))
old = torch.empty_like(pos).scatter_(1, order, (sums / cnt).gather(1, gid))
print(f"MEASURED float32 average ranks (old CUDA path), 200,000 values in 5 tie groups: "
      f"max rank error {float((old.double() - rankdata(x)).abs().max()):.3g}")
EOF
}

suite() {
    local args=(-q -p no:cacheprovider --ignore tests/test_cuda.py)
    $PY -c "import dask.distributed" 2>/dev/null || args+=(-k "not dask")
    $PY -c "import xdist" 2>/dev/null && args+=(-n 8)
    OMP_NUM_THREADS=2 $PY -m pytest "${args[@]}" tests 2>&1 | tail -40
}

run_bench() {   # devices...: each benchmark on every device in turn (paired results)
    cd benchmarks || return 1
    for spec in "internals/bench_soft_rank.py $BENCH_SOFT" "bench_engine.py $BENCH_ENGINE" \
                "bench_time.py $BENCH_TIME" "bench_searchlight.py $BENCH_SL"; do
        for dev in "$@"; do
            echo "=== $dev: python benchmarks/$spec --device $dev"
            local t0=$SECONDS
            timeout "$BENCH_TIMEOUT" $PY $spec --device "$dev" 2>&1 | grep -v Warning
            echo "=== rc ${PIPESTATUS[0]}, $((SECONDS - t0)) s"
        done
    done
    cd ..
}

run_bench_one() {   # script: with $BENCH_SL on cuda then cpu
    cd benchmarks || return 1
    for dev in cuda cpu; do
        echo "=== $dev: python benchmarks/$1 $BENCH_SL --device $dev"
        local t0=$SECONDS
        timeout "$BENCH_TIMEOUT" $PY "$1" $BENCH_SL --device "$dev" 2>&1 | grep -v Warning
        echo "=== rc ${PIPESTATUS[0]}, $((SECONDS - t0)) s"
    done
    cd ..
}

smoke() {
    BENCH_SOFT="--models 8 --repeats 1" BENCH_ENGINE="--models 4 --stimuli 60 --seq-models 1" \
    BENCH_TIME="--trials 40 --channels 8 --times 4 --slow-times 1" \
    BENCH_SL="--small-steps 10 --nilearn-spheres 1 --wb-spheres 4 --wb-chunk 20" \
    BENCH_TIMEOUT=120 run_bench cuda
}

[ "${1:-}" = env ] && return 0 2>/dev/null
for phase in "$@"; do
    t0=$SECONDS
    case $phase in
        setup) setup 2>&1 | tee "$OUT/setup.log" ;;
        tests) tests 2>&1 | tee "$OUT/tests.log" ;;
        suite) suite 2>&1 | tee "$OUT/suite.log" ;;
        smoke) smoke 2>&1 | tee "$OUT/smoke.log" ;;
        bench) run_bench cuda cpu 2>&1 | tee "$OUT/bench.log" ;;
        scaling) (cd benchmarks && timeout 300 $PY bench_device.py --profile) 2>&1 \
                     | tee "$OUT/scaling.log" ;;
        nulls) BENCH_SL="--n-times 100 --n-null 20 200" BENCH_TIMEOUT=${BENCH_TIMEOUT_NULLS:-580} \
               run_bench_one bench_null.py 2>&1 | tee "$OUT/nulls.log" ;;
        wb) BENCH_SL="--skip-small --wb-chunk 4000" run_bench_one bench_searchlight.py \
                2>&1 | tee "$OUT/wb.log" ;;
        issue41) { $PY -m pytest -q -s -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -40
                   (cd benchmarks && timeout "${BENCH_TIMEOUT_41:-480}" $PY bench_gpu_chunks.py \
                        --device cuda --profile --spheres 4000 2>&1 | grep -v Warning); } \
                 | tee "$OUT/issue41.log" ;;
        *) echo "unknown phase $phase"; exit 2 ;;
    esac
    echo "### phase $phase: $((SECONDS - t0)) s"
done
# short table last
echo "### summary"
grep -h "passed\|failed\|error" "$OUT"/tests.log "$OUT"/suite.log "$OUT"/issue41.log 2>/dev/null | grep -v "^E " | tail -6
grep -h "MEASURED" "$OUT"/tests.log "$OUT"/issue41.log 2>/dev/null | sed 's/^.*MEASURED/MEASURED/' | sort -u
grep -h "^=== \|speed-up\|engine, one call\|sequential fits\|mlem_epochs (\|per-time-point\|mlem_searchlight, all\|nilearn SearchLight, all\|(a) \|(b) \|-> whole" \
    "$OUT"/bench.log "$OUT"/smoke.log "$OUT"/wb.log 2>/dev/null | cut -c1-160
cat "$OUT"/scaling.log 2>/dev/null
grep -h "^check every\|^graphs \|^table \|against every" "$OUT"/issue41.log 2>/dev/null | cut -c1-200
