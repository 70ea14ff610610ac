"""The base class of every error vitkit raises for a user's mistake (a bad recipe, file, image or
argument), and :func:`cli_errors`, which turns those errors into one ``error: ...`` line in the tools.

A :class:`VitkitError` message says what was wrong, where, and how to fix it; anything else that
escapes a tool is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import math
import sys
from collections.abc import Callable, Sequence

#: Exit status of a tool stopped by a user's mistake.
USER_ERROR_EXIT = 2


class VitkitError(Exception):
    """A user-facing error: bad input, not a bug. The message is one complete sentence or more."""

    #: What a ``vitkit`` command exits with when this error stops it (``vitkit.cli.common``).
    exit_status: int = 2


class UsageError(VitkitError):
    """A command-line argument a tool cannot use (a class or layer out of range, ...)."""


class UnsupportedModelError(VitkitError, ValueError):
    """A model or checkpoint from another library (timm) uses an architecture feature vitkit lacks;
    the message names the features."""


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An ``argparse`` type of whole numbers of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


#: ``argparse`` type of counts and sizes (``--batch-size``): an integer of at least 1.
positive_int = int_at_least(1)


def number_in(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False
              ) -> Callable[[str], float]:
    """An ``argparse`` type of finite numbers in ``[low, high]`` (``(`` / ``)`` where open): NaN and
    infinities are refused, as are values outside, with the range in the message."""
    left, right = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
    shown = f"{left}{low:g}, {'inf' if high == math.inf else f'{high:g}'}{right}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {shown}, got {text!r}") from None
        inside = math.isfinite(value) and (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high)
        if not inside:
            raise argparse.ArgumentTypeError(f"must be a finite number in {shown}, got {text}")
        return value

    return parse


def describe_os_error(error: OSError) -> str:
    """``error`` as one line naming the path and the reason ("No space left on device" as such)."""
    where = f"{error.filename}: " if error.filename else ""
    if error.errno == errno.ENOSPC:
        return f"{where}no space left on device; free some space or choose another output folder."
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}not writable ({error.strerror}); choose a folder you can write to."
    if error.errno == errno.EISDIR:
        return f"{where}is a directory where a file was expected."
    return f"{where}{error.strerror or error}"


def cli_errors(
    main: Callable[[Sequence[str] | None], int],
    argv: Sequence[str] | None = None,
    status: int = USER_ERROR_EXIT,
    statuses: Sequence[tuple[type[BaseException], int]] = (),
) -> int:
    """Run a tool's ``main(argv)``; a :class:`VitkitError` or ``OSError`` becomes ``error: ...`` on
    stderr and exit ``status``, or the status of the first ``(error type, status)`` of ``statuses``
    it is an instance of (a traceback too with ``--debug``). Returns ``main``'s status otherwise."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        return main(args)
    except (VitkitError, OSError) as error:
        if debug:
            raise
        message = describe_os_error(error) if isinstance(error, OSError) and error.errno else str(error)
        print(f"error: {message}", file=sys.stderr)
        return next((code for kind, code in statuses if isinstance(error, kind)), status)
