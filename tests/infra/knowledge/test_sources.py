"""Every fact in the catalog names a public source a reader can open, not a private note."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
DATA = REPO_ROOT / "infra" / "knowledge" / "data"


_TEXT = (".py", ".toml", ".md", ".sh", ".service", ".yaml", ".json")


@pytest.mark.parametrize(
    "path",
    sorted(
        path
        for folder in ("infra", "policy")
        for path in (REPO_ROOT / folder).rglob("*.*")
        if path.suffix in _TEXT
    ),
    ids=lambda path: str(path.relative_to(REPO_ROOT)),
)
def test_no_citation_of_a_notes_folder(path):
    assert not re.search(r"\breference/\w+\.md", path.read_text()), path


# An address, or a publisher's document named by its title (AWS, NVIDIA, SkyPilot), or a figure
# the entry says it derived or estimated.
_PUBLIC_SOURCE = re.compile(
    r"https?://|\b[\w-]+\.(com|org|net|io)/|AWS|EC2|DLAMI|NVIDIA|SkyPilot|Amazon|estimate|derived"
)


def _sources(table: dict) -> list[str]:
    found = []
    for key, value in table.items():
        if key == "sources" and isinstance(value, dict):
            found += [str(text) for text in value.values()]
        elif isinstance(value, dict):
            found += _sources(value)
    return found


@pytest.mark.parametrize("name", ["instances.toml", "amis.toml", "allreduce.toml"])
def test_each_source_names_a_document_or_an_address(name):
    sources = _sources(tomllib.loads((DATA / name).read_text()))
    assert sources
    for text in sources:
        assert _PUBLIC_SOURCE.search(text), text
