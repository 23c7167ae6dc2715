# Every target sets up .venv first (tools/setup_env.sh): torch (reused or torch==2.13.0),
# torchsort built against it, and this package with all its extras (MEG/EEG, fMRI,
# figures) plus the test and doc tools (numba compiles the CPU kernels on first use).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.mlem_neuro_installed

.PHONY: install test lint bench demo doc clean

$(STAMP): setup.cfg pyproject.toml tools/setup_env.sh
	PYTHON=$(PYTHON) bash tools/setup_env.sh $(VENV)
	touch $(STAMP)

install: $(STAMP)

# tests/ and the doctests of mlem_neuro/ (testpaths and --doctest-modules: pyproject.toml)
test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) benchmarks/bench_engine.py

doc: $(STAMP)
	$(PY) -m sphinx -b html -W --keep-going doc doc/_build/html
	@echo "Documentation: doc/_build/html/index.html"

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache

demo: $(STAMP)
	$(VENV)/bin/mlem-neuro demo --out mlem_demo --overwrite
