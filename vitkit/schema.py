"""One way to build and validate vitkit's option dataclasses (model, data, optim, trainer, output),
whether they come from keyword arguments, a dict, a YAML recipe or a model file's metadata.

Every option class derives from :class:`Config`, whose ``__post_init__`` coerces each field to its
type hint (nested dataclasses, ``Literal`` choices, unions, ``list``/``tuple``/``dict`` and
scalars), checks the numeric range declared in its metadata (``field(..., metadata=bounds(ge=1))``,
applied to every number of a list or pair), then runs the class's cross-field :meth:`Config.validate`.
:func:`build` adds what dicts need: unknown keys name the closest valid key (``difflib``), and every
message says where the value came from (a file, a command-line override). Strings are coerced where
a field wants a number (YAML reads ``5e-4`` as text; overrides arrive as text).

Values echoed in messages are shortened (:func:`describe`), and :func:`load_yaml` refuses documents
whose aliases expand to more than :data:`MAX_YAML_NODES` nodes (a "billion laughs" alias bomb)
before any Python object is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import operator
import re
import reprlib
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar, Union

import yaml

from .errors import VitkitError

#: Image channels vitkit's data pipeline produces and its models take: grayscale or RGB.
Channels = Literal[1, 3]
#: The largest image side (and patch side, crop padding) any config accepts: generous but finite,
#: checked before anything is allocated.
MAX_IMG_SIDE = 4096
#: The most epochs any schedule counts (a run's, a task's warm-up): generous but finite.
MAX_EPOCHS = 1_000_000
#: The largest batch any config accepts (a run's, a distillation teacher's).
MAX_BATCH_SIZE = 1 << 20

#: A YAML document may expand (aliases counted at every use) to at most this many nodes.
MAX_YAML_NODES = 100_000

C = TypeVar("C", bound="Config")


class ConfigError(VitkitError, ValueError):
    """Invalid options; the message names the key, where it came from, and what is allowed."""


class FieldError(ConfigError):
    """One field's value is of the wrong type or out of range.

    Attributes:
        key: the field's name (dotted inside nested sections).
        problem: the rest of the sentence, e.g. ``"must be an integer, got 'x' (str)."``
    """

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}")
        self.key = key
        self.problem = problem


class RecipeError(ConfigError):
    """A training recipe (or an override) is invalid; the message says which key, where, and how to fix it."""


def bounds(*, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None):
    """Field metadata declaring the allowed numeric range (of a number, or of each number of a list)."""
    return {key: value for key, value in dict(ge=ge, gt=gt, le=le, lt=lt).items() if value is not None}


class Config:
    """Base of vitkit's option dataclasses: fields are coerced and range-checked on construction."""

    def __post_init__(self) -> None:
        hints = _type_hints(type(self))
        for f in dataclasses.fields(self):
            if f.init:
                value = check_value(f.name, getattr(self, f.name), hints[f.name], f.metadata)
                object.__setattr__(self, f.name, value)
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; raise :class:`FieldError` for one field, ``ValueError`` otherwise."""

    def section_values(self) -> dict[str, Config]:
        """The :meth:`sections` this config holds, by key (written out beside its fields)."""
        return {}

    @classmethod
    def sections(cls) -> dict[str, type[Config]]:
        """Sections this config takes beside its fields, by key, each built as a nested section and
        passed to the constructor by its key: the options of parts registered by name (the
        training tasks'), which no field can list. None by default."""
        return {}

    @classmethod
    def from_dict(
        cls: type[C], values: Any, *, source: str = "the given dict", error: type[ConfigError] = ConfigError
    ) -> C:
        """Build from a mapping; unknown keys, wrong types and out-of-range values raise ``error``."""
        return build(cls, values, source=source, error=error)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists): YAML, JSON and ``weights_only`` safe."""
        return to_plain(self)

    def replace(self: C, **changes: Any) -> C:
        """A validated copy with ``changes`` applied (unknown names get the closest valid one)."""
        current = {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}, **self.section_values()}
        return build(type(self), {**current, **changes}, source="the arguments")


def check_value(key: str, value: Any, hint: Any, metadata: Mapping[str, Any] | None = None) -> Any:
    """``value`` coerced to type ``hint`` and checked against the :func:`bounds` in ``metadata``.

    Raises:
        FieldError: naming ``key``, the expected type or range, and the (shortened) value.
    """
    section = _unwrap_optional(hint)
    if dataclasses.is_dataclass(section):
        if isinstance(value, section) or (value is None and section is not hint):
            return value
        if isinstance(value, Mapping):
            return build(section, value, source="the arguments", path=f"{key}.")
    try:
        value = _coerce(value, hint)
    except (TypeError, ValueError):
        raise FieldError(key, f"must be {type_name(hint)}, got {describe(value)}.{_choice_hint(value, hint)}") from None
    _check_bounds(key, value, metadata or {})
    return value


def build(
    cls: type[C],
    values: Any,
    *,
    source: str,
    path: str = "",
    all_keys: list[str] | None = None,
    override_keys: frozenset[str] = frozenset(),
    error: type[ConfigError] = ConfigError,
) -> C:
    """Instantiate :class:`Config` dataclass ``cls`` from the mapping ``values``.

    Args:
        cls: the dataclass.
        values: its fields as a mapping (missing fields keep their defaults).
        source: where the values come from (a file name), quoted in error messages.
        path: dotted key prefix of this section, e.g. ``'optim.'``.
        all_keys: every valid dotted key of the root, to suggest the closest one for a typo.
        override_keys: dotted keys that came from command-line overrides (named as such in errors).
        error: the exception class raised (``RecipeError`` for recipes).

    Raises:
        ConfigError: (as ``error``) naming the first unknown key, wrong type or out-of-range value.
    """
    all_keys = all_keys if all_keys is not None else dotted_keys(cls, prefix=path)
    where = f"section {path.rstrip('.')!r}" if path else "values"
    if not isinstance(values, Mapping):
        raise error(f"{where} of {source} must be a mapping of keys to values, got {describe(values)}.")
    hints = _type_hints(cls)

    def origin(dotted: str) -> str:
        return "a command-line override" if dotted in override_keys else source

    reject_unknown_keys(
        cls, values, source=source, path=path, all_keys=all_keys, override_keys=override_keys, error=error
    )
    kwargs = {}
    sections = _sections(cls)
    for key, value in values.items():
        dotted = f"{path}{key}"
        section = sections[key] if key in sections else _unwrap_optional(hints[key])
        # A nested section; an empty one (``optim:`` with nothing under it) keeps its defaults.
        if dataclasses.is_dataclass(section) and (
            isinstance(value, Mapping) or (value is None and (key in sections or section is hints[key]))
        ):
            kwargs[key] = build(
                section,
                value or {},
                source=source,
                path=f"{dotted}.",
                all_keys=all_keys,
                override_keys=override_keys,
                error=error,
            )
        else:
            kwargs[key] = value
    try:
        return cls(**kwargs)
    except FieldError as problem:
        dotted = f"{path}{problem.key}"
        raise error(f"{dotted} in {origin(dotted)} {problem.problem}") from None
    except (TypeError, ValueError) as problem:
        overridden = any(key.startswith(path) for key in override_keys)
        where_from = f"{source} with its command-line overrides" if overridden else source
        raise error(f"invalid {where} in {where_from}: {problem}") from None


#: Keys renamed since an earlier release, with their new names: a recipe, override or argument that
#: still uses the old name is refused with a hint (never aliased); model files and checkpoints that
#: hold it are migrated by :func:`vitkit.io.upgrade`.
RENAMED_KEYS: dict[str, str] = {"locality_attention": "locality"}


def reject_unknown_keys(
    cls: type,
    keys: Iterable[str],
    *,
    source: str,
    path: str = "",
    all_keys: list[str] | None = None,
    override_keys: frozenset[str] = frozenset(),
    error: type[ConfigError] = ConfigError,
) -> None:
    """Raise ``error`` for the first of ``keys`` that is no field of dataclass ``cls``, naming the
    closest valid dotted key (arguments as in :func:`build`)."""
    fields = {f.name for f in dataclasses.fields(cls) if f.init} | set(_sections(cls))
    for key in keys:
        if key not in fields:
            dotted = f"{path}{key}"
            origin = "a command-line override" if dotted in override_keys else source
            if RENAMED_KEYS.get(key) in fields:
                raise error(f"key {dotted!r} in {origin} was renamed to {path + RENAMED_KEYS[key]!r}; use the new name.")
            close = closest_key(dotted, all_keys if all_keys is not None else dotted_keys(cls, prefix=path))
            hint = f" Did you mean {close!r}?" if close else f" Valid keys here: {', '.join(sorted(fields))}."
            raise error(f"unknown key {describe(dotted, with_type=False)} in {origin}.{hint}")


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every valid dotted key of dataclass ``cls`` (``'optim.lr'``, ``'data.augment.padding'``)."""
    keys = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        hint = _unwrap_optional(_type_hints(cls)[f.name])
        if dataclasses.is_dataclass(hint):
            keys.extend(dotted_keys(hint, prefix=f"{key}."))
    for name, section in _sections(cls).items():
        keys.append(f"{prefix}{name}")
        keys.extend(dotted_keys(section, prefix=f"{prefix}{name}."))
    return keys


def closest_key(key: str, valid: list[str]) -> str | None:
    """The valid dotted key ``key`` most likely meant: a close name in the same section first
    (``optim.weight_decy``), then the same or a close name in another section (``trainer.lr`` ->
    ``optim.lr``). ``None`` for no close key, or a key too long to be a typo."""
    if len(key) > MAX_ECHO_CHARS:
        return None
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


# ------------------------------------------------------------------------------ YAML and dicts
def load_yaml(text: str, *, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """Parse one YAML document safely (``yaml.SafeLoader``); refuse it, before building any Python
    object, if its aliases expand to more than :data:`MAX_YAML_NODES` nodes or refer to themselves.

    Raises:
        yaml.YAMLError: the text is not YAML.
        ConfigError: (as ``error``) the document is absurdly large once expanded.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {}, set(), source, error)
        if size > MAX_YAML_NODES:
            raise error(
                f"{source} expands to {size:,} YAML nodes once its aliases (*name) are resolved, more than the "
                f"limit of {MAX_YAML_NODES:,}; a recipe has a few dozen keys, so remove the repeated aliases."
            )
        try:
            return loader.construct_document(node)
        except ValueError as problem:  # int() of more digits than Python converts (4300)
            raise error(f"{source} holds a value YAML cannot convert: {describe(str(problem), with_type=False)}") from None
    finally:
        loader.dispose()


def _expanded_size(
    node: yaml.Node, sizes: dict[int, int], open_nodes: set[int], source: str, error: type[ConfigError]
) -> int:
    """Nodes in the tree under ``node`` with every alias expanded, computed on the shared graph
    (each distinct node once) so a bomb is measured without being expanded. Capped at the limit + 1."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise error(f"{source} holds a recursive YAML alias (a node that contains itself); remove it.")
    open_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        names = [key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode)]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise error(f"{source} gives key {describe(twice[0], with_type=False)} twice in one mapping; give it once.")
        children = [child for pair in node.value for child in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    size = 1
    for child in children:
        size = min(size + _expanded_size(child, sizes, open_nodes, source, error), MAX_YAML_NODES + 1)
    open_nodes.discard(id(node))
    sizes[id(node)] = size
    return size


#: Where YAML starts a comment: a ``#`` at the start or after whitespace.
_YAML_COMMENT = re.compile(r"(^|\s)#")


def parse_overrides(
    overrides: Iterable[str], *, error: type[ConfigError] = ConfigError
) -> tuple[dict[str, Any], frozenset[str]]:
    """``['trainer.max_epochs=5', 'model.num_heads=4']`` to a nested dict and its dotted keys.
    Values are read as YAML (``true``, ``null``, ``[1, 2]``, numbers); strings are coerced later.
    A value YAML would cut at a comment (``path/a #1.safetensors``) is taken whole, as a string;
    quote it (``'a #1'``) to have YAML read it. A malformed item raises ``error``."""
    nested: dict[str, Any] = {}
    keys = set()
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise error(
                f"override {describe(item, with_type=False)} is not of the form section.key=value "
                "(e.g. trainer.max_epochs=5)."
            )
        try:
            value = load_yaml(text, source=f"override {key}", error=error) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        if _YAML_COMMENT.search(text) and text.lstrip()[:1] not in ("'", '"'):
            value = text.strip()  # YAML would cut "a #b.safetensors" at the '#': no override holds a comment
        if key in keys:
            raise error(f"override {describe(key, with_type=False)} is given twice; give each key once.")
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise error(
                    f"override {describe(item, with_type=False)} sets a key inside {part!r}, "
                    "which another override set to a value."
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
        sections = value.section_values() if isinstance(value, Config) else {}
        return {**{f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}, **to_plain(sections)}
    if isinstance(value, Mapping):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(item) for item in value]
    return value


# ------------------------------------------------------------------------------------ messages
_ECHO = reprlib.Repr()
_ECHO.maxstring = _ECHO.maxother = 60
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxdict = _ECHO.maxset = 6
_ECHO.maxlevel = 3
#: No echoed value is longer than this many characters.
MAX_ECHO_CHARS = 120


def describe(value: Any, *, with_type: bool = True) -> str:
    """``value``'s repr for a message, at most :data:`MAX_ECHO_CHARS` characters however large the
    value (``reprlib`` never walks more than a few items), plus its type."""
    text = _ECHO.repr(value)
    if len(text) > MAX_ECHO_CHARS:
        text = text[: MAX_ECHO_CHARS - 3] + "..."
    return f"{text} ({type(value).__name__})" if with_type else text


def type_name(hint: Any) -> str:
    """``hint`` in words: ``'an integer'``, ``"'token' or 'avg'"``, ``'a list of 2 values (...)'``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in args)
    if origin is Literal:
        listed = [repr(arg) for arg in args]
        return " or ".join(listed) if len(listed) <= 2 else "one of " + ", ".join(listed)
    if origin in (list, tuple):
        if _is_size_pair(hint):
            return f"{type_name(args[0])} or a list of 2 of them"
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} values ({', '.join(type_name(a) for a in args)})"
        if args and typing.get_origin(args[0]) is Literal:
            return f"a list of values from {', '.join(repr(arg) for arg in typing.get_args(args[0]))}"
        plurals = {int: "integers", float: "finite numbers", str: "strings", bool: "true/false values"}
        return f"a list of {plurals.get(args[0], 'values') if args else 'values'}"
    if hint is type(None):
        return "null"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} options"
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string", dict: "a mapping"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _choice_hint(value: Any, hint: Any) -> str:
    """`` Did you mean 'cifar10'?`` for a misspelt string choice of ``hint``, else ``''``."""
    if not isinstance(value, str) or len(value) > MAX_ECHO_CHARS:
        return ""
    parts = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    options = [
        arg
        for part in parts
        if typing.get_origin(part) is Literal
        for arg in typing.get_args(part)
        if isinstance(arg, str)
    ]
    close = difflib.get_close_matches(value, options, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _check_bounds(key: str, value: Any, metadata: Mapping[str, Any]) -> None:
    """Raise :class:`FieldError` if ``value`` (or any number in it) breaks the bounds in ``metadata``."""
    # Python compares ints and floats exactly, so a 400-digit integer is simply out of range
    # (``float(int)`` would overflow).
    tests = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<")}
    rules = {name: bound for name, bound in metadata.items() if name in tests}
    if not rules:
        return
    numbers = value if isinstance(value, (list, tuple)) else [value]
    for number in numbers:
        if number is None or isinstance(number, bool) or not isinstance(number, (int, float)):
            continue
        if not all(tests[name][0](number, bound) for name, bound in rules.items()):
            rule = " and ".join(f"{tests[name][1]} {_number(bound)}" for name, bound in rules.items())
            shown = _number(number) if value is number else describe(list(value), with_type=False)
            raise FieldError(key, f"is out of range: got {shown}, must be {rule}.")


def _number(value: float) -> str:
    """``4096`` for integral values (bounds are written as ints or floats), ``0.001`` otherwise;
    an integer too long to show is cut like any echoed value."""
    if isinstance(value, int):
        return str(value) if abs(value) < 10**16 else f"an integer of {len(str(abs(value)))} digits"
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else f"{value:g}"


# ------------------------------------------------------------------------------------ coercion
@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _sections(cls: type) -> dict[str, type[Config]]:
    """:meth:`Config.sections` of ``cls`` (none for a dataclass that is no :class:`Config`)."""
    return cls.sections() if isinstance(cls, type) and issubclass(cls, Config) else {}


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
        for arg in args:  # exact type: True is no 1; "3" from an override is 3
            if (type(value) is type(arg) and value == arg) or (isinstance(value, str) and value == str(arg)):
                return arg
        raise ValueError(value)
    if origin in (list, tuple) or hint in (list, tuple):
        if _is_size_pair(hint) and not isinstance(value, (list, tuple)):
            return (_coerce(value, args[0]),) * len(args)  # img_size: 32 means (32, 32)
        if not isinstance(value, (list, tuple)):
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
        if isinstance(value, str) and len(value) <= 20:
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(value)
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float's range
            raise ValueError(value) from None
        if not math.isfinite(number):
            raise ValueError(value)
        return number
    if hint is str and isinstance(value, str) and "\x00" in value:
        raise ValueError(value)  # no file name, path or choice holds a NUL byte (the OS refuses them)
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
        return any(type(value) is type(arg) and value == arg for arg in typing.get_args(hint))
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
