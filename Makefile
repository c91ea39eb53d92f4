# Two commands for a new user: `make demo` and `make test`. Both set up .venv when missing.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit venv clean

# The venv is rebuilt only when pyproject.toml is newer than the last install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

# The demo's storage (runs/demo) is started afresh each time, so every run shows the incident.
demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/supervisor launch examples/tinylm/job.yaml

lint: $(STAMP)
	$(BIN)/ruff check supervisor tests bench examples
	$(BIN)/ruff format --check supervisor tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy supervisor

unit: $(STAMP)
	$(BIN)/python -m pytest -q

# mypy (about 95 s of one core from a cold cache) runs beside pytest, whose Ray end-to-end tests
# leave a core idle about half the time; -Oline keeps each output line whole.
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 -Oline lint typecheck unit

clean:
	rm -rf $(VENV)
