"""common.errors: the one ConfigError, and the one sentence pydantic-checked input fails with."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.errors import describe, first_problem


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(1, ge=1)


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    rate: float = Field(0.5, gt=0.0, lt=1.0)
    train: Inner = Inner()

    @model_validator(mode="after")
    def _across(self) -> Outer:
        if self.name == "both":
            raise ValueError("Name and rate disagree")
        return self


def error_of(data: dict) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Outer.model_validate(data)
    return caught.value


def test_a_misspelt_key_is_reported_before_the_missing_one_it_causes():
    error = error_of({"nmae": "x"})
    assert first_problem(error).kind == "unknown"
    assert describe(error, known=lambda problem: "name, rate, train") == (
        "nmae: unknown key (known keys: name, rate, train)"
    )


def test_missing_key():
    assert describe(error_of({})) == "name: required but missing"


@pytest.mark.parametrize(
    ("data", "sentence"),
    [
        ({"name": "x", "rate": 0.0}, "rate is 0.0: must be more than 0"),
        ({"name": "x", "rate": 1.5}, "rate is 1.5: must be less than 1"),
        ({"name": "x", "train": {"steps": 0}}, "train.steps is 0: must be at least 1"),
    ],
)
def test_bounds_read_as_words(data, sentence):
    assert describe(error_of(data)) == sentence


def test_key_name_raw_value_and_hint():
    error = error_of({"name": "x", "rate": "2"})
    sentence = describe(
        error,
        name=lambda key: f"gpu:{key}",
        raw={"rate": "2 (as typed)"},
        hint=lambda key: "a fraction, e.g. 0.5" if key == "rate" else None,
    )
    assert sentence == "gpu:rate is '2 (as typed)': must be less than 1; use a fraction, e.g. 0.5"


def test_a_check_across_keys_speaks_for_itself():
    assert describe(error_of({"name": "both"})) == "Name and rate disagree"


def test_the_stack_and_the_trainer_raise_one_config_error(tmp_path):
    """A command that catches infra's ConfigError also catches the trainer's (one class)."""
    from infra.errors import ConfigError as StackConfigError
    from training.spec.config import load_config

    with pytest.raises(StackConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.toml"), [])
