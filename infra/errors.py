"""The stack side's error for bad input: common.errors.ConfigError, the trainer's too."""

from common.errors import ConfigError

__all__ = ["ConfigError"]
