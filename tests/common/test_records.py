"""The shared data-file loader: each problem is one line naming the file and the entry."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import field_validator

from common.records import DataFile, matching, record


class DataError(ValueError):
    pass


@record
class Part:
    name: str
    size: int

    _short = field_validator("name")(matching(r"[a-z]+", "must be lower-case letters"))


def data_file(tmp_path, text: str, keys=frozenset({"part", "default"})) -> DataFile:
    path = tmp_path / "parts.toml"
    path.write_text(text)
    return DataFile.read(path, set(keys), DataError)


def test_named_tables_become_records_named_by_their_table(tmp_path):
    file = data_file(tmp_path, "[part.bolt]\nsize = 3\n[part.nut]\nsize = 1\n")
    parts = file.tables(Part, "part", name_field="name", header="part.NAME")
    assert parts == {"bolt": Part(name="bolt", size=3), "nut": Part(name="nut", size=1)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        parts["bolt"].size = 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 1\n", "parts.toml: unknown key 'colour' (known keys: default, part)"),
        ("part = 3\n", "parts.toml: 'part' must be tables [part.NAME]"),
        ("default = 'bolt'\n", "parts.toml: no [part.NAME] tables"),
        (
            "[part.bolt]\nname = 'nut'\nsize = 3\n",
            "parts.toml: part 'bolt', field 'name': set by the table name, remove it",
        ),
        (
            "[part.bolt]\nsize = 3\ncolor = 'red'\n",
            "parts.toml: part 'bolt', field 'color': unknown key (known keys: name, size)",
        ),
        ("[part.bolt]\n", "parts.toml: part 'bolt', field 'size': required but missing"),
        (
            "[part.BOLT]\nsize = 3\n",
            "parts.toml: part 'BOLT', field 'name' is 'BOLT': must be lower-case letters",
        ),
        ("[part]\nbolt = 3\n", "parts.toml: part 'bolt': expected a table, got int 3"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_entry(tmp_path, text, message):
    with pytest.raises(DataError) as caught:
        data_file(tmp_path, text).tables(Part, "part", name_field="name", header="part.NAME")
    assert str(caught.value) == message


def test_a_single_table_is_named_by_its_header(tmp_path):
    file = data_file(tmp_path, "[default]\nname = 'bolt'\nsize = 'big'\n")
    with pytest.raises(DataError) as caught:
        file.table(Part, "default")
    assert str(caught.value).startswith("parts.toml: [default], field 'size' is 'big': ")


def test_a_missing_or_malformed_file_is_one_line(tmp_path):
    with pytest.raises(DataError, match=r"parts\.toml: file not found$"):
        DataFile.read(tmp_path / "parts.toml", {"part"}, DataError)
    (tmp_path / "parts.toml").write_text("[part\n")
    with pytest.raises(DataError, match=r"parts\.toml: not valid TOML: "):
        DataFile.read(tmp_path / "parts.toml", {"part"}, DataError)
