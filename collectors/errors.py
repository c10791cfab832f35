"""The one exception type for mistakes a user can fix (bad params, paths, data)."""


class UserError(Exception):
    """A bad input. The message is one line: what is wrong, where, and what to do.

    The `orl` command prints it without a traceback and exits non-zero.
    """
