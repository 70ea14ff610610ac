"""Build typed dataclasses from YAML-like dicts, with one clear message per mistake.

:func:`build` walks a dataclass's type hints: nested dataclasses, ``Literal`` choices, unions,
``list``/``tuple``/``dict`` containers and scalars. Strings are coerced where the field wants a
number (YAML reads ``5e-4`` as text, and command-line overrides arrive as text); unknown keys name
the closest valid key (``difflib``); fields may carry numeric bounds in their metadata
(``field(default=..., metadata=bounds(gt=0))``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

import yaml

from ..errors import VitkitError


class RecipeError(VitkitError, ValueError):
    """A recipe (or an override) is invalid; the message says which key, where, and how to fix it."""


def bounds(*, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None):
    """Field metadata declaring the allowed numeric range, checked by :func:`build`."""
    return {key: value for key, value in dict(ge=ge, gt=gt, le=le, lt=lt).items() if value is not None}


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every valid dotted key of dataclass ``cls`` (``'optim.lr'``, ``'data.augment.padding'``)."""
    keys = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        hint = _unwrap_optional(typing.get_type_hints(cls)[f.name])
        if dataclasses.is_dataclass(hint):
            keys.extend(dotted_keys(hint, prefix=f"{key}."))
    return keys


def closest_key(key: str, valid: list[str]) -> str | None:
    """The valid dotted key ``key`` most likely meant: a close name in the same section first
    (``optim.weight_decy``), then the same or a close name in another section (``trainer.lr`` ->
    ``optim.lr``)."""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in valid if k.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if close:
        return siblings[close[0]]
    leaves = [k for k in valid if not any(other.startswith(f"{k}.") for other in valid)]
    by_leaf: dict[str, str] = {}
    for k in leaves:
        by_leaf.setdefault(k.rpartition(".")[2], k)
    close = difflib.get_close_matches(leaf, by_leaf, n=1, cutoff=0.8)
    if close:
        return by_leaf[close[0]]
    close = difflib.get_close_matches(key, leaves, n=1, cutoff=0.6)
    return close[0] if close else None


def build(
    cls: type,
    values: Any,
    *,
    source: str,
    path: str = "",
    all_keys: list[str] | None = None,
    override_keys: frozenset[str] = frozenset(),
) -> Any:
    """Instantiate dataclass ``cls`` from the mapping ``values``.

    Args:
        cls: the dataclass.
        values: its fields as a mapping (missing fields keep their defaults).
        source: where the values come from (a file name), quoted in error messages.
        path: dotted key prefix of this section, e.g. ``'optim.'``.
        all_keys: every valid dotted key of the root, to suggest the closest one for a typo.
        override_keys: dotted keys that came from command-line overrides (named as such in errors).

    Raises:
        RecipeError: naming the first unknown key, wrong type or out-of-range value.
    """
    all_keys = all_keys if all_keys is not None else dotted_keys(cls)
    where = f"section {path.rstrip('.')!r}" if path else "the recipe"
    if not isinstance(values, Mapping):
        raise RecipeError(f"{where} in {source} must be a mapping of keys to values, got {_describe(values)}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in values.items():
        dotted = f"{path}{key}"
        origin = "a command-line override" if dotted in override_keys else source
        if key not in fields:
            close = closest_key(dotted, all_keys)
            hint = f" Did you mean {close!r}?" if close else f" Valid keys here: {', '.join(fields)}."
            raise RecipeError(f"unknown key {dotted!r} in {origin}.{hint}")
        hint_type = hints[key]
        section = _unwrap_optional(hint_type)
        # A nested section; an empty one (``optim:`` with nothing under it) keeps its defaults.
        empty = value is None and section is hint_type
        if dataclasses.is_dataclass(section) and (isinstance(value, Mapping) or empty):
            kwargs[key] = build(
                section, value or {}, source=source, path=f"{dotted}.", all_keys=all_keys, override_keys=override_keys
            )
            continue
        try:
            kwargs[key] = _coerce(value, hint_type)
        except (TypeError, ValueError):
            raise RecipeError(
                f"{dotted} in {origin} must be {_type_name(hint_type)}, got {_describe(value)}."
            ) from None
        _check_bounds(kwargs[key], fields[key].metadata, dotted, origin)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        overridden = any(key.startswith(path) for key in override_keys)
        origin = f"{source} with its command-line overrides" if overridden else source
        raise RecipeError(f"invalid {where} in {origin}: {error}") from None


def parse_overrides(overrides: typing.Iterable[str]) -> tuple[dict[str, Any], frozenset[str]]:
    """``['trainer.max_epochs=5', 'model.num_heads=4']`` to a nested dict and its dotted keys.
    Values are read as YAML (``true``, ``null``, ``[1, 2]``, numbers); strings are coerced later."""
    nested: dict[str, Any] = {}
    keys = set()
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise RecipeError(f"override {item!r} is not of the form section.key=value (e.g. trainer.max_epochs=5).")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(
                    f"override {item!r} sets a key inside {part!r}, which another override set to a value."
                )
            node = child
        node[leaf] = value
        keys.add(key)
    return nested, frozenset(keys)


def merge(base: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``updates`` wins, nested mappings are merged key by key."""
    merged = dict(base)
    for key, value in updates.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def to_plain(value: Any) -> Any:
    """Dataclasses, tuples and mappings to plain dicts/lists (YAML, JSON and ``weights_only`` safe)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(item) for item in value]
    return value


# ------------------------------------------------------------------------------------ coercion
def _coerce(value: Any, hint: Any) -> Any:
    """``value`` converted to type ``hint`` or ``TypeError``/``ValueError``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        candidates = [arg for arg in args if arg is not type(None)]
        # An exact type match first (an int stays an int in ``int | float``), then coercions.
        for arg in sorted(candidates, key=lambda a: not _matches_exactly(value, a)):
            try:
                return _coerce(value, arg)
            except (TypeError, ValueError):
                continue
        raise TypeError(value)
    if origin is Literal:
        if value in args:
            return value
        raise ValueError(value)
    if origin in (list, tuple) or hint in (list, tuple):
        if _is_size_pair(hint) and not isinstance(value, (list, tuple)):
            return (_coerce(value, args[0]),) * len(args)  # img_size: 32 means (32, 32)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise TypeError(value)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError(value)
            return tuple(_coerce(item, arg) for item, arg in zip(value, args))
        item_hint = args[0] if args else Any
        items = [_coerce(item, item_hint) for item in value]
        return tuple(items) if origin is tuple or hint is tuple else items
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise TypeError(value)
        return dict(value)
    if dataclasses.is_dataclass(hint):
        raise TypeError(value)
    if hint is type(None):
        if value is None:
            return None
        raise TypeError(value)
    return _coerce_scalar(value, hint)


def _coerce_scalar(value: Any, hint: type) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise TypeError(value)
    if hint is int:
        if isinstance(value, bool):
            raise TypeError(value)
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError(value)
    if hint is float:
        if isinstance(value, bool):
            raise TypeError(value)
        if isinstance(value, (int, float, str)):
            return float(value)
        raise TypeError(value)
    if hint is str:
        if isinstance(value, str):
            return value
        raise TypeError(value)
    if isinstance(value, hint):
        return value
    raise TypeError(value)


def _matches_exactly(value: Any, hint: Any) -> bool:
    if hint in (int, float, str, bool):
        return type(value) is hint
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is Literal:
        return value in typing.get_args(hint)
    return False


def _is_size_pair(hint: Any) -> bool:
    """``tuple[int, int]`` (an image or patch size): a single int stands for both."""
    return typing.get_origin(hint) is tuple and typing.get_args(hint) == (int, int)


def _unwrap_optional(hint: Any) -> Any:
    """``X | None`` to ``X``; other hints unchanged."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _check_bounds(value: Any, metadata: Mapping[str, Any], key: str, origin: str) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    tests = {
        "ge": (lambda v, b: v >= b, ">="),
        "gt": (lambda v, b: v > b, ">"),
        "le": (lambda v, b: v <= b, "<="),
        "lt": (lambda v, b: v < b, "<"),
    }
    for name, bound in metadata.items():
        if name in tests and not tests[name][0](value, bound):
            rule = " and ".join(f"{tests[n][1]} {b:g}" for n, b in metadata.items() if n in tests)
            raise RecipeError(f"{key} in {origin} is out of range: got {value:g}, must be {rule}.")


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    if origin in (list, tuple):
        if _is_size_pair(hint):
            return f"{_type_name(args[0])} or a list of 2 of them"
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} values ({', '.join(_type_name(a) for a in args)})"
        return f"a list of {_type_name(args[0]) if args else 'values'}"
    if hint is type(None):
        return "null"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} options"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"
