"""Exit codes and the exceptions that map onto them."""

EXIT_OK = 0
EXIT_ACTION = 1
EXIT_ERROR = 2
EXIT_NOT_APPLICABLE = 3


class Error(Exception):
    """An expected failure: bad input, refused or failed operation (exit 2)."""

    code = EXIT_ERROR


class NotApplicable(Error):
    """The tool does not apply to this host (exit 3)."""

    code = EXIT_NOT_APPLICABLE
