"""What every ``vitkit`` command shares: argument types, the exit statuses, and :func:`cli_errors`,
which turns a user's mistake into one ``error: ...`` line.

Exit statuses, the same for every command:

- 0: done.
- 2: a user's mistake stopped the command (a bad argument, recipe, model or data file, output
  folder: a :class:`~vitkit.errors.VitkitError` or ``OSError``, one ``error: ...`` line; argparse's
  usage errors exit 2 too). ``--debug`` shows the traceback.
- 3: done, but some inputs were skipped (unreadable images), each named on an ``error: ...`` line.
- 143 (128 + SIGTERM): a training run stopped by SIGTERM; ``last.ckpt`` saved, the message says
  how to resume. 130 (128 + SIGINT): the same, stopped by Ctrl-C.
- 1: anything else escaped: a bug in vitkit, with its traceback (Python's own status).
"""

from __future__ import annotations

import argparse
import errno
import math
import sys
from collections.abc import Callable

from ..errors import VitkitError

DONE = 0
USAGE_ERROR = 2
SKIPPED_INPUTS = 3


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An ``argparse`` type of whole numbers of at least ``minimum`` (and at most ``maximum``)."""
    wanted = f"at least {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number {'of ' * (maximum is None)}{wanted}, got "
                                             f"{text[:120]!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            shown = str(value) if len(str(value)) <= 40 else f"a number of {len(str(value))} digits"
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {shown}")
        return value

    return parse


#: ``argparse`` type of counts and sizes (``--batch-size``): an integer of at least 1.
positive_int = int_at_least(1)
#: ``argparse`` type of seeds: 0 to 2**32 - 1, as a recipe's ``trainer.seed``.
seed_int = int_at_least(0, 2**32 - 1)


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


def cli_errors(run: Callable[[], int | None], debug: bool = False) -> int:
    """``run()``'s status (0 for ``None``); a :class:`VitkitError` or ``OSError`` becomes one
    ``error: ...`` line on stderr and status 2 (a ``VitkitError``'s own ``exit_status``: 143 for a
    training run stopped by SIGTERM, 130 by Ctrl-C); with ``debug``, the error is raised again, traceback and all."""
    try:
        return run() or DONE
    except (VitkitError, OSError) as error:
        if debug:
            raise
        message = describe_os_error(error) if isinstance(error, OSError) and error.errno else str(error)
        print(f"error: {message}", file=sys.stderr)
        return error.exit_status if isinstance(error, VitkitError) else USAGE_ERROR
