"""The library's one exception type."""


class SpecboundError(Exception):
    """Bad input or an impossible request, with a message that says what was expected, what was
    found and how to fix it.  The CLI prints the message on one line and exits with status 2."""
