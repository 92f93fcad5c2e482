# dataflex-rl. `make help` lists the targets. The first target that needs Python creates .venv and installs
# everything (torch 2.13.0 CPU first, so pip never pulls a CUDA build), so each target works on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Sweep variables (all optional): make sweep ALPHA=0.0,0.25,0.5 SEEDS=1,2 JOBS=2 STEPS=200 SWEEP=name
# `make help` lists the "#>" lines below; a default they state is checked against the sweep schema (sweeps/sweep_config.py).
#> EXPERIMENT a named experiment, e.g. kk (Knights and Knaves: GRPO, AR 0.2/0.5, Lopti x 8 seeds; docs/knights_knaves.md), long_addition (docs/long_addition.md)
#> ALPHA     alpha values, e.g. 0.0,0.25,0.5; 0 is always added; with MECH each preset's own alpha (default 0.0,0.5)
#> SEEDS     seeds (default 1,2,3,4,5,6,7,8)
#> MECH      mechanism presets as an axis, e.g. ar,lopti,high_entropy,stapo,ar_sigmoid (conf/dataflex/; the baseline is added)
#> ETA       eta values as an axis (presets whose actuator has an eta)
#> STEPS     RL steps per run; make train: the trainer's own (default 120 on the local backend)
#> WARM_START per_seed: each seed's runs start from the SFT warm start of sft.seed = seed, so intervals include the warm start's draw | shared: one warm start for every run (default per_seed)
#> JOBS      runs at once (default: the core count; 1 in verl's CPU mode, whose runs each start a Ray cluster on every core)
#> SWEEP     sweep name: folder runs/<SWEEP> (default: a hash of the grid); report and notebook read it
#> BACKEND   a backend, conf/backend/<name>.yaml; docs/verl.md runs verl on GPUs or a laptop (default local)
#> VERL_EXPERIMENT BACKEND=verl: conf/verl_experiment/<name>.yaml; verl_cpu_tiny: verl's CPU mode (default verl_kk_3b)
#> LAUNCHER  process (child processes here) | slurm (submitit job array; a job asks slurm.cpus_per_task=8 CPUs, slurm.mem_gb=4 GB: a local run peaks at 0.7 GB, so runs share a node) | ray (Ray Jobs) (default process)
#> SWEEP_ARGS more sweep-driver keys (conf/sweeps/), e.g. SWEEP_ARGS="slurm.partition=gpu threads=2"
#> DRY_RUN   DRY_RUN=1 prints every command line and starts nothing
#> EXTRA     training overrides for every run, e.g. EXTRA="task=knights_knaves trainer.lr=3e-4"
#> ARGS      make train: Hydra overrides of one run
#> RESULTS   make docs-results: write docs/results/<RESULTS>.md from runs/<SWEEP> and the docs blocks that show it
EXPERIMENT ?=
ALPHA ?=
SEEDS ?=
BACKEND ?=
VERL_EXPERIMENT ?=
LAUNCHER ?=
JOBS ?=
STEPS ?=
SWEEP ?=
MECH ?=
ETA ?=
EXTRA ?=
DRY_RUN ?=
SWEEP_ARGS ?=
WARM_START ?=
RESULTS ?=
# Seeds planned for a target precision: make sweep TARGET_MDE=0.01 MAX_SEEDS=20 (SEEDS is the pilot)
TARGET_MDE ?=
MAX_SEEDS ?=
# make tune: LR=1 searches trainer.lr too (alpha only by default)
LR ?=

.DEFAULT_GOAL := help

.PHONY: help install test test-full bench sweep tune report docs-results notebook train clean

help: ## List the targets and variables
	@echo "Targets:"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-11s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Variables (make sweep ALPHA=0.0,0.5 SEEDS=1,2,3 ...):"
	@awk '/^#> / {name = $$2; sub(/^#> [A-Z_]+ +/, ""); printf "  \033[36m%-11s\033[0m %s\n", name, $$0}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install the project with its pinned stack (done by every target)

# One pytest worker per core, each test module on one worker (its module-scoped fixtures built once), modules in
# collection order (tests/conftest.py puts the longest first; xdist would otherwise start the biggest modules first).
PYTEST_WORKERS := -n auto --dist loadscope --no-loadscope-reorder

test: $(STAMP) ## Fast test tier (under 10 minutes on 2 cores)
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider $(PYTEST_WORKERS)

test-full: $(STAMP) ## Every test, including the long real runs
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS)

bench: $(STAMP) ## Benchmarks: ratios measured side by side in one run
	$(PY) -m benchmarks

# Every variable reaches its command as data, never as shell text: exported as DATAFLEX_MAKE_<NAME> with its raw
# value ($(value): make expands nothing in it either), read by sweeps/make.py, which prints the command it runs and
# execs it with the values as separate arguments. Keep this list equal to sweeps.make.VARIABLES.
MAKE_VARIABLES := ALPHA SEEDS MECH ETA STEPS JOBS SWEEP BACKEND LAUNCHER SWEEP_ARGS DRY_RUN EXTRA TARGET_MDE \
	MAX_SEEDS LR ARGS VERL_EXPERIMENT EXPERIMENT WARM_START RESULTS
$(foreach name,$(MAKE_VARIABLES),$(eval export DATAFLEX_MAKE_$(name) := $$(value $(name))))
unexport $(MAKE_VARIABLES)  # make would otherwise expand each one given on the command line into the environment

sweep: $(STAMP) ## Run an alpha x seed sweep, then write its report (ALPHA, SEEDS, JOBS, STEPS, SWEEP, EXTRA)
	$(PY) -m sweeps.make sweep

tune: $(STAMP) ## Optuna search over alpha, ~13 min (LR=1 adds trainer.lr; DRY_RUN=1 prints commands and estimate)
	$(PY) -m sweeps.make tune

report: $(STAMP) ## Write runs/<SWEEP>/report/ (tables and plots) for a finished sweep (default: the newest sweep)
	$(PY) -m sweeps.make report

docs-results: $(STAMP) ## Write docs/results/<RESULTS>.md from sweep SWEEP and update the docs blocks that show it
	$(PY) -m sweeps.make docs-results

notebook: $(STAMP) ## Open notebooks/alpha_sweep.ipynb in JupyterLab on the last sweep (or SWEEP=name)
	@$(PY) -c "import jupyterlab" 2>/dev/null || $(PY) -m pip install -q -e '.[notebook]'
	sweep_dir="$$($(PY) -m sweeps.make notebook-dir)" \
		&& echo "notebook on $$sweep_dir" && DATAFLEX_SWEEP_DIR="$$sweep_dir" $(PY) -m jupyterlab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/alpha_sweep.ipynb

train: $(STAMP) ## One training run on the local CPU backend (ARGS="hydra overrides")
	$(PY) -m sweeps.make train

clean: ## Remove the virtualenv and caches (keeps runs/)
	rm -rf $(VENV) .pytest_cache .hypothesis
