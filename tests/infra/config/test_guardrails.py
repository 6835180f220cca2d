import pytest

from infra.config.guardrails import GUARDRAIL_KEYS, GuardrailConfig
from infra.errors import ConfigError


def test_defaults_are_a_safe_stack():
    config = GuardrailConfig.from_config({})
    assert config.budget_usd == 100
    assert config.budget_period == "MONTHLY"
    assert config.actual_thresholds_percent == (50, 80, 100)
    assert config.forecast_thresholds_percent == (100,)
    assert (config.idle_gpu_percent, config.idle_minutes) == (5, 30)
    assert config.max_runtime_hours is None
    assert not config.allow_budget_below_one_hour and not config.allow_no_alerts


def test_reads_pulumi_config_strings_with_or_without_prefix():
    config = GuardrailConfig.from_config(
        {
            "gpu:budgetUsd": "250",
            "budgetPeriod": "daily",
            "gpu:alertEmails": '["ml@example.com", "ops@example.org"]',
            "actualThresholdsPercent": "[25, 75]",
            "idleGpuPercent": "10",
            "idleMinutes": "45",
            "maxRuntimeHours": "8",
            "allowNoAlerts": "false",
            "allowedInstanceTypes": "p4d.24xlarge, p4de.24xlarge",
            "gpu:profile": "a100x8",  # the stack config's key: not the guardrails' business
        }
    )
    assert config.budget_usd == 250
    assert config.budget_period == "DAILY"
    assert config.alert_emails == ("ml@example.com", "ops@example.org")
    assert config.actual_thresholds_percent == (25, 75)
    assert config.idle_gpu_percent == 10
    assert config.idle_evaluation_periods == 9
    assert config.allowed_instance_types == ("p4d.24xlarge", "p4de.24xlarge")


def test_keys_are_the_camel_case_config_names():
    assert {"budgetUsd", "alertEmails", "idleGpuPercent", "idleMinutes", "maxRuntimeHours"} < (
        GUARDRAIL_KEYS
    )
    assert {"allowBudgetBelowOneHour", "allowNoAlerts", "budgetPeriod"} < GUARDRAIL_KEYS
    assert GuardrailConfig.config_keys() == GUARDRAIL_KEYS


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"budgetUsd": "-5"},
            "gpu:budgetUsd is '-5': must be more than 0; "
            "use a positive amount of US dollars per budget period, at most 1,000,000, e.g. 200",
        ),
        (
            {"alertEmails": '["ml@example.com", "bob"]'},
            "gpu:alertEmails is '[\"ml@example.com\", \"bob\"]': 'bob' is not an email address",
        ),
        ({"alertEmails": "ml@example"}, "'ml@example' is not an email address"),
        (
            {"actualThresholdsPercent": "[50, 120]"},
            "gpu:actualThresholdsPercent is '[50, 120]': 120% is above 100%",
        ),
        ({"forecastThresholdsPercent": "[0]"}, "gpu:forecastThresholdsPercent is '[0]': 0%"),
        (
            {"idleMinutes": "32"},
            "gpu:idleMinutes is '32': 32 is not a multiple of the idle alarm's 5-minute period; "
            "use a multiple of 5",
        ),
        ({"idleMinutes": "1445"}, "1445 is outside 5-1440 minutes"),
        ({"idleGpuPercent": "100"}, "gpu:idleGpuPercent is '100': must be less than 100"),
        ({"budgetPeriod": "WEEKLY"}, "gpu:budgetPeriod is 'WEEKLY'"),
        ({"maxRuntimeHours": "200"}, "200 hours is outside what a CloudWatch alarm can watch"),
        ({"maxRuntimeHours": "30.5"}, "not a whole number of the runtime alarm's 60-minute"),
        ({"maxRuntimeHours": "0.1"}, "not a whole number of the runtime alarm's 5-minute"),
        ({"allowNoAlerts": "yes"}, "gpu:allowNoAlerts is 'yes': must be true or false"),
        ({"allowedInstanceTypes": "[]"}, "an empty list would allow no instance at all"),
        ({"alertEmails": "[not json"}, "it is not a valid JSON list"),
        (
            {"actualThresholdsPercent": list(range(1, 10)), "forecastThresholdsPercent": [90, 99]},
            "ask for 11 budget notifications; AWS Budgets takes at most 10",
        ),
    ],
)
def test_bad_values_name_key_value_and_a_fix(values, message):
    with pytest.raises(ConfigError) as raised:
        GuardrailConfig.from_config(values)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_daily_budget_has_no_forecast_alert():
    # AWS Budgets makes no forecast for a daily budget.
    assert GuardrailConfig.from_config({"budgetPeriod": "DAILY"}).forecast_thresholds_percent == ()
    assert GuardrailConfig.from_config({}).forecast_thresholds_percent == (100,)
    with pytest.raises(ConfigError) as raised:
        GuardrailConfig.from_config({"budgetPeriod": "DAILY", "forecastThresholdsPercent": "[90]"})
    assert str(raised.value) == (
        "gpu:forecastThresholdsPercent is [90] but AWS Budgets makes no forecast for a DAILY "
        "budget; leave it unset or [] with gpu:budgetPeriod DAILY"
    )


def test_budget_below_one_hour_fails_unless_overridden():
    config = GuardrailConfig.from_config({"budgetUsd": "20", "alertEmails": "ml@example.com"})
    with pytest.raises(ConfigError) as raised:
        config.check_against(32.7726)
    assert str(raised.value) == (
        "gpu:budgetUsd is 20, less than one hour of this stack at $32.77/h, so the budget "
        "action would stop it within the hour; set gpu:budgetUsd to at least 33 or set "
        "gpu:allowBudgetBelowOneHour to true"
    )
    config.check_against(19.99)  # one hour fits

    overridden = GuardrailConfig.from_config(
        {"budgetUsd": "20", "alertEmails": "ml@example.com", "allowBudgetBelowOneHour": "true"}
    )
    overridden.check_against(32.7726)


def test_no_alert_address_fails_unless_overridden():
    with pytest.raises(ConfigError, match=r"^gpu:alertEmails is empty.*gpu:allowNoAlerts"):
        GuardrailConfig.from_config({"budgetUsd": "500"}).check_against(3.06)
    GuardrailConfig.from_config({"budgetUsd": "500", "allowNoAlerts": "true"}).check_against(3.06)


def test_instance_type_outside_the_allowed_list_is_refused():
    config = GuardrailConfig.from_config({"allowedInstanceTypes": '["p3.2xlarge"]'})
    config.check_instance_type("p3.2xlarge")
    with pytest.raises(ConfigError, match=r"'p4d.24xlarge' is not in gpu:allowedInstanceTypes"):
        config.check_instance_type("p4d.24xlarge")
    GuardrailConfig.from_config({}).check_instance_type("p4d.24xlarge")  # no list: any type


@pytest.mark.parametrize(
    ("hours", "window"),
    [(None, None), ("0.25", (300, 3)), ("8", (300, 96)), ("24", (300, 288)), ("72", (3600, 72))],
)
def test_runtime_window_fits_cloudwatch_limits(hours, window):
    config = GuardrailConfig.from_config({"maxRuntimeHours": hours} if hours else {})
    assert config.runtime_alarm_window == window
    if window:
        period, periods = window
        # CloudWatch: one day for periods under an hour, seven days otherwise.
        assert period * periods <= (86_400 if period < 3600 else 604_800)


@pytest.mark.parametrize(
    "email", ["you@example.com", "ops@mail.example.org", "me@team.test", "a@b.invalid"]
)
def test_a_placeholder_alert_address_is_warned_about(email):
    config = GuardrailConfig.from_config({"alertEmails": ["real@company.io", email]})
    (warning,) = config.warnings
    assert email in warning and "real@company.io" not in warning
    assert "pulumi config set --path 'gpu:alertEmails[0]'" in warning


def test_real_alert_addresses_get_no_warning():
    config = GuardrailConfig.from_config({"alertEmails": ["ml@examples.com", "x@testing.io"]})
    assert config.warnings == ()
