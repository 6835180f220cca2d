"""The one error type for bad stack input: a wrong profile, instance, variant or data file."""


class ConfigError(ValueError):
    """Bad configuration, in one sentence: what is wrong and what would work.

    Commands print it without a traceback and exit 2; `pulumi preview` fails with it.
    """
