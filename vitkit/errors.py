"""The base class of every error vitkit raises for a user's mistake (a bad recipe, file, image or
argument); ``vitkit.cli.common.cli_errors`` turns them into one ``error: ...`` line in the commands.

A :class:`VitkitError` message says what was wrong, where, and how to fix it; anything else that
escapes a tool is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class VitkitError(Exception):
    """A user-facing error: bad input, not a bug. The message is one complete sentence or more."""

    #: What a ``vitkit`` command exits with when this error stops it (``vitkit.cli.common``).
    exit_status: int = 2


class UsageError(VitkitError):
    """A command-line argument a tool cannot use (a class or layer out of range, ...)."""


class UnsupportedModelError(VitkitError, ValueError):
    """A model or checkpoint from another library (timm) uses an architecture feature vitkit lacks;
    the message names the features."""


class MissingDependencyError(VitkitError, ImportError):
    """An optional dependency that a feature needs is not installed; the message names the extra."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``import module`` for ``feature``, or :class:`MissingDependencyError` naming the package
    extra that installs it (``pip install "vitkit[onnx]"``) rather than a traceback."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or module
        raise MissingDependencyError(
            f"{feature} needs {missing}, which is not installed: pip install \"vitkit[{extra}]\" "
            f"(or pip install -e \".[{extra}]\" in a clone)."
        ) from None
