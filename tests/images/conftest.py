"""Fixtures of the image tests: a local registry (tests/images/registry.py)."""

from tests.images.registry import registry  # noqa: F401
