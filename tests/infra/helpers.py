"""Modified copies of the real data files, for tests of bad or unusual data."""

import shutil
from pathlib import Path

from infra.catalog import CATALOG_DIR


def modified_catalog(tmp_path: Path, file: str, old: str, new: str) -> Path:
    """A copy of the real catalog with the first `old` in `file` replaced by `new`."""
    for name in ("instances.toml", "amis.toml"):
        shutil.copy(CATALOG_DIR / name, tmp_path / name)
    text = (tmp_path / file).read_text()
    assert old in text, f"test fixture out of date: {old!r} not in {file}"
    (tmp_path / file).write_text(text.replace(old, new, 1))
    return tmp_path
