"""Guardrail settings: the `gpu:` config keys for the budget, alerts, idle stop and maximum runtime.

Checked before any resource exists, so a bad value fails `pulumi preview` with one sentence that
names the key, the value, and what would work (infra.errors.ConfigError).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from common.errors import describe
from infra.config.values import ConfigBool
from infra.errors import ConfigError

CONFIG_NAMESPACE = "gpu"

# The idle alarm looks at GPU use in 5-minute periods. The agent publishes every minute, so each
# period holds five samples: one late or lost sample does not leave a period empty (and an empty
# period counts as not idle, see the alarm).
IDLE_PERIOD_SECONDS = 300
MAX_IDLE_MINUTES = 1440  # CloudWatch: periods under an hour may span at most one day

# The runtime alarm counts EC2's own CPUUtilization datapoints (basic monitoring: one per 5
# minutes). CloudWatch caps an alarm's window at one day for periods under an hour and at seven
# days for hourly periods, so longer limits switch to hourly periods.
RUNTIME_SHORT_PERIOD_SECONDS = 300
RUNTIME_LONG_PERIOD_SECONDS = 3600
MAX_RUNTIME_HOURS_SHORT_PERIODS = 24
MAX_RUNTIME_HOURS = 168

# AWS Budgets: a notification takes one SNS topic and at most 10 email subscribers; a budget
# takes at most 10 notifications (Budgets API reference, NotificationWithSubscribers).
MAX_ALERT_EMAILS = 10
MAX_NOTIFICATIONS = 10

# Domains reserved for documentation (RFC 2606, RFC 6761): the example stack files use one.
_PLACEHOLDER_DOMAIN = re.compile(
    r"(^|\.)(example\.(com|net|org)|example|test|invalid|localhost)$", re.IGNORECASE
)


def _is_placeholder(email: str) -> bool:
    return bool(_PLACEHOLDER_DOMAIN.search(email.rpartition("@")[2]))


_EMAIL = re.compile(r"^[^@\s,;]+@[^@\s,;]+\.[A-Za-z]{2,}$")


def _list_from_config(value: Any) -> Any:
    """Pulumi config hands structured values over as JSON text; accept "a, b" too."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("it is not a valid JSON list") from None
    return [part.strip() for part in text.split(",") if part.strip()]


def _upper(value: Any) -> Any:
    return value.strip().upper() if isinstance(value, str) else value


def _none_if_blank(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


ConfigList = BeforeValidator(_list_from_config)

# The largest budget a stack file may set: a guard against a typo (1e12), far above what a
# team spends on GPUs in one period.
MAX_BUDGET_USD = 1_000_000


class GuardrailConfig(pydantic.BaseModel):
    """What the stack may spend and when its instances stop. Defaults give a safe stack."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
    )

    budget_usd: float = Field(
        default=100.0,
        gt=0,
        le=MAX_BUDGET_USD,
        allow_inf_nan=False,
        description=f"a positive amount of US dollars per budget period, at most "
        f"{MAX_BUDGET_USD:,}, e.g. 200",
    )
    budget_period: Annotated[Literal["MONTHLY", "DAILY"], BeforeValidator(_upper)] = Field(
        default="MONTHLY", description="MONTHLY or DAILY"
    )
    alert_emails: Annotated[tuple[str, ...], ConfigList] = Field(
        default=(),
        description=f'a list of up to {MAX_ALERT_EMAILS} email addresses, e.g. ["you@example.com"]',
        json_schema_extra={"default_text": "none: required unless `gpu:allowNoAlerts`"},
    )
    actual_thresholds_percent: Annotated[tuple[float, ...], ConfigList] = Field(
        default=(50.0, 80.0, 100.0),
        description="percentages of the budget, above 0 and up to 100, e.g. [50, 80]",
    )
    forecast_thresholds_percent: Annotated[tuple[float, ...], ConfigList] = Field(
        default=(100.0,),
        description="percentages of the budget, above 0 and up to 100, e.g. [100]",
        json_schema_extra={"default_text": "`[100]`, none for a DAILY budget"},
    )
    idle_gpu_percent: float = Field(
        default=5.0, gt=0, lt=100, description="a percentage above 0 and below 100, e.g. 5"
    )
    idle_minutes: int = Field(
        default=30,
        description=f"a multiple of {IDLE_PERIOD_SECONDS // 60} from {IDLE_PERIOD_SECONDS // 60} "
        f"to {MAX_IDLE_MINUTES}, e.g. 30",
    )
    max_runtime_hours: Annotated[float | None, BeforeValidator(_none_if_blank)] = Field(
        default=None,
        description=(
            f"hours up to {MAX_RUNTIME_HOURS}: steps of {RUNTIME_SHORT_PERIOD_SECONDS // 60} "
            f"minutes up to {MAX_RUNTIME_HOURS_SHORT_PERIODS} h (e.g. 8 or 0.25), whole hours "
            "beyond (e.g. 72)"
        ),
    )
    allow_budget_below_one_hour: ConfigBool = Field(default=False, description="true or false")
    allow_no_alerts: ConfigBool = Field(default=False, description="true or false")
    allowed_instance_types: Annotated[tuple[str, ...] | None, ConfigList] = Field(
        default=None,
        description='a list of EC2 instance types, e.g. ["p4d.24xlarge"]',
        json_schema_extra={"default_text": "any"},
    )

    @field_validator("alert_emails")
    @classmethod
    def _emails(cls, emails: tuple[str, ...]) -> tuple[str, ...]:
        for email in emails:
            if not _EMAIL.match(email):
                raise ValueError(f"{email!r} is not an email address")
        if len(set(emails)) != len(emails):
            raise ValueError("it names an address twice")
        if len(emails) > MAX_ALERT_EMAILS:
            raise ValueError(f"AWS Budgets notifies at most {MAX_ALERT_EMAILS} addresses")
        return emails

    @field_validator("actual_thresholds_percent", "forecast_thresholds_percent")
    @classmethod
    def _thresholds(cls, thresholds: tuple[float, ...]) -> tuple[float, ...]:
        for threshold in thresholds:
            if threshold > 100:
                raise ValueError(f"{threshold:g}% is above 100%")
            if threshold <= 0:
                raise ValueError(f"{threshold:g}% is not above 0%")
        if len(set(thresholds)) != len(thresholds):
            raise ValueError("it repeats a threshold")
        return thresholds

    @field_validator("idle_minutes")
    @classmethod
    def _idle_minutes(cls, minutes: int) -> int:
        period_minutes = IDLE_PERIOD_SECONDS // 60
        if minutes % period_minutes:
            raise ValueError(
                f"{minutes} is not a multiple of the idle alarm's {period_minutes}-minute period"
            )
        if not period_minutes <= minutes <= MAX_IDLE_MINUTES:
            raise ValueError(
                f"{minutes} is outside {period_minutes}-{MAX_IDLE_MINUTES} minutes, "
                "the most a CloudWatch alarm looks back at this period"
            )
        return minutes

    @field_validator("max_runtime_hours")
    @classmethod
    def _max_runtime(cls, hours: float | None) -> float | None:
        if hours is None:
            return None
        if not 0 < hours <= MAX_RUNTIME_HOURS:
            raise ValueError(
                f"{hours:g} hours is outside what a CloudWatch alarm can watch "
                f"(above 0, at most {MAX_RUNTIME_HOURS})"
            )
        period = _runtime_period(hours)
        periods = hours * 3600 / period
        if not math.isclose(periods, round(periods)):
            raise ValueError(
                f"{hours:g} hours is not a whole number of the runtime alarm's "
                f"{period // 60}-minute periods"
            )
        return hours

    @field_validator("allowed_instance_types")
    @classmethod
    def _allowed_types(cls, types: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if types is not None and not types:
            raise ValueError("an empty list would allow no instance at all")
        return types

    @model_validator(mode="before")
    @classmethod
    def _forecast_default(cls, data: Any) -> Any:
        """AWS Budgets forecasts no daily budget: by default only a monthly one gets a forecast."""
        keys = ("forecastThresholdsPercent", "forecast_thresholds_percent")
        if not isinstance(data, Mapping) or any(key in data for key in keys):
            return data
        period = data.get("budgetPeriod", data.get("budget_period", "MONTHLY"))
        daily = isinstance(period, str) and period.strip().upper() == "DAILY"
        return {**data, "forecastThresholdsPercent": [] if daily else [100.0]}

    @model_validator(mode="after")
    def _no_forecast_for_daily(self) -> GuardrailConfig:
        if self.budget_period == "DAILY" and self.forecast_thresholds_percent:
            shown = ", ".join(f"{threshold:g}" for threshold in self.forecast_thresholds_percent)
            raise ValueError(
                f"gpu:forecastThresholdsPercent is [{shown}] but AWS Budgets makes no forecast "
                "for a DAILY budget; leave it unset or [] with gpu:budgetPeriod DAILY"
            )
        return self

    @model_validator(mode="after")
    def _notification_count(self) -> GuardrailConfig:
        count = len(self.actual_thresholds_percent) + len(self.forecast_thresholds_percent)
        if count > MAX_NOTIFICATIONS:
            raise ValueError(
                f"gpu:actualThresholdsPercent and gpu:forecastThresholdsPercent ask for {count} "
                f"budget notifications; AWS Budgets takes at most {MAX_NOTIFICATIONS}, "
                "so drop some thresholds"
            )
        return self

    @classmethod
    def config_keys(cls) -> frozenset[str]:
        """The guardrail keys of the `gpu:` namespace, without the prefix (e.g. "budgetUsd")."""
        return frozenset(field.alias for field in cls.model_fields.values() if field.alias)

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> GuardrailConfig:
        """Build from raw `gpu:` config values (keys with or without the `gpu:` prefix).

        Keys that are not guardrail keys are left to the stack config, which owns the others.
        Raises ConfigError naming the key, the value, and what would work.
        """
        raw = {}
        for key, value in values.items():
            name = key.removeprefix(f"{CONFIG_NAMESPACE}:")
            if name in GUARDRAIL_KEYS and value is not None:
                raw[name] = value
        try:
            return cls.model_validate(raw)
        except pydantic.ValidationError as error:
            raise ConfigError(
                describe(
                    error,
                    name=lambda key: f"{CONFIG_NAMESPACE}:{key}",
                    raw=raw,
                    hint=lambda key: _HINTS.get(key.split(".")[0]),
                )
            ) from None

    @property
    def idle_period_seconds(self) -> int:
        return IDLE_PERIOD_SECONDS

    @property
    def idle_evaluation_periods(self) -> int:
        return self.idle_minutes * 60 // IDLE_PERIOD_SECONDS

    @property
    def runtime_alarm_window(self) -> tuple[int, int] | None:
        """(period seconds, evaluation periods) of the maximum-runtime alarm, or None."""
        if self.max_runtime_hours is None:
            return None
        period = _runtime_period(self.max_runtime_hours)
        return period, round(self.max_runtime_hours * 3600 / period)

    @property
    def warnings(self) -> tuple[str, ...]:
        """Sentences for the user about settings that work but are probably not meant."""
        placeholders = [email for email in self.alert_emails if _is_placeholder(email)]
        if not placeholders:
            return ()
        return (
            f"gpu:alertEmails holds {', '.join(placeholders)}, an address at a domain reserved "
            "for examples: budget alerts would reach nobody; set yours with "
            "pulumi config set --path 'gpu:alertEmails[0]' you@your-team.com",
        )

    def check_against(self, hourly_usd: float) -> None:
        """Refuse a stack nobody hears about, or whose budget would not buy one hour of it."""
        if not self.alert_emails and not self.allow_no_alerts:
            raise ConfigError(
                "gpu:alertEmails is empty, so nobody would hear of budget alerts; set it to "
                "your address (pulumi config set --path 'gpu:alertEmails[0]' you@example.com) "
                "or set gpu:allowNoAlerts to true"
            )
        if self.budget_usd < hourly_usd and not self.allow_budget_below_one_hour:
            raise ConfigError(
                f"gpu:budgetUsd is {self.budget_usd:g}, less than one hour of this stack at "
                f"${hourly_usd:.2f}/h, so the budget action would stop it within the hour; "
                f"set gpu:budgetUsd to at least {math.ceil(hourly_usd)} "
                "or set gpu:allowBudgetBelowOneHour to true"
            )

    def check_instance_type(self, instance_type: str) -> None:
        if self.allowed_instance_types is not None and (
            instance_type not in self.allowed_instance_types
        ):
            raise ConfigError(
                f"instance type {instance_type!r} is not in gpu:allowedInstanceTypes "
                f"{list(self.allowed_instance_types)}; pick a profile with one of those types "
                "or add it to the list"
            )


def _runtime_period(hours: float) -> int:
    if hours <= MAX_RUNTIME_HOURS_SHORT_PERIODS:
        return RUNTIME_SHORT_PERIOD_SECONDS
    return RUNTIME_LONG_PERIOD_SECONDS


GUARDRAIL_KEYS: frozenset[str] = GuardrailConfig.config_keys()

# What would work, per key, for the error sentence: each field's description.
_HINTS = {field.alias: field.description for field in GuardrailConfig.model_fields.values()}
