"""The program's exit codes (the package docstring says when each is returned) and the usage error."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNKNOWN_NODE = 3


class UsageError(Exception):
    """Bad arguments, configuration or hostlist (exit 2)."""
