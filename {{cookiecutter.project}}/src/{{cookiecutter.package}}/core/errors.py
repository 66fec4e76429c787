"""The errors whose message says all a user needs: the entry points print them as one line, no traceback."""


class ClearError(Exception):
    """An error whose message says all the user needs; the entry points print it as one line, no traceback."""


class ConfigError(ClearError):
    """A mistake in the command line, the config or the input paths."""
