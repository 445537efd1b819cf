# The two commands README.md opens with. Each installs what it needs (scripts/bootstrap.sh is
# idempotent) and then does its job.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: bench test setup tools lint

setup:
	bash scripts/bootstrap.sh

tools: setup
	bash scripts/install-tools.sh

# The main job: the default CPU matrix (every strategy at world sizes 1 and 2, tiny preset) on
# this machine, then metrics.csv, plots and BENCHMARK_REPORT.md under reports/default (written
# even when some run failed; the exit code is then 1).
# BENCH_ARGS passes more flags, e.g. `make bench BENCH_ARGS=--rerun-flagged` re-measures the
# configurations the report flags, `BENCH_ARGS="--force RUN_ID"` one run.
BENCH_ARGS ?=
bench: setup
	PYTHONWARNINGS=ignore::FutureWarning $(VENV)/bin/shardbench run --report reports/default $(BENCH_ARGS)

# The linter and the type checker over the package (settings in pyproject.toml): zero errors.
lint: setup
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy

# pytest in two sessions, each on two xdist workers: the fast subset (single-process tests), then
# the slow one (multi-rank runs, fault tests waiting on detection) with each file on one worker
# (--dist loadfile: a module's fixture of real runs runs once, not once per worker).
# Both always run; the target fails when either did.
test: tools lint
	PYTHONWARNINGS=ignore::FutureWarning $(PY) -m pytest -q -n 2 -m "not slow"; fast=$$?; \
	PYTHONWARNINGS=ignore::FutureWarning $(PY) -m pytest -q -n 2 --dist loadfile -m slow; slow=$$?; \
	test $$fast -eq 0 && test $$slow -eq 0
