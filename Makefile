# Two entry points for a newcomer: `make demo` runs the main job locally,
# `make test` runs the test suite. Both prepare .venv on first use.
# `make test-fast` is the inner loop: every test that needs no Slurm cluster, no image
# build and no training processes.
.PHONY: demo test test-fast lint bootstrap bootstrap-demo

# Parallel test workers (pytest-xdist). Tests that share the loopback Slurm cluster, the
# image build or a module's fixture stay together on one worker (--dist loadgroup), handed
# out longest first in the order tests/support/suite_time.py gives them, not by test count.
# The whole suite waits on Slurm jobs and the image build: four workers keep 2 cores busier
# (24 min against 28 with three, fresh clone). The fast set is bound by CPU: three.
TEST_WORKERS ?= 4
TEST_FAST_WORKERS ?= 3
PYTEST = .venv/bin/python -m pytest --dist loadgroup --no-loadscope-reorder

# The demo needs the Python environment only; the tests also need test-only tools
# (Slurm, munge, buildah, ...: scripts/bootstrap lists them).
bootstrap:
	scripts/bootstrap

bootstrap-demo:
	scripts/bootstrap --demo

# The DeepSpeed op bootstrap compiled: the demo's first step does not wait for a build.
demo: bootstrap-demo
	.venv/bin/python -m infra plan a100x8 --resources
	TORCH_EXTENSIONS_DIR=$(CURDIR)/.venv/torch_extensions .venv/bin/python -m training

test: bootstrap lint
	$(PYTEST) -n $(TEST_WORKERS)

test-fast: bootstrap lint
	$(PYTEST) -n $(TEST_FAST_WORKERS) -m "not slurm and not image and not multiprocess"

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
