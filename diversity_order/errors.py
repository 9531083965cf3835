"""Errors the user can fix: the scripts print these as one line and exit non-zero."""


class UserError(Exception):
    """An error caused by the user's input or flags: the scripts print its message as one line and exit 2, no traceback."""
