# Two entry points for a newcomer: `make demo` runs the main job locally,
# `make test` runs the test suite. Both prepare .venv on first use.
.PHONY: demo test lint bootstrap

bootstrap:
	scripts/bootstrap

demo: bootstrap
	.venv/bin/python -m infra plan a100x8 --resources
	.venv/bin/python -m training

test: bootstrap lint
	.venv/bin/python -m pytest

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
