"""A `gpu:` switch reads the same in every model: true or false, nothing guessed."""

from __future__ import annotations

import pytest

from infra.config.guardrails import GuardrailConfig
from infra.config.schema import load_stack_config
from infra.errors import ConfigError
from tests.support.stack_runs import BASE_CONFIG


@pytest.mark.parametrize(("text", "value"), [("true", True), ("FALSE", False), (" True ", True)])
def test_a_switch_takes_true_or_false_in_any_case(text, value):
    assert load_stack_config({**BASE_CONFIG, "spot": text}).spot is value
    assert GuardrailConfig.from_config({"allowNoAlerts": text}).allow_no_alerts is value


@pytest.mark.parametrize("text", ["yes", "1", "on", ""])
def test_a_guess_is_refused_with_one_sentence_in_both_models(text):
    with pytest.raises(ConfigError) as stack:
        load_stack_config({**BASE_CONFIG, "useDefaultVpc": text})
    with pytest.raises(ConfigError) as guardrail:
        GuardrailConfig.from_config({"allowBudgetBelowOneHour": text})
    assert str(stack.value) == f"gpu:useDefaultVpc is {text!r}: must be true or false"
    assert str(guardrail.value).startswith(
        f"gpu:allowBudgetBelowOneHour is {text!r}: must be true or false"
    )
