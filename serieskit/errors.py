"""The one error type of the toolkit: its message is printed as is, one line."""


class ToolkitError(Exception):
    """A failure the user can act on; sessions print it and exit non-zero."""
