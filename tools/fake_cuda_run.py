"""Run a script on the emulated CUDA device of ``tests/fake_cuda.py`` (no GPU needed).

    OMP_NUM_THREADS=1 PYTHONPATH=. python tools/fake_cuda_run.py \
        benchmarks/bench_engine.py --models 4 --stimuli 60 --seq-models 1 --device cuda

Checks that a benchmark's ``--device cuda`` path runs (device errors raise as on a GPU);
its timings are CPU timings and mean nothing for a GPU.
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fake_cuda import fake_cuda  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(script))
    with fake_cuda():
        runpy.run_path(script, run_name="__main__")
