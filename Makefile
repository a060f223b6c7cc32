# gpuvet — developer entry points. Each target installs what it needs.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch 2.13.0 is the CPU build for development machines; GPU nodes bring their own.
TORCH   ?= torch==2.13.0

RUNSTAMP := $(VENV)/.installed-run
# The suite runs on pytest-xdist workers, each with its own sshd cluster. Whole files
# are handed out in collection order (the long integration and fault files first, the
# short unit files fill in), so module fixtures (a Ray head, stores) are built once.
# Measured on a 2-core machine in docs/benchmarks.md (Test suite); TEST_WORKERS=0
# runs the suite in one process, as before.
TEST_WORKERS ?= 4
PYTEST  := $(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=15 \
           --no-loadscope-reorder

.PHONY: setup setup-run demo test unit integration lint typecheck bench mutation clean

# What `gpuvet` itself needs (and torch for the demo's local training nodes).
setup-run: $(RUNSTAMP)

$(RUNSTAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)" -e .
	touch $(RUNSTAMP)

# Development: the above plus test, lint and type-check tools and the Ray backend.
setup: $(STAMP)

$(STAMP): $(RUNSTAMP)
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	touch $(STAMP)

# The quick start on two offers simulated on this machine (inventories/demo.yaml, one
# local node each): the pipeline with the CPU training step (suites/train-cpu.yaml: the
# tiny model, checkpoint, SIGKILL, restore verified bit for bit), then compare and report
# of the two under that one suite. The nodes' python3 is the venv's (torch). Exit code 1
# from pipeline/compare means "a check FAILed" / "a provider is NO-GO" (on a machine
# without GPUs: no NVIDIA driver), which is a result, not an error; 2 and 3 still stop
# the demo. Runs again as often as wanted: each run adds one pipeline run to results/.
DEMO_INV   := inventories/demo.yaml
DEMO_SUITE := suites/train-cpu.yaml
DEMO_ENV   := PATH="$(CURDIR)/$(BIN):$$PATH"
demo: setup-run
	$(BIN)/gpuvet inventory check $(DEMO_INV)
	$(DEMO_ENV) $(BIN)/gpuvet ping -i $(DEMO_INV)
	mkdir -p /tmp/gpuvet-demo/sim-a/ckpt /tmp/gpuvet-demo/sim-b/ckpt
	$(DEMO_ENV) $(BIN)/gpuvet pipeline -i $(DEMO_INV) --suite $(DEMO_SUITE) || test $$? -eq 1
	@echo "--- both offers measured under one suite: side by side, with a verdict each"
	$(BIN)/gpuvet compare -p offer-a -p offer-b || test $$? -eq 1
	$(BIN)/gpuvet report -p offer-a -p offer-b -o results/demo-report.html
	@echo "--- nccl-tests logs of a real 2 x H200 host (tests/fixtures/h200x2), imported as"
	@echo "--- provider h200-capture: what all_reduce measures on GPUs (its own suite: shown, not compared)"
	$(BIN)/gpuvet import nccl-tests -p h200-capture \
	  tests/fixtures/h200x2/nccl-tests/all_reduce_8B-128M_g2_round1.log \
	  tests/fixtures/h200x2/nccl-tests/all_reduce_8B-128M_g2_round2.log \
	  tests/fixtures/h200x2/nccl-tests/all_reduce_8B-128M_g2_round3.log
	@echo "--- the report: results/demo-report.html (and .md); every run: .venv/bin/gpuvet runs"
	@echo "--- next, your own two nodes (README, Quick start): cp inventories/example-two-providers.yaml my-nodes.yaml"

# The integration tests need root, network namespaces and openssh-server;
# scripts/test-deps.sh installs the system packages when they are missing.
test: setup
	scripts/test-deps.sh
	$(PYTEST) -q

unit: setup
	$(PYTEST) -q tests/unit

integration: setup
	scripts/test-deps.sh
	$(PYTEST) -q tests/integration

lint: setup
	$(BIN)/ruff check orchestrator payload tests scripts

typecheck: setup
	$(BIN)/mypy

bench: setup
	scripts/test-deps.sh
	$(BIN)/python -m tests.bench.preflight_bench --out docs/benchmarks.md
	$(BIN)/python -m tests.bench.fleet_bench --out docs/benchmarks.md
	$(BIN)/python -m tests.bench.compare_bench --out docs/benchmarks.md
	$(BIN)/python -m tests.bench.regress_bench --out docs/benchmarks.md
	$(BIN)/python -m tests.bench.import_bench --out docs/benchmarks.md

# Mutation testing of the judging modules (mutmut, in a temporary clone of HEAD;
# minutes per module, not part of `make test`); scores go to docs/reliability.md.
# make mutation MODULES="orchestrator/analysis/regress.py ..." for some modules only
mutation: setup
	scripts/mutation.sh $(MODULES)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
