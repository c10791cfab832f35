"""The one exception type for mistakes a user can fix (bad params, paths, data)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class UserError(Exception):
    """A bad input. The message is one line: what is wrong, where, and what to do.

    The `orl` command and the benchmark scripts print it without a traceback and exit 2.
    """


def user_error_behind(err: BaseException) -> UserError | None:
    """The UserError behind `err`, also when it was raised inside a Ray actor or task."""
    while err is not None:
        if isinstance(err, UserError):
            return err
        err = getattr(err, "cause", None) or err.__cause__
    return None


def exit_on_user_error(main: Callable[[], object]) -> None:
    """Runs a script's `main`; a UserError ends it as argparse ends a bad argument: `SCRIPT: error: MESSAGE`, one
    line on stderr, exit status 2."""
    try:
        main()
    except Exception as err:
        found = user_error_behind(err)
        if found is None:
            raise
        print(f"{os.path.basename(sys.argv[0])}: error: {found}", file=sys.stderr)
        sys.exit(2)


def first_line(err: BaseException) -> str:
    """A library's error message cut to its first line (its type's name when it has none), for a UserError."""
    message = str(err).strip()
    return message.splitlines()[0] if message else type(err).__name__


def refuse_to_overwrite(path) -> None:
    """Outputs are never overwritten: raises if `path` exists."""
    if path.exists():
        raise UserError(f"{path} already exists; remove it first (dvc repro does) or choose another output")
