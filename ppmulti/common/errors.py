"""The one exception type for bad user input, how it becomes a one-line exit, and one line of any exception."""

from __future__ import annotations

import sys
from typing import Callable


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2, never a traceback.

    The message names the offending path, key or flag and says how to fix it.
    """

    exit_code = 2


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, or its type's name when it has none (for one-line errors)."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def exit_on_user_error(func, *args, said: Callable[[str], str] | None = None, **kwargs) -> int:
    """Run ``func``; turn a UserError into one line on stderr and its exit code. ``said``: the message as the
    user's command line speaks (ultra_keys.as_typed in the tools `ppmulti yolo` execs)."""
    try:
        return func(*args, **kwargs) or 0
    except UserError as exc:
        print(f"error: {said(str(exc)) if said else exc}", file=sys.stderr)
        return exc.exit_code
