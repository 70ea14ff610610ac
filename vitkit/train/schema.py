"""The recipe's error type; recipes are built and validated by :mod:`vitkit.schema`, the one path
every vitkit config goes through (re-exported here for the training code)."""

from __future__ import annotations

from ..schema import ConfigError, bounds, build, dotted_keys, merge, parse_overrides, to_plain

__all__ = ["RecipeError", "bounds", "build", "dotted_keys", "merge", "parse_overrides", "to_plain"]


class RecipeError(ConfigError):
    """A recipe (or an override) is invalid; the message says which key, where, and how to fix it."""
