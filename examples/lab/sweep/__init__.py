"""A job's own code, shipped with `python -m infra run ... --code examples/lab` (README)."""
