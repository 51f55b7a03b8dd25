# depthscope: set-up, run, test, lint, bench. Every target creates the virtual environment
# when it is missing. torch==2.13.0 is installed before the project: with no torch present,
# the project's torch range would otherwise pull a multi-GB CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: two share the machine's two cores (most of the suite
# waits on the services, runners and Ray clusters it starts); TEST_WORKERS=0 runs the suite
# in one process.
TEST_WORKERS ?= 2

.PHONY: setup chromium demo cost-demo test test-fast lint typecheck bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed chromium

# The dashboard's browser tests drive the system's headless Chromium (Debian's chromium and
# chromium-driver; Playwright, from the dev extra, never downloads a browser). Installed only
# when missing, and only as root or with sudo; otherwise a warning (the tests then fail,
# saying so, rather than skip).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
	  else echo "make setup: chromium is missing and installing it needs root or sudo;" \
	    "run: apt-get install chromium chromium-driver" >&2; exit 0; fi; \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make setup: chromium is missing and there is no apt-get to install it" >&2; exit 0; fi; \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y \
	    --no-install-recommends chromium chromium-driver; }

# The main job, end to end on embedded defaults (SQLite file, local Ray, built-in corpus):
# start the service, submit examples/quick.yaml, follow it, print the Pareto front and the
# d_model/L optimum per variant, write the plots to out/.
demo: setup
	$(PY) -m nas_service.demo --spec examples/quick.yaml --out out

# Every residual variant priced side by side with the analytic cost model.
cost-demo: setup
	$(VENV)/bin/depthscope cost --n-layers 16 --d-model 1024 --n-heads 16 --seq-len 4096 \
		--dtype bfloat16 --variant baseline,full_attnres,block_attnres,mhc_lite,denseformer \
		--block-size 8 --tp 2 --pp 4 --vpp 2 --microbatches 16 --hardware h100

# The whole suite but GPU-only tests (on TEST_WORKERS workers, each test given to whichever
# is free: `worksteal`). pytest's exit code 5 (nothing collected) is a failure.
test: setup
	@$(PY) -m pytest -m "not gpu" -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

test-fast: setup
	$(PY) -m pytest -m "not gpu and not slow" $(PYTEST_ARGS)

# ruff, and the import layers of pyproject.toml's [tool.importlinter] (every import counts,
# those inside functions and under TYPE_CHECKING too).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: setup
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/cost_model.py
	$(PY) bench/variants.py
	$(PY) bench/trainer.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
