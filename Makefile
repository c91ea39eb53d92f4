# Two commands for a new user: `make demo` and `make test`. Both set up .venv when missing.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bytecode lint typecheck unit unit-fast unit-slow venv clean

# The venv is rebuilt only when pyproject.toml is newer than the last install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

# Bytecode for the package, the examples and the benches, written once per change here: where
# PYTHONDONTWRITEBYTECODE is set (CI machines) every process the tests start (ranks, supervisor
# actors, CLI runs) would otherwise compile what it imports again (~0.4 CPU-s per rank).
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 supervisor examples bench >/dev/null

# The demo's storage (runs/demo) is started afresh each time, so every run shows the incident.
demo: bytecode
	rm -rf runs/demo
	$(BIN)/supervisor launch examples/tinylm/job.yaml

lint: $(STAMP)
	$(BIN)/ruff check supervisor tests bench examples
	$(BIN)/ruff format --check supervisor tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy supervisor

unit: unit-fast unit-slow

# The two halves of pytest can run side by side (make -j): the fast tests are single-process
# Python and start no Ray; the slow ones (Ray, torch.distributed, subprocess end-to-end runs) run
# one at a time as always. The fast half gets a Ray temp folder of its own, so a Ray that a slow
# test started (e.g. `launch --detach`'s `ray start --head`) is never found by `address: auto`;
# its report is printed in one piece when it ends (the slow half's progress stays live).
FAST_LOG := .pytest_cache/fast.log
unit-fast: $(STAMP)
	@mkdir -p .pytest_cache; ray_tmp=$$(mktemp -d /tmp/svfast.XXXXXX); \
	RAY_TMPDIR=$$ray_tmp $(BIN)/python -m pytest -q -m "not slow" -o cache_dir=.pytest_cache/fast \
		>$(FAST_LOG) 2>&1; rc=$$?; rm -rf $$ray_tmp; \
	echo "== fast tests (pytest -m 'not slow') =="; cat $(FAST_LOG); exit $$rc

# The slow half gets a Ray temp folder of its own too, holding the address of a `ray start` head
# that is gone (as on a machine where someone ran `ray start` and its head died): every test's
# Ray must be one it starts itself (address "local"), whatever the machine's /tmp/ray holds.
unit-slow: $(STAMP)
	@ray_tmp=$$(mktemp -d /tmp/svslow.XXXXXX); mkdir -p $$ray_tmp/ray; \
	echo 127.0.0.1:9 >$$ray_tmp/ray/ray_current_cluster; \
	RAY_TMPDIR=$$ray_tmp $(BIN)/python -m pytest -q -m slow -o cache_dir=.pytest_cache/slow --durations=12; \
	rc=$$?; rm -rf $$ray_tmp; exit $$rc

# On 2 cores: mypy (about 95 s of one core from a cold cache) and the fast tests (one core) run
# beside the slow tests, whose Ray end-to-end runs leave a core idle much of the time.
test: bytecode
	$(MAKE) --no-print-directory -j3 lint typecheck unit-fast unit-slow

clean:
	rm -rf $(VENV)
