import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "image: builds the cpu image with buildah and trains inside it (root only, ~10 min)",
    )
