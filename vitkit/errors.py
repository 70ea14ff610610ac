"""The base class of every error vitkit raises for a user's mistake (a bad recipe, file, image or
argument); ``vitkit.cli.common.cli_errors`` turns them into one ``error: ...`` line in the commands.

A :class:`VitkitError` message says what was wrong, where, and how to fix it; anything else that
escapes a tool is a bug and keeps its traceback.
"""

from __future__ import annotations


class VitkitError(Exception):
    """A user-facing error: bad input, not a bug. The message is one complete sentence or more."""

    #: What a ``vitkit`` command exits with when this error stops it (``vitkit.cli.common``).
    exit_status: int = 2


class UsageError(VitkitError):
    """A command-line argument a tool cannot use (a class or layer out of range, ...)."""


class UnsupportedModelError(VitkitError, ValueError):
    """A model or checkpoint from another library (timm) uses an architecture feature vitkit lacks;
    the message names the features."""
