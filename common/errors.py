"""The one exception type for mistakes a user can fix (bad params, paths, data)."""


class UserError(Exception):
    """A bad input. The message is one line: what is wrong, where, and what to do.

    The `orl` command prints it without a traceback and exits non-zero.
    """


def first_line(err: BaseException) -> str:
    """A library's error message cut to its first line (its type's name when it has none), for a UserError."""
    message = str(err).strip()
    return message.splitlines()[0] if message else type(err).__name__


def refuse_to_overwrite(path) -> None:
    """Outputs are never overwritten: raises if `path` exists."""
    if path.exists():
        raise UserError(f"{path} already exists; remove it first (dvc repro does) or choose another output")
