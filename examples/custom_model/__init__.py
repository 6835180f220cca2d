"""Your own model and dataset, trained by `python -m training` without editing the package.

Run from the repository root:

    python -m training --config examples/custom_model/config.toml
"""
